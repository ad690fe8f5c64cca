"""``import pycutlass as cutlass`` in a clean process: it creates no files, imports no GPU library, and runs the
description snippets of the users' guide (MathInstruction, TileDescription, TensorDescription, epilogues,
GemmOperationUniversal, ``op.emit()``). Also ``python -m pycutlass cache path``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "cupy", "rmm", "cuda.bindings.driver")

# The guide's snippets, spelled as the users know them (``cutlass.`` prefix, positional arguments).
SNIPPETS = r"""
import json, sys
import pycutlass as cutlass

report = {"after_import": sorted(m for m in HEAVY if m in sys.modules)}

math_inst = cutlass.MathInstruction(
    [16, 8, 16], cutlass.float16, cutlass.float16,
    cutlass.float32, cutlass.OpClass.TensorOp, cutlass.MathOperation.multiply_add
)
tile_description = cutlass.TileDescription(
    [128, 128, 32], 3, [2, 2, 1],
    math_inst
)
A = cutlass.TensorDescription(
    cutlass.float16, cutlass.RowMajor, 8
)
B = cutlass.TensorDescription(
    cutlass.float16, cutlass.ColumnMajor, 8
)
C = cutlass.TensorDescription(
    cutlass.float16, cutlass.RowMajor, 8
)
element_C, alignment_c, element_acc, element_epilogue_compute = cutlass.float16, 8, cutlass.float32, cutlass.float32

# Every epilogue functor of the guide.
epilogue_functor = cutlass.LinearCombination(
    element_C, alignment_c, element_acc, element_epilogue_compute
)
clamp = cutlass.LinearCombinationClamp(
    element_C, alignment_c, element_acc, element_epilogue_compute
)
fast_clamp = cutlass.FastLinearCombinationClamp(
    cutlass.int8, 16
)
activations = [cutlass.relu, cutlass.leaky_relu, cutlass.tanh, cutlass.sigmoid, cutlass.silu, cutlass.hardswish,
               cutlass.gelu]
generic = [cutlass.LinearCombinationGeneric(
    act(element_epilogue_compute), element_C, alignment_c,
    element_acc, element_epilogue_compute
) for act in activations]

operation = cutlass.GemmOperationUniversal(
    80, tile_description,
    A, B, C, epilogue_functor,
    cutlass.IdentitySwizzle1, False
)
swizzles = [cutlass.IdentitySwizzle1, cutlass.IdentitySwizzle2, cutlass.IdentitySwizzle4, cutlass.IdentitySwizzle8,
            cutlass.BatchedIdentitySwizzle]
ops = [operation] + [cutlass.GemmOperationUniversal(80, tile_description, A, B, C, epilogue_functor, s, False)
                     for s in swizzles[1:]]
ops += [cutlass.GemmOperationUniversal(80, tile_description, A, B, C, g) for g in [clamp] + generic]
sources = [op.emit() for op in ops]

output_op = operation.epilogue_type(*([1.0, 0.5] + []))
leaky_op = ops[-6].epilogue_type(*([1.0, 0.0] + [0.1]))
problem_size = cutlass.gemm.GemmCoord(512, 256, 128)
modes = [cutlass.gemm.Mode.Gemm, cutlass.gemm.Mode.GemmSplitKParallel, cutlass.gemm.Mode.Batched,
         cutlass.gemm.Mode.Array]
assert callable(cutlass.get_memory_pool) and callable(cutlass.compiler.add_module) and callable(cutlass.compiler.nvrtc)
assert cutlass.GemmArguments and cutlass.ReductionArguments

report.update(
    after_snippets=sorted(m for m in HEAVY if m in sys.modules),
    allocated=cutlass.get_allocated_size(),
    names=[op.name for op in ops],
    kernel_defined=all(f'extern "C" __global__ void {op.name}_build(' in s for op, s in zip(ops, sources)),
    lengths=[len(s) for s in sources],
    output_op=[output_op.alpha, output_op.beta, list(leaky_op.activation_args)],
    problem=[problem_size.m(), problem_size.n(), problem_size.k()],
    modes=[int(m) for m in modes],
    version=cutlass.__version__,
)
print(json.dumps(report))
"""


def _clean_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYCUTLASS_CACHE_DIR", "XDG_CACHE_HOME", "PYCUTLASS_TEST_CACHE")}
    env.update(HOME=str(home), PYTHONPATH=str(REPO_ROOT))
    return env


def _all_files(*roots: Path) -> list[str]:
    found = []
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            found += [os.path.join(dirpath, n) for n in dirnames + filenames]
    return sorted(found)


@pytest.fixture
def clean_dirs(tmp_path):
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    return home, work


def test_import_creates_nothing_and_runs_the_guide(clean_dirs):
    home, work = clean_dirs
    code = f"HEAVY = {HEAVY!r}\n" + SNIPPETS
    result = subprocess.run([sys.executable, "-c", code], cwd=work, env=_clean_env(home), capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["after_import"] == [], f"import pycutlass pulled in {report['after_import']}"
    assert report["after_snippets"] == [], f"the description snippets pulled in {report['after_snippets']}"
    assert report["allocated"] == 0
    assert len(set(report["names"])) == len(report["names"]) == 13
    assert report["kernel_defined"] and min(report["lengths"]) > 10_000
    assert report["output_op"] == [1.0, 0.5, [0.1]]
    assert report["problem"] == [512, 256, 128] and report["modes"] == [0, 1, 2, 3]
    assert report["version"]
    assert _all_files(home, work) == [], "importing and describing must create no files"


def test_plain_import_in_a_clean_process(clean_dirs):
    home, work = clean_dirs
    code = ("import sys, pycutlass, pycutlass.compiler, pycutlass.cache, pycutlass.gemm, pycutlass.conv\n"
            f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], cwd=work, env=_clean_env(home), capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
    assert _all_files(home, work) == []


def test_python_dash_m_cache_path(clean_dirs):
    home, work = clean_dirs
    env = _clean_env(home)
    result = subprocess.run([sys.executable, "-m", "pycutlass", "cache", "path"], cwd=work, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    path = Path(result.stdout.strip())
    assert path.name == "compiled_cache.db"
    assert path.parent.name == "pycutlass" and home in path.parents, path  # the per-user cache dir, under HOME
    assert work not in path.parents  # never the working directory (the prior art's planted-file hazard)
    listed = subprocess.run([sys.executable, "-m", "pycutlass", "cache", "list"], cwd=work, env=env,
                            capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0 and "No cache" in listed.stdout
    assert _all_files(home, work) == [], "inspecting the cache must create nothing"
    # With the override, the path follows it.
    env["PYCUTLASS_CACHE_DIR"] = str(work / "elsewhere")
    result = subprocess.run([sys.executable, "-m", "pycutlass", "cache", "path"], cwd=work, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == str(work / "elsewhere" / "compiled_cache.db")
