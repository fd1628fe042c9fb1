"""Build the flashattn extension: one module, flashattn._C, with CPU and CUDA kernels.

The package metadata (name, version, dependencies, extras) is in pyproject.toml; this file only
describes the compiled module.

Sources, by role (globbed recursively, so files can move between folders without editing this file):
  CUDA build             every .cpp and .cu file under csrc/
  CPU-only build         the .cpp files under csrc/ except those under the GPU-path folders
                         csrc/cuda/, csrc/decode/, csrc/sm80/ and csrc/sm90/

build_ext also writes flashattn/build_record.py (git-ignored): the torch, CUDA and architectures the
extension was built with.

Environment knobs:
  FLASHATTN_BUILD_CUDA   auto (default: CUDA kernels when a CUDA toolkit is found) | 1 | 0
  FLASHATTN_CUDA_ARCHS   semicolon list of SM versions to compile the sm80 path for (default "80;90")
  FLASHATTN_CUDA_PTX     semicolon list of virtual archs whose PTX is embedded too (default "80": newer
                         GPUs, such as sm_100 and sm_120, compile it at first use; "" for none)
  MAX_JOBS               parallel compile jobs (torch's ninja builder reads it)
  FLASHATTN_NVCC_FLAGS   extra nvcc flags, space-separated (e.g. "-DFLASHATTN_WATCHDOG" for a debug build
                         whose sm90 forward and backward mbarrier waits trap instead of hanging)

torch's CUDA headers, which the host .cpp files include, include the cuSPARSE, cuBLAS and cuSOLVER
headers. A CUDA toolkit installed without them (no $CUDA_HOME/include/cusparse.h) gets them from the
nvidia wheels torch depends on: their include folders are searched after the toolkit's own
(-idirafter), so the toolkit's CUDA runtime headers still win.
"""
import glob
import importlib.util
import os

from setuptools import setup
import torch
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension

HERE = os.path.dirname(os.path.abspath(__file__))
CSRC = os.path.join(HERE, "csrc")

# Folders under csrc/ that hold the GPU path only: left out of a CPU-only build.
GPU_FOLDERS = ("cuda", "decode", "sm80", "sm90")
# csrc/stable: the library built against torch's stable ABI alone (flashattn._C_stable), not part of _C.
STABLE_FOLDER = "stable"
# The oldest torch the stable-ABI library loads under: torch/csrc/stable/version.h hides every API newer
# than this, so using one fails at compile time instead of at load time under an older torch.
STABLE_TARGET = ("TORCH_TARGET_VERSION", "0x020B000000000000")  # 2.11

# Headers of the CUDA libraries that torch's ATen/cuda/CUDAContext.h includes.
TORCH_CUDA_LIBRARY_HEADERS = ("cusparse.h", "cublas_v2.h", "cublasLt.h", "cusolverDn.h")


def want_cuda() -> bool:
    mode = os.environ.get("FLASHATTN_BUILD_CUDA", "auto").lower()
    if mode in ("0", "false", "no"):
        return False
    if mode in ("1", "true", "yes"):
        if CUDA_HOME is None:
            raise RuntimeError("FLASHATTN_BUILD_CUDA=1 but no CUDA toolkit was found (set CUDA_HOME)")
        return True
    return CUDA_HOME is not None


def sources(*extensions, skip_folders=()):
    """Files under csrc/ (recursively) with one of the extensions, outside csrc/<skip_folders>/,
    as paths relative to the repository root, sorted."""
    skip = tuple(os.path.join(CSRC, f) + os.sep for f in skip_folders)
    found = []
    for ext in extensions:
        for path in glob.glob(os.path.join(CSRC, "**", "*" + ext), recursive=True):
            if not path.startswith(skip):
                found.append(os.path.relpath(path, HERE))
    return sorted(found)


def stable_sources(*extensions):
    """The stable-ABI library's own files (csrc/stable), relative to the repository root, sorted."""
    return sorted(os.path.relpath(path, HERE) for ext in extensions
                  for path in glob.glob(os.path.join(CSRC, STABLE_FOLDER, "*" + ext)))


def cuda_archs():
    archs = os.environ.get("FLASHATTN_CUDA_ARCHS", "80;90").replace(",", ";").split(";")
    # The sm90 path needs wgmma and setmaxnreg, which only the arch-specific sm_90a target has.
    return [("90a" if a.strip() == "90" else a.strip()) for a in archs if a.strip()]


def ptx_archs():
    """Virtual architectures whose PTX is embedded beside the machine code, so that GPUs newer than every
    listed SM (Blackwell, consumer sm_120) JIT the sm80 path at first use."""
    archs = os.environ.get("FLASHATTN_CUDA_PTX", "80").replace(",", ";").split(";")
    return [a.strip() for a in archs if a.strip()]


def gencode_flags():
    return ([f"-gencode=arch=compute_{a},code=sm_{a}" for a in cuda_archs()]
            + [f"-gencode=arch=compute_{a},code=compute_{a}" for a in ptx_archs()])


