#!/usr/bin/env bash
# Start the S3 test server (moto on loopback, auth on) for the tests, detached so that it outlives
# this script; its address and access key go to the state file that the `s3_server` fixture reads.
# Idempotent: a server that answers is left alone, a silent one is restarted.
# State file: $MSD_S3_STATE, else /tmp/msd-s3/state.json (the server's log, moto.log, beside it).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
STATE="${MSD_S3_STATE:-/tmp/msd-s3/state.json}"
# The virtualenv's Python (moto comes with the dev extra): the active one, else the repository's.
if [[ -n "${VIRTUAL_ENV:-}" ]]; then
    PYTHON="$VIRTUAL_ENV/bin/python"
elif [[ -x "$ROOT/.venv/bin/python" ]]; then
    PYTHON="$ROOT/.venv/bin/python"
else
    PYTHON=python3
fi

cd "$ROOT"
exec "$PYTHON" -m tests.s3.server up "$STATE"
