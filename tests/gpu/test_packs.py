"""Kernel packs on the GPU: pack.gemm on torch, cupy and numpy tensors against float64 (exact and nearest shapes,
C and alpha/beta, bias through the torch dispatch), refusing what the pack does not hold before launching, verify,
and a fresh process that runs the pack with no compiler."""
from __future__ import annotations

import gzip
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pycutlass.compiler.manager import Compiler
from pycutlass.pack import PackCoverageError, build_pack, load_pack

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
SWEEP = ROOT / "benchmarks" / "results" / "tune-sweep-h100.db.gz"


@pytest.fixture(scope="module")
def pack_path(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("pack")
    db = folder / "sweep.db"
    db.write_bytes(gzip.decompress(SWEEP.read_bytes()))
    return build_pack(db, folder / "f16.pack", target=90, min_efficiency=0.9)


@pytest.fixture
def no_compiles(monkeypatch):
    """Any compile in the test fails it."""
    def refuse(*args, **kwargs):
        raise AssertionError("a compile was attempted")

    monkeypatch.setattr(Compiler, "_add", refuse)


def _operands(m, n, k, seed=0):
    generator = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(m, k, generator=generator, device="cuda").half()
    b = torch.randn(n, k, generator=generator, device="cuda").half().t()  # column-major K x N
    return a, b


def _check(out, expected, tolerance=3e-3):
    out = torch.as_tensor(np.asarray(out) if isinstance(out, np.ndarray) else out, device="cuda").double()
    assert torch.isfinite(out).all()
    error = ((out - expected).abs().max() / expected.abs().max()).item()
    assert error <= tolerance, error


@pytest.mark.parametrize("m, n, k", [(16, 4096, 4096), (512, 6144, 4096), (300, 4096, 4096), (8, 64, 64)])
def test_pack_gemm_on_torch_tensors(pack_path, no_compiles, m, n, k):
    pack = load_pack(pack_path)
    a, b = _operands(m, n, k)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
    assert pack.gemm(a, b, out) is out
    torch.cuda.synchronize()
    _check(out, a.double() @ b.double())
    assert sum(pack.stats.values()) == 1
    how = "exact" if (m, n, k) in ((16, 4096, 4096), (512, 6144, 4096)) else "nearest"
    assert pack.stats[how] == 1
    again = pack.gemm(a, b)  # a new output, allocated like a
    torch.cuda.synchronize()
    _check(again, a.double() @ b.double())


def test_a_seen_call_launches_bound_on_new_tensors(pack_path, no_compiles):
    """The second call of a signature patches its tensors' addresses into the bound Params: new data, new results."""
    pack = load_pack(pack_path)
    results = []
    for seed in range(4):
        a, b = _operands(128, 4096, 4096, seed=10 + seed)
        c = torch.randn(128, 4096, device="cuda").half()
        out = torch.full((128, 4096), float("nan"), device="cuda", dtype=torch.float16)
        pack.gemm(a, b, out, c=c, alpha=2.0, beta=0.5)
        results.append((out, 2.0 * (a.double() @ b.double()) + 0.5 * c.double()))
    torch.cuda.synchronize()
    for out, expected in results:
        _check(out, expected)
    [seen] = pack._seen.values()
    assert seen.bound is not None  # calls 2..4 took the bound launch
    assert sum(pack.stats.values()) == 1  # chosen once


def test_pack_gemm_with_c_alpha_and_beta(pack_path, no_compiles):
    pack = load_pack(pack_path)
    a, b = _operands(128, 4096, 4096, seed=1)
    c = torch.randn(128, 4096, device="cuda").half()
    out = pack.gemm(a, b, c=c, alpha=0.5, beta=-1.5)
    torch.cuda.synchronize()
    _check(out, 0.5 * (a.double() @ b.double()) - 1.5 * c.double())


def test_pack_gemm_on_numpy_and_cupy(pack_path, no_compiles):
    pack = load_pack(pack_path)
    a, b = _operands(16, 4096, 4096, seed=2)
    expected = a.double() @ b.double()
    host_a, host_b = a.cpu().numpy(), b.cpu().numpy()  # b: a column-major (Fortran-order) view
    out = np.full((16, 4096), np.nan, np.float16)
    pack.gemm(host_a, host_b, out)
    _check(out, expected)
    cupy = pytest.importorskip("cupy")
    device_a, device_b = cupy.asarray(host_a), cupy.asfortranarray(cupy.asarray(host_b))
    got = pack.gemm(device_a, device_b)
    cupy.cuda.Device().synchronize()
    _check(cupy.asnumpy(got), expected)


def test_calls_the_pack_cannot_serve_are_refused_before_launching(pack_path, no_compiles):
    pack = load_pack(pack_path)
    a, b = _operands(64, 4096, 4104)
    with pytest.raises(PackCoverageError, match="alignment up to"):
        pack.gemm(a[:, 1:4097], b[1:4097, :])  # views one element off: 2-byte addresses
    a16, b16 = _operands(64, 4096, 4096)
    with pytest.raises(PackCoverageError, match="bfloat16"):
        pack.gemm(a16.bfloat16(), b16.bfloat16())
    with pytest.raises(PackCoverageError, match="relu"):
        pack.gemm(a16, b16, activation="relu")


def test_verify_runs_every_kernel_against_float64(pack_path):
    rows = load_pack(pack_path).verify()
    assert len(rows) == len(load_pack(pack_path).kernels_meta)
    assert all(row["ok"] for row in rows), rows


def test_the_torch_dispatch_serves_from_a_pack_and_falls_back_counted(pack_path, no_compiles):
    import pycutlass
    import pycutlass.torch as pct

    with pycutlass.Session().activate():
        dispatch = pct.use_pack(pack_path)
        dispatch.configure(prefer_faster=False)  # the pack's Sm80 kernels measured slower than cuBLAS here
        x = torch.randn(64, 4096, device="cuda").half()
        weight = torch.randn(4096, 4096, device="cuda").half() / 64
        bias = torch.randn(4096, device="cuda").half()
        y = pct.linear(x, weight, bias)  # Sm80 kernel, the bias as a broadcast C
        torch.cuda.synchronize()
        _check(y, x.double() @ weight.double().t() + bias.double())
        assert sum(dispatch.packs[0].stats.values()) == 1
        z = pct.linear(x.bfloat16(), weight.bfloat16(), bias.bfloat16())  # no bf16 kernel: torch runs it
        assert z.dtype == torch.bfloat16
        assert sum(n for why, n in dispatch.fallbacks.items() if "no loaded pack covers" in why) == 1


_FRESH = r"""
import sys
sys.modules["cuda.bindings.nvrtc"] = None
import torch
import pycutlass
from pycutlass.compiler.manager import Compiler

def refuse(*args, **kwargs):
    raise AssertionError("a compile was attempted")

Compiler._add = refuse
a = torch.randn(16, 4096, device="cuda").half()
b = torch.randn(4096, 4096, device="cuda").half().t()
out = pycutlass.load_pack(sys.argv[1]).gemm(a, b)
expected = a.double() @ b.double()
print(((out.double() - expected).abs().max() / expected.abs().max()).item())
"""


def test_a_fresh_process_runs_the_pack_with_no_compiler(pack_path, tmp_path):
    env = dict(os.environ, PYCUTLASS_CACHE_DIR=str(tmp_path / "empty"))
    env["PATH"] = os.pathsep.join(d for d in env["PATH"].split(os.pathsep) if d and not (Path(d) / "nvcc").exists())
    done = subprocess.run([sys.executable, "-c", _FRESH, str(pack_path)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert float(done.stdout.strip().splitlines()[-1]) <= 3e-3
