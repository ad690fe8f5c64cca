"""Every example runs: without a GPU it compiles and stops with its one-line message (exit 0); with one it runs
and checks its results against float64. Each runs in a fresh process with its own cache directory."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p.name for p in (REPO_ROOT / "examples").glob("*.py") if p.name != "common.py")


@pytest.mark.slow
@pytest.mark.parametrize("example", EXAMPLES)
def test_example_runs(example, tmp_path):
    scratch = tmp_path / "tmp"  # where an example without --out writes its results (tempfile), removed with tmp_path
    scratch.mkdir()
    env = {**os.environ, "PYCUTLASS_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(REPO_ROOT),
           "TMPDIR": str(scratch)}
    out = subprocess.run([sys.executable, str(REPO_ROOT / "examples" / example)], capture_output=True, text=True,
                         env=env, cwd=tmp_path, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    from pycutlass.compiler.target import detected_compute_capability

    if detected_compute_capability() is None:
        assert "no GPU here, stopping before launch" in out.stdout, out.stdout[-2000:]
    # nothing written to the working directory (the cache only where the example compiled something)
    assert set(tmp_path.iterdir()) - {scratch} in ({tmp_path / "cache"}, set())
