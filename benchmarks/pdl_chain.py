"""Programmatic dependent launch in back-to-back chains: a model's MLP layers (hidden 4096 -> 14336 -> 4096, f16,
8 GEMMs with their own weights) launched with and without ``pdl=True``, and the same chain with torch's GELU
between the two GEMMs of each layer (kernels inside a torch model), against the same chain of ``torch.matmul``.

    python benchmarks/pdl_chain.py [--tokens 16 128] [--out benchmarks/results/pdl_chain.json]

Each chain is timed as a whole (median of CUDA-event timings, L2 flushed before each chain), in interleaved rounds
with a rotating order (the clocks drift at the power cap: see gemm_sm90.py's ``paired``). Every configuration's
output is checked against torch's before timing.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pycutlass as cutlass  # noqa: E402
from common import bench_ms, device_name, print_table, write_json  # noqa: E402

D = cutlass.DataType
KS = cutlass.KernelScheduleType
HIDDEN, INTERMEDIATE, LAYERS = 4096, 14336, 4
# (tile, kernel schedule) per projection and token count, after the grid's winners on these decode shapes
# (benchmarks/gemm_sm90.py on an H100): up (N = 14336) 64x128 (112 CTAs per 64 rows); down (N = 4096) 64x32 for 16 tokens
# (128 CTAs) and 64x64 for 128 (128 CTAs).
WS = KS.TmaWarpSpecialized
CONFIGS = {16: (((64, 128, 64), WS), ((64, 32, 64), WS)), 128: (((64, 128, 64), WS), ((64, 64, 64), WS))}


def make_op(tile, kernel):
    math = cutlass.MathInstruction([64, tile[1], 16], D.float16, D.float16, D.float32, cutlass.OpClass.TensorOp)
    description = cutlass.TileDescription(list(tile), 0, None, math, kernel_schedule=kernel)
    A = cutlass.TensorDescription(D.float16, cutlass.RowMajor, 8)
    B = cutlass.TensorDescription(D.float16, cutlass.ColumnMajor, 8)
    C = cutlass.TensorDescription(D.float16, cutlass.RowMajor, 8)
    return cutlass.GemmOperationUniversal(90, description, A, B, C,
                                          cutlass.LinearCombination(D.float16, 8, D.float32, D.float32))


class Model:
    """LAYERS x (up: tokens x 4096 -> 14336, down: -> 4096), weights stored as nn.Linear keeps them (N x K)."""

    def __init__(self, tokens, up_op, down_op, seed=0):
        import torch

        generator = torch.Generator(device="cuda").manual_seed(seed)
        randn = lambda *shape: torch.randn(*shape, device="cuda", dtype=torch.float16, generator=generator)  # noqa: E731
        self.tokens = tokens
        self.up_w = [randn(INTERMEDIATE, HIDDEN) / HIDDEN ** 0.5 for _ in range(LAYERS)]
        self.down_w = [randn(HIDDEN, INTERMEDIATE) / INTERMEDIATE ** 0.5 for _ in range(LAYERS)]
        self.x = randn(tokens, HIDDEN)
        self.h = [torch.empty(tokens, INTERMEDIATE, device="cuda", dtype=torch.float16) for _ in range(LAYERS)]
        self.g = [torch.empty_like(h) for h in self.h]
        self.y = [torch.empty(tokens, HIDDEN, device="cuda", dtype=torch.float16) for _ in range(LAYERS)]
        self.up_op, self.down_op = up_op, down_op

    def torch_chain(self, gelu):
        import torch.nn.functional as F

        x = self.x
        for up, down in zip(self.up_w, self.down_w):
            h = x @ up.t()
            x = (F.gelu(h) if gelu else h) @ down.t()
        return x

    def pycutlass_chain(self, gelu, pdl):
        """The chain as a closure over Arguments built once (what a model's forward reuses)."""
        import torch

        gelu_out = torch.ops.aten.gelu.out  # into the buffer the down projection's Arguments read

        runs = []
        x = self.x
        for i in range(LAYERS):
            up = cutlass.GemmArguments(self.up_op, cutlass.gemm.GemmCoord(self.tokens, INTERMEDIATE, HIDDEN), x,
                                       self.up_w[i].t(), None, self.h[i], pdl=pdl)
            source = self.g[i] if gelu else self.h[i]
            down = cutlass.GemmArguments(self.down_op, cutlass.gemm.GemmCoord(self.tokens, HIDDEN, INTERMEDIATE),
                                         source, self.down_w[i].t(), None, self.y[i], pdl=pdl)
            runs.append((up, down, self.h[i], self.g[i]))
            x = self.y[i]
        up_op, down_op = self.up_op, self.down_op

        def chain():
            for up, down, h, g in runs:
                up_op.run(up)
                if gelu:
                    gelu_out(h, out=g)
                down_op.run(down)
            return self.y[-1]
        return chain


def describe(op) -> str:
    m, n, k = op.tile_description.threadblock_shape
    return f"{m}x{n}x{k}"


def _check(got, reference) -> float:
    return ((got.double() - reference.double()).norm() / reference.double().norm()).item()


def paired_rounds(fns: dict, rounds: int) -> dict:
    """Median ms of each function over interleaved rounds, the order rotated each round."""
    names = list(fns)
    samples = {name: [] for name in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            samples[name].append(bench_ms(fns[name], warmup_ms=20, rep_ms=150))
    return {name: statistics.median(found) for name, found in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens", type=int, nargs="*", default=[16, 128])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", default="benchmarks/results/pdl_chain.json")
    args = parser.parse_args()
    ops = {tokens: tuple(make_op(*config) for config in CONFIGS[min(CONFIGS, key=lambda t: abs(t - tokens))])
           for tokens in args.tokens}
    print(cutlass.compiler.add_module(list(dict.fromkeys(op for pair in ops.values() for op in pair)),
                                      jobs=os.cpu_count()), flush=True)
    rows = []
    for tokens in args.tokens:
        up_op, down_op = ops[tokens]
        model = Model(tokens, up_op, down_op)
        for gelu in (False, True):
            reference = model.torch_chain(gelu).clone()
            fns = {"torch": lambda: model.torch_chain(gelu)}
            for pdl in (False, True):
                chain = model.pycutlass_chain(gelu, pdl)
                model.y[-1].fill_(float("nan"))
                error = _check(chain(), reference)
                if not error < 2e-2:
                    raise SystemExit(f"tokens={tokens} gelu={gelu} pdl={pdl}: relative error {error}")
                fns[f"pycutlass{' pdl' if pdl else ''}"] = chain
            ms = paired_rounds(fns, args.rounds)
            gemms = 2 * LAYERS
            rows.append({"tokens": tokens, "chain": f"{gemms} GEMMs" + (" + torch GELU" if gelu else ""),
                         "tiles (up, down)": f"{describe(up_op)}, {describe(down_op)}",
                         "torch us": ms["torch"] * 1e3, "pycutlass us": ms["pycutlass"] * 1e3,
                         "pycutlass pdl us": ms["pycutlass pdl"] * 1e3,
                         "pdl saves us per GEMM": (ms["pycutlass"] - ms["pycutlass pdl"]) * 1e3 / gemms,
                         "pdl speedup": ms["pycutlass"] / ms["pycutlass pdl"],
                         "torch / pycutlass": ms["torch"] / ms["pycutlass"],
                         "torch / pycutlass pdl": ms["torch"] / ms["pycutlass pdl"]})
            print(rows[-1], flush=True)
    title = f"MLP chains with and without programmatic dependent launch on {device_name()}"
    print_table(title, rows)
    write_json(args.out, {"benchmark": "pdl_chain", "rows": rows})


if __name__ == "__main__":
    main()
