#!/usr/bin/env bash
# Start the object store emulators for the tests, detached so that they outlive this script:
# gcp-storage-emulator (GCS; Python, from the dev extra) and Azurite (Azure Blob Storage;
# Node.js, installed here from its package-lock.json on first use: `npm ci`, about a minute).
# Their addresses go to state files that the `gcs_server` and `azure_server` fixtures read.
# Idempotent: an emulator that answers is left alone. State: $MSD_STORES_STATE, else
# /tmp/msd-stores (each emulator's log and objects beside its state file).
# Usage: up.sh [gcs] [azure] (both when none is named).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
if [[ -n "${VIRTUAL_ENV:-}" ]]; then
    PYTHON="$VIRTUAL_ENV/bin/python"
elif [[ -x "$ROOT/.venv/bin/python" ]]; then
    PYTHON="$ROOT/.venv/bin/python"
else
    PYTHON=python3
fi

AZURITE="$ROOT/tests/stores/azurite"
if [[ $# -eq 0 || " $* " == *" azure "* ]] && [[ ! -x "$AZURITE/node_modules/.bin/azurite-blob" ]]; then
    if ! command -v npm >/dev/null; then
        echo "up.sh: Azurite needs Node.js and npm (apt-get install nodejs npm)" >&2
        exit 1
    fi
    npm ci --prefix "$AZURITE" --no-audit --no-fund --loglevel=error
fi

cd "$ROOT"
exec "$PYTHON" -m tests.stores up "$@"
