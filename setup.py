"""Build the optional compiled kernel (grpo_cli/_kernel.c); everything else is in pyproject.

The kernel is optional: without a C compiler the build skips it and grpo-cli computes the
same results with numpy, more slowly. On x86-64 glibc it calls libmvec's AVX2 exp.
GRPO_CLI_PURE_PYTHON=1 at install time skips it on purpose.
"""

import os
import platform
import sys

from setuptools import Extension, setup

vector = sys.platform == "linux" and platform.machine() in ("x86_64", "AMD64")
vector = vector and platform.libc_ver()[0] == "glibc"

kernel = [
    Extension(
        "grpo_cli._kernel",
        sources=["grpo_cli/_kernel.c"],
        extra_compile_args=["-O3", "-ffp-contract=off", "-std=c11", "-Wall", "-Wextra"],
        define_macros=[("GRPO_LIBMVEC", "1")] if vector else [],
        libraries=["mvec", "m"] if vector else [],
        optional=True,
    )
]
setup(ext_modules=[] if os.environ.get("GRPO_CLI_PURE_PYTHON") else kernel)
