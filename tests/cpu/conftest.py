"""Fixtures shared by the CPU tests that compile for real."""
from __future__ import annotations

import pytest

import pycutlass
from pycutlass.compiler import toolchain
from pycutlass.compiler.manager import Compiler


@pytest.fixture
def compiler_state():
    """A fresh session compiling for sm_90 here (sharing the test cache), current for the test."""
    cache_path = pycutlass.session.default().options.get("cache_path")
    session = pycutlass.Session(target=90, cache_path=cache_path)
    with session.activate():
        yield Compiler.of(session)


def clear_toolchain_caches() -> None:
    """Forget located tools and headers (after changing PATH or CUDA_HOME in a test)."""
    toolchain.reset()


@pytest.fixture
def toolkit_hidden():
    """No nvcc on PATH and no CUDA toolkit: headers must come from the pip wheels (as on a pip-only machine)."""
    import os
    from pathlib import Path

    with pytest.MonkeyPatch.context() as patch:
        path = [d for d in os.environ.get("PATH", "").split(os.pathsep) if d and not (Path(d) / "nvcc").exists()]
        patch.setenv("PATH", os.pathsep.join(path))
        patch.delenv("CUDA_HOME", raising=False)
        patch.delenv("CUDA_PATH", raising=False)
        patch.setattr(toolchain, "cuda_home", lambda: None)  # or it falls back to /usr/local/cuda
        clear_toolchain_caches()
        yield
    clear_toolchain_caches()
    import shutil

    assert toolchain.cuda_home() is not None or shutil.which("nvcc") is None  # the real toolchain is back
