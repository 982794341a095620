#!/bin/bash
# Regenerates torch_plugin/_C.pyi from the built extension (pybind11-stubgen, a developer tool:
# `pip install pybind11-stubgen`). `make stubtest` checks the result against the module in CI.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(mktemp -d)
PYTHONPATH=$PWD pybind11-stubgen torch_plugin._C -o "$out"
python3 - "$out/torch_plugin/_C/__init__.pyi" <<'PY'
import sys

s = open(sys.argv[1]).read()
# One file beside the extension: the `pattern` submodule as a module attribute, its types as
# Any where the main module names them; no __all__ (the module defines none).
s = s.replace("from . import pattern\n", "from types import ModuleType\n", 1)
s = s.replace(
    "import typing\n",
    "import typing\n\n# The submodule of pattern bindings (torch_plugin._C.pattern).\npattern: ModuleType\n",
    1,
)
s = s.replace("pattern.Pattern", "typing.Any")
s = "\n".join(line for line in s.split("\n") if not line.startswith("__all__"))
header = (
    "# Generated from the built extension by scripts/gen_stub.sh (pybind11-stubgen); checked\n"
    "# against it by `make stubtest` (mypy stubtest) in CI. Do not edit by hand.\n"
)
open("torch_plugin/_C.pyi", "w").write(header + s)
PY
rm -rf "$out"
echo "wrote torch_plugin/_C.pyi"
