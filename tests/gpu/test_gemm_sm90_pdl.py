"""Programmatic dependent launch on the GPU: chains of SM90 GEMMs launched with ``pdl=True``, each layer reading the
previous layer's output, after torch kernels that poison every intermediate with NaN. A kernel that touched global
memory before the previous grid finished would read NaN or a stale input; every layer is checked against float64
from the layer's actual input. Schedules: warp-specialized, cooperative (a 2x1 cluster, and with bias + GELU),
ping-pong (bf16); streams and CUDA-graph capture; the fast path for seen problems. (Stream-K operations refuse
pdl: tests/cpu/test_pdl.py.)"""
from __future__ import annotations

import pytest

import pycutlass as cutlass
from pycutlass import KernelScheduleType as KS
from pycutlass.gemm import GemmCoord

from .conftest import precompile_module, relative_error
from .test_gemm_sm90 import D, R, TOLERANCE, sm90_op, torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(torch is None, reason="needs torch")]

OPS = {"ws_64x128": sm90_op(D.float16, (R, R, R), tile=(64, 128, 64), kernel=KS.TmaWarpSpecialized),
       "coop_c2x1": sm90_op(D.float16, (R, R, R), cluster=(2, 1, 1), kernel=KS.TmaWarpSpecializedCooperative),
       "pp_bf16": sm90_op(D.bfloat16, (R, R, R), tile=(64, 128, 64), kernel=KS.TmaWarpSpecializedPingpong),
       "coop_gelu_bias": sm90_op(D.float16, (R, R, R), kernel=KS.TmaWarpSpecializedCooperative, activation="gelu",
                                 bias="column")}
LAYERS = 6


@pytest.fixture(scope="module", autouse=True)
def _compiled():
    precompile_module([], OPS.values())


def _dtype(element):
    return torch.float16 if element is D.float16 else torch.bfloat16


class Chain:
    """X[i + 1] = epilogue(X[i] @ W[i]) for LAYERS layers, every X a fresh NaN-poisoned tensor before each pass."""

    def __init__(self, op, m, k, seed, stream=None, **knobs):
        self.op, self.m, self.k = op, m, k
        generator = torch.Generator().manual_seed(seed)
        dtype = _dtype(op.A.element)
        self.W = [(torch.randn(k, k, generator=generator) / k ** 0.5).to(dtype).cuda() for _ in range(LAYERS)]
        self.bias = [torch.randn(k, generator=generator).to(dtype).cuda() if op.bias else None
                     for _ in range(LAYERS)]
        self.X = [torch.zeros(m, k, dtype=dtype, device="cuda") for _ in range(LAYERS + 1)]
        self.source = torch.randn(m, k, generator=generator).to(dtype).cuda()
        self.arguments = [cutlass.GemmArguments(op, GemmCoord(m, k, k), self.X[i], self.W[i], None, self.X[i + 1],
                                                bias=self.bias[i], stream=stream, pdl=True, **knobs)
                          for i in range(LAYERS)]

    def enqueue(self, scale):
        """Torch kernels (poison, new input), then the layers back to back: no synchronization in between."""
        for x in self.X[1:]:
            x.fill_(float("nan"))
        self.X[0].copy_(self.source * scale)
        for arguments in self.arguments:
            self.op.run(arguments)

    def check(self, scale):
        assert torch.equal(self.X[0], (self.source * scale).to(self.X[0].dtype))
        tolerance = TOLERANCE[self.op.A.element] * (2 if self.op.bias else 1)
        for i in range(LAYERS):
            x = self.X[i].double()
            reference = x @ self.W[i].double()
            if self.bias[i] is not None:
                reference = torch.nn.functional.gelu(reference + self.bias[i].double())
            got = self.X[i + 1]
            assert not torch.isnan(got).any(), f"layer {i}: NaN (read an input before it was written)"
            error = relative_error(got.double().cpu().numpy(), reference.cpu().numpy())
            assert error < tolerance, f"layer {i}: relative error {error}"


@pytest.mark.parametrize("name", sorted(OPS))
@pytest.mark.parametrize("m,k", [(1024, 512), (136, 264), (8, 1040)], ids=lambda v: str(v))
def test_pdl_chain_reads_each_layer_after_it_is_written(name, m, k):
    op = OPS[name]
    chain = Chain(op, m, k, seed=m + k)
    for scale in (1.0, -0.5, 2.0):  # passes queued back to back; the last one is checked
        chain.enqueue(scale)
    torch.cuda.synchronize()
    chain.check(2.0)
    assert all(a.prepared().programmatic for a in chain.arguments)


def test_pdl_through_the_fast_path_on_a_side_stream():
    """Arguments for a seen problem take cached Params; they still launch programmatically, on the given stream."""
    op = OPS["ws_64x128"]
    stream = torch.cuda.Stream()
    seen = Chain(op, 256, 520, seed=1, stream=stream)
    loaded = seen.arguments[0]._loaded_op
    reused = loaded.params_reused
    chain = Chain(op, 256, 520, seed=2, stream=stream)  # new tensors, same problem: patched Params
    assert loaded.params_reused >= reused + LAYERS
    with torch.cuda.stream(stream):
        chain.enqueue(3.0)
    stream.synchronize()
    chain.check(3.0)
    assert all(a.prepared().programmatic for a in chain.arguments)


@pytest.mark.parametrize("name", ["coop_c2x1", "ws_64x128"])
def test_pdl_chain_in_a_cuda_graph(name):
    """Captured programmatic launches keep their dependency: replays with new inputs, every layer checked."""
    op = OPS[name]
    stream = torch.cuda.Stream()
    chain = Chain(op, 512, 512, seed=7, stream=stream)
    with torch.cuda.stream(stream):
        chain.enqueue(1.0)  # builds Params before capture
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    scale = torch.ones((), device="cuda", dtype=chain.source.dtype)
    with torch.cuda.graph(graph, stream=stream):
        for x in chain.X[1:]:
            x.fill_(float("nan"))
        chain.X[0].copy_(chain.source * scale)
        for arguments in chain.arguments:
            op.run(arguments)
    for value in (0.25, -1.0):
        scale.fill_(value)
        graph.replay()
        torch.cuda.synchronize()
        chain.check(value)