def nvidia_wheel_include_dirs():
    """Include folders of the nvidia wheels (installed with torch) that hold the CUDA library headers
    torch's CUDA headers include; empty when the toolkit has them itself or no such wheel is installed."""
    if os.path.isfile(os.path.join(CUDA_HOME, "include", "cusparse.h")):
        return []
    spec = importlib.util.find_spec("nvidia")
    if spec is None or not spec.submodule_search_locations:
        return []
    dirs = []
    for root in spec.submodule_search_locations:
        for include in sorted(glob.glob(os.path.join(root, "*", "include"))):
            if include not in dirs and any(os.path.isfile(os.path.join(include, h)) for h in TORCH_CUDA_LIBRARY_HEADERS):
                dirs.append(include)
    return dirs


cxx_flags = ["-O3", "-std=c++20"]  # torch >= 2.14 headers need C++20
link_flags = []
# at::parallel_for is a header template: with torch's OpenMP backend it runs its tasks on several
# threads only in code compiled with OpenMP (without it, in one thread, and BLAS calls inside it then
# start threads of their own). libgomp is the one torch itself links.
if torch.backends.openmp.is_available():
    cxx_flags.append("-fopenmp")
    link_flags.append("-fopenmp")
include_dirs = [CSRC]

if want_cuda():
    # Only the host compiler needs them: the .cu files include no torch headers (nor these libraries').
    after_dirs = nvidia_wheel_include_dirs()
    if after_dirs:
        print("flashattn setup.py: no cusparse.h in the CUDA toolkit; added after its include dirs (host "
              "compiler): " + " ".join(f"-idirafter {d}" for d in after_dirs), flush=True)
    nvcc_flags = (["-O3", "-std=c++17", "--use_fast_math", "-lineinfo", "--expt-relaxed-constexpr",
                   "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__", "-U__CUDA_NO_BFLOAT16_CONVERSIONS__"]
                  + gencode_flags() + os.environ.get("FLASHATTN_NVCC_FLAGS", "").split())
    ext = CUDAExtension(
        name="flashattn._C",
        sources=sources(".cpp", ".cu", skip_folders=(STABLE_FOLDER,)),
        include_dirs=include_dirs,
        define_macros=[("FLASHATTN_WITH_CUDA", "1")] + ([("FLASHATTN_SM90", "1")] if "90a" in cuda_archs() else []),
        extra_compile_args={
            "cxx": cxx_flags + [flag for d in after_dirs for flag in ("-idirafter", d)],
            "nvcc": nvcc_flags,
        },
        extra_link_args=link_flags,
    )
    stable_ext = CUDAExtension(
        name="flashattn._C_stable",
        sources=stable_sources(".cpp", ".cu") + [os.path.join("csrc", "cuda", "dropout_keep_mask.cu")],
        include_dirs=include_dirs,
        # USE_CUDA: the C shims declare their CUDA functions (the current stream) only with it.
        define_macros=[("FLASHATTN_WITH_CUDA", "1"), ("USE_CUDA", "1"), STABLE_TARGET],
        extra_compile_args={"cxx": cxx_flags, "nvcc": nvcc_flags},
        py_limited_api=True,
    )
else:
    ext = CppExtension(
        name="flashattn._C",
        sources=sources(".cpp", skip_folders=GPU_FOLDERS + (STABLE_FOLDER,)),
        include_dirs=include_dirs,
        extra_compile_args={"cxx": cxx_flags},
        extra_link_args=link_flags,
    )
    stable_ext = CppExtension(
        name="flashattn._C_stable",
        sources=stable_sources(".cpp"),
        include_dirs=include_dirs,
        define_macros=[STABLE_TARGET],
        extra_compile_args={"cxx": cxx_flags},
        py_limited_api=True,
    )


def write_build_record(folder):
    """<folder>/build_record.py: what this build of flashattn._C is built against, read by `import
    flashattn` to explain a failed load (a different torch) and printed by `python -m flashattn info`."""
    import re
    import subprocess

    import torch

    cuda = want_cuda()
    nvcc = None
    if cuda:
        out = subprocess.run([os.path.join(CUDA_HOME, "bin", "nvcc"), "--version"], capture_output=True, text=True).stdout
        found = re.search(r"release (\d+\.\d+)", out)
        nvcc = found.group(1) if found else None
    record = (
        "# Generated by setup.py when flashattn._C was built: what it was built against. Not in git.\n"
        f"TORCH = {torch.__version__!r}\n"
        f"TORCH_CUDA = {torch.version.cuda!r}  # torch.version.cuda of that torch (None: a CPU-only torch)\n"
        f"CUDA_KERNELS = {cuda!r}\n"
        f"NVCC = {nvcc!r}  # the CUDA toolkit's release that compiled the kernels\n"
        f"CUDA_ARCHS = {(';'.join(cuda_archs()) if cuda else '')!r}\n"
        f"CUDA_PTX = {(';'.join(ptx_archs()) if cuda else '')!r}  # PTX embedded for newer GPUs\n"
    )
    with open(os.path.join(folder, "build_record.py"), "w") as f:
        f.write(record)


class BuildExtensionWithRecord(BuildExtension):
    """torch's extension builder, then the build record beside the package's modules: in the source tree
    for an in-place (editable) build (git-ignored there), else in the build folder the wheel is made from."""

    def run(self):
        super().run()
        write_build_record(os.path.join(HERE if self.inplace else self.build_lib, "flashattn"))


setup(
    ext_modules=[ext, stable_ext],
    cmdclass={"build_ext": BuildExtensionWithRecord},
)
