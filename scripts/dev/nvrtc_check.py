#!/usr/bin/env python3
"""Compiles every portable kernel module (and the CUDA glue module) with NVRTC, as the CUDA backend does at start-up
(prelude + module source, the launch constants as -D flags, a virtual architecture), on a machine without a GPU.

Usage: nvrtc_check.py LIBNVRTC [ARCH ...]   (e.g. the libnvrtc.so.12 of the PyPI wheel nvidia-cuda-nvrtc-cu12;
ARCH defaults to compute_90 and compute_80). Exits non-zero and prints the log of any module that fails.
NVRTC_EXTRA adds compiler options (e.g. --ptxas-options=-v with a real ARCH such as sm_90: registers per kernel);
NVRTC_LOG=1 prints every module's log, not only failing ones; NVRTC_PTX_DIR=DIR writes each module's PTX there (to
compare the code of two versions of a kernel).
"""
import ctypes
import os
import pathlib
import re
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
lib = ctypes.CDLL(sys.argv[1])
archs = sys.argv[2:] or ["compute_90", "compute_80"]

launch = (REPO / "kernels/src/launch.rs").read_text()
consts = dict(re.findall(r'pub const (\w+): usize = (\d+);', launch))
names = re.findall(r'\("(\w+)", \w+\)', launch.split("pub const DEFINES")[1])
defines = [f"-D{n}={consts[n]}" for n in names]
prelude = (REPO / "kernels/src/cl/prelude.h").read_text()

# The modules CUDA builds: not the OpenCL-only ones (rserve_kernels::target: Intel's sub-group matrix built-ins).
OPENCL_ONLY = {"xmx", "xmx_emu"}
modules = [p for p in sorted((REPO / "kernels/src/cl").glob("*.cl")) if p.stem not in OPENCL_ONLY]
modules += [REPO / "kernels/src/cuda/cublas_glue.cu"]
fails = 0
for arch in archs:
    for path in modules:
        body = "\n".join("" if (l.strip().startswith("#include") and "prelude.h" in l) else l
                         for l in path.read_text().splitlines())
        src = f'#line 1 "prelude.h"\n{prelude}\n#line 1 "{path.name}"\n{body}\n'.encode()
        prog = ctypes.c_void_p()
        assert lib.nvrtcCreateProgram(ctypes.byref(prog), src, path.name.encode(), 0, None, None) == 0
        opts = [o.encode() for o in defines + [f"--gpu-architecture={arch}", "--std=c++17"] + os.environ.get("NVRTC_EXTRA", "").split()]
        arr = (ctypes.c_char_p * len(opts))(*opts)
        rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, log)
        ok = rc == 0
        fails += not ok
        print(f"nvrtc {arch} {path.name}: {'ok' if ok else 'FAILED'}")
        if not ok or b"warning" in log.value or os.environ.get("NVRTC_LOG"):
            print(log.value.decode(errors="replace"))
        if ok and os.environ.get("NVRTC_PTX_DIR"):
            lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
            ptx = ctypes.create_string_buffer(size.value)
            lib.nvrtcGetPTX(prog, ptx)
            out = pathlib.Path(os.environ["NVRTC_PTX_DIR"]) / f"{path.stem}.{arch}.ptx"
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(ptx.value)
sys.exit(1 if fails else 0)
