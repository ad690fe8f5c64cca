"""Shared fixtures. GPU tests carry the ``gpu`` marker and skip themselves when no GPU is usable."""
from __future__ import annotations

import os

import pytest


def _gpu_available() -> bool:
    from pycutlass.compiler.target import detected_compute_capability

    return detected_compute_capability() is not None


def pytest_collection_modifyitems(config, items):
    if _gpu_available():
        return
    skip = pytest.mark.skip(reason="no CUDA GPU on this machine (GPU tests run on the GPU host with -m gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True, scope="session")
def _isolated_cache(tmp_path_factory):
    """Tests never touch the user's cache: every session gets its own cache directory."""
    from pycutlass.cache import set_cache_path

    path = os.environ.get("PYCUTLASS_TEST_CACHE") or str(tmp_path_factory.mktemp("cache") / "compiled_cache.db")
    set_cache_path(path)
    yield
    set_cache_path(None)
