#!/usr/bin/env bash
# Sets up a fresh machine for torch_plugin, idempotently: Debian packages, torch 2.13.0,
# Python dependencies, the editable install (metadata + entry point) and an incremental build
# of the extension. Each step is skipped when already satisfied.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore

apt_needed=()
for pkg in coinor-libcbc-dev libgtest-dev pkg-config ninja-build cmake g++ clang libclang-rt-14-dev; do
  dpkg -s "$pkg" >/dev/null 2>&1 || apt_needed+=("$pkg")
done
if [ ${#apt_needed[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  echo "bootstrap: apt-get install ${apt_needed[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${apt_needed[@]}" >/dev/null
fi

if ! $PY -c "import sys, torch; sys.exit(torch.__version__.split('+')[0] != '2.13.0')" 2>/dev/null; then
  echo "bootstrap: pip install torch==2.13.0"
  $PY -m pip install -q torch==2.13.0
fi

stamp=build/.deps-$(sha1sum requirements-dev.txt scripts/constraints.txt | sha1sum | cut -c1-12)
if [ ! -f "$stamp" ]; then
  echo "bootstrap: pip install -r requirements-dev.txt"
  $PY -m pip install -q -c scripts/constraints.txt -r requirements-dev.txt
  mkdir -p build && touch "$stamp"
fi

# Install (editable) unless torch_plugin is already installed from this very checkout: another
# clone on the same machine must not shadow it.
installed_from=$($PY - <<'PYEOF'
import importlib.metadata as m, json
try:
    print(json.loads(m.distribution("torch_plugin").read_text("direct_url.json"))["url"])
except Exception:
    print("")
PYEOF
)
if [ "$installed_from" != "file://$(pwd)" ]; then
  echo "bootstrap: pip install --no-build-isolation -e . (metadata and entry point)"
  # The extension itself is built below, incrementally; skip building it twice.
  TP_METADATA_ONLY=1 $PY -m pip install -q --no-build-isolation --no-deps -e .
fi

echo "bootstrap: building torch_plugin._C (incremental, log in build/build_ext.log)"
mkdir -p build
if ! MAX_JOBS=${MAX_JOBS:-2} $PY setup.py build_ext --inplace >build/build_ext.log 2>&1; then
  grep -E -B2 -A6 "error" build/build_ext.log | tail -60 >&2
  echo "bootstrap: building the extension failed (full log: build/build_ext.log)" >&2
  exit 1
fi
$PY -c "import torch_plugin" || { echo "bootstrap: torch_plugin does not import" >&2; exit 1; }
