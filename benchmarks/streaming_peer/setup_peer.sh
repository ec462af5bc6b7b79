#!/usr/bin/env bash
# Builds .venv-peer: MosaicML Streaming beside the project's .venv, without touching .venv.
#
#     bash benchmarks/streaming_peer/setup_peer.sh          # from the repository root
#
# .venv-peer is a venv of the same base Python whose site-packages come first and then take in
# .venv's (a .pth runs site.addsitedir on it, so .venv's own .pth files, msd's editable install
# among them, apply too). Only Streaming and the small packages it imports at run time go into
# .venv-peer, all with --no-deps: torch, numpy and everything else stay .venv's, at .venv's
# versions. Streaming 0.13.0 declares numpy<2.2, xxhash<4, torchvision and transformers; it runs
# with .venv's numpy 2.4 and xxhash 4 (the benchmark checks), and benchmarks/streaming_peer/lib.py
# imports the parts it uses without the two modules (streaming.vision and StreamingDataLoader)
# that need torchvision and transformers. .venv-peer holds a .gitignore of "*": git ignores it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
MAIN="$ROOT/.venv"
PEER="${PEER_VENV:-$ROOT/.venv-peer}"
BASE="$("$MAIN/bin/python" -c 'import sys; print(sys._base_executable)')"
SITE="$("$MAIN/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
"$BASE" -m venv --without-pip "$PEER"
echo '*' > "$PEER/.gitignore"
PEER_SITE="$("$PEER/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "import site; site.addsitedir('$SITE')" > "$PEER_SITE/_msd_main_venv.pth"
"$MAIN/bin/python" -m pip --python "$PEER/bin/python" install --no-deps \
    mosaicml-streaming==0.13.0 catalogue==2.0.10 Brotli==1.2.1 zstd==1.5.7.2 \
    python-snappy==0.7.3 cramjam==2.14.0
cd "$ROOT" && "$PEER/bin/python" -c 'import benchmarks.streaming_peer.lib as lib; print(lib.describe())'
