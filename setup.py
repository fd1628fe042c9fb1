"""Build the flashattn extension: one module, flashattn._C, with CPU and CUDA kernels.

The package metadata (name, version, dependencies, extras) is in pyproject.toml; this file only
describes the compiled module.

Environment knobs:
  FLASHATTN_BUILD_CUDA   auto (default: CUDA kernels when a CUDA toolkit is found) | 1 | 0
  FLASHATTN_CUDA_ARCHS   semicolon list of SM versions to compile the sm80 path for (default "80;90")
  MAX_JOBS               parallel compile jobs (torch's ninja builder reads it)
  FLASHATTN_NVCC_FLAGS   extra nvcc flags, space-separated (e.g. "-DFLASHATTN_WATCHDOG" for a debug build
                         whose sm90 forward and backward mbarrier waits trap instead of hanging)
"""
import glob
import os

from setuptools import setup
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension

HERE = os.path.dirname(os.path.abspath(__file__))


def want_cuda() -> bool:
    mode = os.environ.get("FLASHATTN_BUILD_CUDA", "auto").lower()
    if mode in ("0", "false", "no"):
        return False
    if mode in ("1", "true", "yes"):
        if CUDA_HOME is None:
            raise RuntimeError("FLASHATTN_BUILD_CUDA=1 but no CUDA toolkit was found (set CUDA_HOME)")
        return True
    return CUDA_HOME is not None


def sources(pattern):
    return sorted(os.path.relpath(p, HERE) for p in glob.glob(os.path.join(HERE, pattern), recursive=True))


def cuda_archs():
    archs = os.environ.get("FLASHATTN_CUDA_ARCHS", "80;90").replace(",", ";").split(";")
    # The sm90 path needs wgmma and setmaxnreg, which only the arch-specific sm_90a target has.
    return [("90a" if a.strip() == "90" else a.strip()) for a in archs if a.strip()]


def gencode_flags():
    return [f"-gencode=arch=compute_{a},code=sm_{a}" for a in cuda_archs()]


cxx_flags = ["-O3", "-std=c++20"]  # torch >= 2.14 headers need C++20
include_dirs = [os.path.join(HERE, "csrc")]

if want_cuda():
    ext = CUDAExtension(
        name="flashattn._C",
        sources=sources("csrc/*.cpp") + sources("csrc/cpu/*.cpp") + sources("csrc/sm80/*.cu")
        + sources("csrc/sm90/*.cu") + sources("csrc/instantiations/*.cu"),
        include_dirs=include_dirs,
        define_macros=[("FLASHATTN_WITH_CUDA", "1")] + ([("FLASHATTN_SM90", "1")] if "90a" in cuda_archs() else []),
        extra_compile_args={
            "cxx": cxx_flags,
            "nvcc": ["-O3", "-std=c++17", "--use_fast_math", "-lineinfo", "--expt-relaxed-constexpr",
                     "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__",
                     "-U__CUDA_NO_BFLOAT16_CONVERSIONS__"] + gencode_flags()
            + os.environ.get("FLASHATTN_NVCC_FLAGS", "").split(),
        },
    )
else:
    ext = CppExtension(
        name="flashattn._C",
        sources=sources("csrc/*.cpp") + sources("csrc/cpu/*.cpp"),
        include_dirs=include_dirs,
        extra_compile_args={"cxx": cxx_flags},
    )

setup(
    ext_modules=[ext],
    cmdclass={"build_ext": BuildExtension},
)
