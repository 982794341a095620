#!/usr/bin/env bash
# Builds the wheel, installs it in a fresh virtual environment and runs scripts/wheel_smoke.py
# there from another directory, so a package that only works from the source tree fails CI.
# The wheel is built in place without build isolation: it reuses the extension's objects from
# bootstrap (ninja relinks only) and the torch on disk.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
rm -rf build/dist build/wheel-venv
MAX_JOBS=${MAX_JOBS:-2} $PY -m pip wheel -q --no-build-isolation --no-deps -w build/dist . \
  >build/wheel.log 2>&1 || { tail -40 build/wheel.log >&2; exit 1; }
wheel=$(ls build/dist/torch_plugin-*.whl)
echo "wheel: $wheel ($($PY -c "import sys, zipfile; print(len(zipfile.ZipFile(sys.argv[1]).namelist()))" "$wheel") files)"
$PY -m venv build/wheel-venv
# The venv takes torch from the wheel's own requirement (2.13.x: the CPU build on disk here).
build/wheel-venv/bin/pip install -q "$wheel"
smoke=$(pwd)/scripts/wheel_smoke.py
away=$(mktemp -d)
(cd "$away" && "$OLDPWD/build/wheel-venv/bin/python" "$smoke")
rm -rf "$away"
