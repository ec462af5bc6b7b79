#!/usr/bin/env bash
# The wheel as a user gets it: build it, install it (not editable) into a fresh virtualenv, then
# with constraints.txt (torch's CPU build), check that no test-only package came with it, then from
# an empty folder run `msd --version`, `msd synth`, `msd validate` and a short `msd launch` of the
# quickstart recipe. Any failure fails the script. About a minute, most of it installing
# the dependencies.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# Built from a copy of the files git tracks or would (not ignored), so that nothing left over in
# the repository (a build/ folder) can find its way into the wheel.
src="$repo"
if git -C "$repo" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    src="$work/src"
    mkdir "$src"
    git -C "$repo" ls-files -z --cached --others --exclude-standard \
        | tar -C "$repo" --null --ignore-failed-read -T - -cf - | tar -C "$src" -xf -
fi
python -m pip wheel --quiet --no-deps -w "$work/dist" "$src"
python3 -m venv "$work/venv"
"$work/venv/bin/python" -m pip install --quiet -c "$repo/constraints.txt" "$work"/dist/msd-*.whl
msd="$work/venv/bin/msd"

# msd's own dependencies only: none of the packages the dev extra adds for the tests (read from
# pyproject.toml, less those msd itself depends on) is installed beside it.
"$work/venv/bin/python" - "$repo/pyproject.toml" <<'PY'
import re, sys, tomllib
from importlib import metadata

project = tomllib.load(open(sys.argv[1], "rb"))["project"]
def names(requirements):
    return {re.split(r"[\s<>=!~\[;]", r, maxsplit=1)[0].lower().replace("_", "-") for r in requirements}
test_only = names(project["optional-dependencies"]["dev"]) - names(project["dependencies"])
installed = {d.metadata["Name"].lower().replace("_", "-") for d in metadata.distributions()}
found = sorted(test_only & installed)
assert not found, f"pip install msd brought test-only packages: {found}"
assert "pytest" in test_only and "transformers" in test_only, sorted(test_only)
print(f"none of the {len(test_only)} test-only packages is installed")
PY

mkdir "$work/run"
cd "$work/run"
# msd comes from the wheel, and no bare `cli` package is installed beside it
"$work/venv/bin/python" -c "
import importlib.util, msd
assert msd.__file__.startswith('$work/venv/'), msd.__file__
assert importlib.util.find_spec('cli') is None, 'a top-level cli package is installed'
"
"$msd" --version | grep -Ex 'msd [0-9]+\.[0-9]+\.[0-9]+'
"$msd" synth demo-data
sed 's/^steps: [0-9]*$/steps: 20/' "$repo/recipes/quickstart.yaml" >quickstart.yaml
grep -qx 'steps: 20' quickstart.yaml
"$msd" validate quickstart.yaml
"$msd" launch quickstart.yaml
echo "wheel smoke test passed in ${SECONDS} s"
