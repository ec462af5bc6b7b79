#!/usr/bin/env bash
# Stop the emulators that up.sh started (their objects stay on disk until the next up.sh).
# Idempotent. State: $MSD_STORES_STATE, else /tmp/msd-stores. Usage: down.sh [gcs] [azure].
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
if [[ -n "${VIRTUAL_ENV:-}" ]]; then
    PYTHON="$VIRTUAL_ENV/bin/python"
elif [[ -x "$ROOT/.venv/bin/python" ]]; then
    PYTHON="$ROOT/.venv/bin/python"
else
    PYTHON=python3
fi

cd "$ROOT"
exec "$PYTHON" -m tests.stores down "$@"
