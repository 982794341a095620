"""Builds torch_plugin._C from csrc/ (torch-free core + pybind11 bindings) and kernels/.

Env switches: DEBUG=1 (-O0 -g), TP_CUDA=0/1 (force CUDA kernels off/on; default: on when
torch was built with CUDA and nvcc is found), MAX_JOBS (ninja parallelism).
CBC is found with pkg-config; without it the build stops naming the Debian package.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys

from setuptools import setup

import torch
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension

ROOT = os.path.dirname(os.path.abspath(__file__))
CORE_DIRS = ["ir", "pattern", "cost", "solver", "passes", "sim"]


def pkg_config(*args: str) -> list[str]:
    if shutil.which("pkg-config") is None:
        sys.exit("torch_plugin: pkg-config is missing. Install it: apt-get install pkg-config")
    try:
        out = subprocess.check_output(["pkg-config", *args, "cbc"], text=True)
    except subprocess.CalledProcessError:
        sys.exit(
            "torch_plugin: CBC (the ILP solver) was not found by `pkg-config cbc`.\n"
            "Install the Debian package coinor-libcbc-dev: apt-get install coinor-libcbc-dev"
        )
    return out.split()


def rel(paths: list[str]) -> list[str]:
    return sorted(os.path.relpath(p, ROOT) for p in paths)


def sources(with_cuda: bool) -> list[str]:
    files: list[str] = []
    for d in CORE_DIRS:
        files += glob.glob(os.path.join(ROOT, "csrc", d, "*.cc"))
    files += glob.glob(os.path.join(ROOT, "csrc", "bindings", "*.cc"))
    files += [os.path.join(ROOT, "kernels", "ops.cpp")]
    files += glob.glob(os.path.join(ROOT, "kernels", "cpu", "*.cc"))
    if with_cuda:
        files += glob.glob(os.path.join(ROOT, "kernels", "cuda", "*.cu"))
        files += glob.glob(os.path.join(ROOT, "kernels", "cuda", "*.cpp"))
    return rel(files)


def want_cuda() -> bool:
    flag = os.environ.get("TP_CUDA")
    if flag is not None:
        return flag == "1"
    return torch.version.cuda is not None and CUDA_HOME is not None


def cpu_capability_flags() -> list[str]:
    """AVX2+FMA+F16C for our CPU kernels when the building machine has them (bootstrap builds on the
    machine that runs the tests), so at::vec uses 256-bit lanes and Sleef's vector exp, as
    ATen's own AVX2 kernels do. TP_CPU_CAPABILITY=default turns it off."""
    if os.environ.get("TP_CPU_CAPABILITY", "auto") == "default":
        return []
    try:
        with open("/proc/cpuinfo") as f:
            flags = set(f.read().split())
    except OSError:
        return []
    if {"avx2", "fma", "f16c"} <= flags:
        return ["-mavx2", "-mfma", "-mf16c", "-DCPU_CAPABILITY_AVX2", "-DCPU_CAPABILITY=AVX2"]
    return []


def extension():
    debug = os.environ.get("DEBUG") == "1"
    with_cuda = want_cuda()
    cflags = pkg_config("--cflags")
    libs = pkg_config("--libs")
    # -g0: Python's own CFLAGS carry -g, and debug info for torch's headers made the build
    # 3m19s and its objects 237 MB on two cores (2m06s and 17 MB without); DEBUG=1 adds -g back.
    cxx = ["-O0" if debug else "-O3", "-g0", "-fvisibility=hidden"] + cflags  # torch picks -std
    # at::parallel_for is inline OpenMP in torch's CPU builds: without -fopenmp its pragma is
    # ignored and every kernel of ours ran on one thread. The link resolves libgomp.so.1 to
    # the copy torch already loaded (same soname), so there is one OpenMP runtime.
    cxx.append("-fopenmp")
    # A toolchain that links libstdc++ statically (the GPU machines' /opt/gcc does) would export
    # its copy from _C and CBC would bind to it while torch uses the shared one: std::ostream
    # then crashed in PrintGraph. Keep any static archive's symbols private to _C.
    libs = libs + ["-fopenmp", "-Wl,--exclude-libs,ALL"]
    if debug:
        cxx.append("-g")
    cxx += cpu_capability_flags()
    kwargs = dict(
        name="torch_plugin._C",
        sources=sources(with_cuda),
        include_dirs=[os.path.join(ROOT, "csrc"), os.path.join(ROOT, "kernels")],
        extra_compile_args={"cxx": cxx},
        extra_link_args=libs,
    )
    if with_cuda:
        kwargs["extra_compile_args"]["nvcc"] = [
            "-O3",
            "-gencode=arch=compute_80,code=sm_80",
            "-gencode=arch=compute_90,code=sm_90",
        ]
        kwargs["define_macros"] = [("TP_WITH_CUDA", "1")]
        return CUDAExtension(**kwargs)
    return CppExtension(**kwargs)


def write_build_info() -> None:
    """torch_plugin/_build_info.py: the torch this extension is compiled against, which
    torch_plugin checks at import before loading _C (a mismatched torch fails inside the
    dynamic loader with an undefined symbol, naming nothing a user can act on)."""
    path = os.path.join(ROOT, "torch_plugin", "_build_info.py")
    text = (
        '"""Written by setup.py at build time: the torch the extension was compiled against."""\n\n'
        f"TORCH_VERSION = {torch.__version__!r}\n"
        f"TORCH_CUDA = {torch.version.cuda!r}\n"
        f"WITH_CUDA_KERNELS = {want_cuda()!r}\n"
    )
    try:
        with open(path) as f:
            if f.read() == text:
                return  # unchanged: keep the file's time stamp (incremental builds)
    except OSError:
        pass
    with open(path, "w") as f:
        f.write(text)


if os.environ.get("TP_METADATA_ONLY") != "1":
    write_build_info()

setup(
    # TP_METADATA_ONLY=1: install metadata and the entry point only (scripts/bootstrap.sh then
    # builds the extension in place, incrementally, instead of twice).
    ext_modules=[] if os.environ.get("TP_METADATA_ONLY") == "1" else [extension()],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
