#!/usr/bin/env bash
# Stop the S3 test server that up.sh started (its objects are gone: moto keeps them in memory).
# Idempotent. State file: $MSD_S3_STATE, else /tmp/msd-s3/state.json.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
STATE="${MSD_S3_STATE:-/tmp/msd-s3/state.json}"
if [[ -n "${VIRTUAL_ENV:-}" ]]; then
    PYTHON="$VIRTUAL_ENV/bin/python"
elif [[ -x "$ROOT/.venv/bin/python" ]]; then
    PYTHON="$ROOT/.venv/bin/python"
else
    PYTHON=python3
fi

cd "$ROOT"
exec "$PYTHON" -m tests.s3.server down "$STATE"
