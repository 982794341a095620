"""The torch this process runs against the torch the extension was built for, checked before
`_C` is loaded: the C++ ABI changes between torch minor releases, and a mismatch otherwise
surfaces as an undefined symbol from the dynamic loader."""

from __future__ import annotations

import torch


def _minor(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("+")[0].split(".")[:2])


def check_torch() -> None:
    """Raises ImportError naming both versions and the fix when they differ in minor release,
    or when the extension was never built."""
    try:
        from . import _build_info
    except ImportError as e:
        raise ImportError(
            "torch_plugin's extension is not built (torch_plugin/_build_info.py is missing): "
            "install with `pip install --no-build-isolation .`, or run `make bootstrap` in a "
            "source checkout"
        ) from e
    built, running = _build_info.TORCH_VERSION, torch.__version__
    if _minor(built) != _minor(running):
        minor = ".".join(map(str, _minor(built)))
        raise ImportError(
            f"torch_plugin was built against torch {built} but this process imports torch "
            f"{running}; its C++ extension loads only into torch {minor}.x. Reinstall "
            "torch_plugin against this torch (`pip install --no-build-isolation "
            "--force-reinstall --no-deps .` from the source) or install the torch it was built for"
        )
    if _build_info.WITH_CUDA_KERNELS and torch.version.cuda is None:
        raise ImportError(
            f"torch_plugin was built with CUDA kernels (CUDA {_build_info.TORCH_CUDA}) but this "
            f"torch ({running}) is a CPU build; reinstall torch_plugin against this torch"
        )


def size_hint(d: torch.SymInt | int) -> int:
    """A symbolic size's value for measuring, without a guard on it (int() of a symbol would
    specialise the user's dynamic graph). torch 2.13 names this `optimization_hint`; torch 2.11
    (the CUDA image's) has no such function, so a backed symbol's own hint is read instead."""
    if not isinstance(d, torch.SymInt):
        return int(d)
    try:
        from torch.fx.experimental.symbolic_shapes import optimization_hint
    except ImportError:
        hint = d.node.hint
        return int(hint if hint is not None else d.node.shape_env.size_hint(d.node.expr))
    return int(optimization_hint(d))
