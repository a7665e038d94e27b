"""The build's one compiled part: the CPU EP's native kernels (csrc/), a plain C library loaded with ctypes
(src/epctx/providers/cpu/native.py). Optional: without a C compiler the build goes on and the CPU EP computes the
same with numpy. Everything else about the package is in pyproject.toml."""

import sys

from setuptools import Extension, setup

flags = (
    []
    if sys.platform == "win32"
    else ["-O3", "-std=gnu11", "-fno-strict-aliasing", "-fno-wrapv", "-Wno-psabi"]
)
setup(
    ext_modules=[
        Extension(
            "epctx.providers.cpu._native",
            sources=["csrc/depthwise.c", "csrc/conv.c", "csrc/pool.c"],
            include_dirs=["csrc"],
            depends=["csrc/common.h"],
            extra_compile_args=flags,
            libraries=[] if sys.platform == "win32" else ["pthread"],
            optional=True,
        )
    ]
)
