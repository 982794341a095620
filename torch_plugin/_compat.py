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
