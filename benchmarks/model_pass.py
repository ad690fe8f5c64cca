"""The model pass on two transformer models: how long ``optimize`` takes, whether every layer it keeps beats torch,
and the model's speed against eager and ``torch.compile``.

    PYCUTLASS_CACHE_DIR=cache python benchmarks/model_pass.py --compile-only --target 90 --jobs 2   # no GPU
    PYCUTLASS_CACHE_DIR=cache python benchmarks/model_pass.py [--out benchmarks/results/model_pass-h200.json]

Models (random weights, bf16, eval, under ``torch.no_grad()``, or ``torch.inference_mode()`` with ``--grad-mode
inference_mode``: ``optimize`` and every forward run in it, as a serving process would): ViT-B/16 (``models.ViT``, torchvision's dimensions) at batch 32
(6304 tokens), and a 12-layer GPT-2-small stack (``models.GPT2Stack``) on 8 x 512 hidden states. For each:
``optimize(model, (x,))`` wall time (tuning draws each layer's candidates from the ranked SM90 space and, from an
empty kernel cache, compiles one round of them on this host's cores, ``--max-compiles``; with ``--compile-only`` run
first, the candidates come from the kernel cache), the report's per-layer kernel and torch
times (CUDA events, L2 flushed, GPU-side lead), the wall time of each phase of ``optimize`` (from its report), and
whole-forward times of eager, ``torch.compile`` (default mode) and the result, timed after ``optimize`` in
alternating rounds (CUDA events, medians). ``--cuda-graphs`` adds ``optimize(..., cuda_graphs=True)`` (the CUDA-graph
replay where it is 10% faster) against ``torch.compile(mode="reduce-overhead")``. Goals: optimize <= 60 s on a
16-core host; every layer kept on a kernel >= 1.0x torch.
"""
from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import bench_ms, print_table, write_json  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
VIT_BATCH, GPT2_TOKENS = 32, (8, 512)
GOAL_OPTIMIZE_S = 60.0
FORWARD_ROUNDS = 5


def layer_calls() -> list[tuple[str, int, int, int]]:
    """(activation, M, N, K) of every Linear the two models run (all with a bias)."""
    vit_tokens, gpt2_tokens = VIT_BATCH * 197, GPT2_TOKENS[0] * GPT2_TOKENS[1]
    found = [("identity", VIT_BATCH * 196, 768, 768), ("identity", VIT_BATCH, 1000, 768)]  # patch embedding, head
    for tokens in (vit_tokens, gpt2_tokens):
        found += [("identity", tokens, 2304, 768), ("identity", tokens, 768, 768), ("gelu", tokens, 3072, 768),
                  ("identity", tokens, 768, 3072)]
    return found


def candidates() -> list:
    from pycutlass.torch.kernels import GemmClass, ranked_gemm_candidates
    from pycutlass.tune.autotune import DEFAULT_TOP_K

    found = {}
    for activation, m, n, k in layer_calls():
        cls = GemmClass("bfloat16", True, False, 8, activation, True, False, 90)
        for _, operation in ranked_gemm_candidates(cls, (m, n, k), DEFAULT_TOP_K):
            found[operation.name] = operation
    return list(found.values())


def build(name: str):
    import torch

    from models import GPT2Stack, ViT

    torch.manual_seed(0)
    if name == "vit-b16":
        return ViT().eval(), torch.randn(VIT_BATCH, 3, 224, 224)
    return GPT2Stack(n_layers=12).eval(), torch.randn(*GPT2_TOKENS, 768)


def forward_ms(forwards: dict, rounds: int = FORWARD_ROUNDS) -> dict:
    """Median over rounds of each forward's ``bench_ms``, the forwards taking turns in alternating order, so that
    none is timed only while the GPU is cool or the host quiet."""
    times = {name: [] for name in forwards}
    names = list(forwards)
    for index in range(rounds):
        for name in names if index % 2 == 0 else reversed(names):
            times[name].append(bench_ms(forwards[name]))
    return {name: statistics.median(values) for name, values in times.items()}


def relative_error(out, reference) -> float:
    """Largest absolute difference over the reference's largest magnitude."""
    return float(((out.float() - reference).abs().max() / reference.abs().max()).item())


def measure(name: str, grad_mode: str = "no_grad", max_compiles="auto", cuda_graphs: bool = False) -> dict:
    import torch

    import pycutlass
    import pycutlass.torch as pct

    model32, x32 = build(name)
    model32, x32 = model32.cuda(), x32.cuda()
    model = copy.deepcopy(model32).to(torch.bfloat16)
    x = x32.to(torch.bfloat16)
    row: dict = {"model": name, "input": "x".join(map(str, x.shape)), "grad_mode": grad_mode,
                 "max_compiles": max_compiles}
    mode = torch.inference_mode if grad_mode == "inference_mode" else torch.no_grad
    with mode():
        reference = model32(x32).float()
        start = time.perf_counter()
        compiled = torch.compile(model)
        compiled(x)
        torch.cuda.synchronize()
        row["compile_s"] = round(time.perf_counter() - start, 1)
        forwards = {"eager_ms": lambda: model(x), "compiled_ms": lambda: compiled(x)}
        if cuda_graphs:  # torch's own CUDA-graph mode, against optimize(..., cuda_graphs=True)
            replayed = torch.compile(model, mode="reduce-overhead")
            for _ in range(3):  # (it records on a later call than the first)
                replayed(x)
            forwards["compiled_graphs_ms"] = lambda: replayed(x)
    with pycutlass.Session().activate(), mode():
        start = time.perf_counter()
        fast = pct.optimize(model, (x,), progress=False, max_compiles=max_compiles)  # (the check times in this mode)
        row["optimize_s"] = round(time.perf_counter() - start, 1)
        report = pct.report(fast)
        row["optimize_phases_s"] = {phase: round(s, 1) for phase, s in report.seconds.items()}
        row["end_to_end_check"] = report.end_to_end  # the placements the check timed (ms per forward)
        out = fast(x)
        forwards["optimized_ms"] = lambda: fast(x)
        if cuda_graphs:  # the same tuning (the dispatch keeps its choices), then the CUDA-graph check
            graphed = pct.optimize(model, (x,), progress=False, max_compiles=max_compiles, cuda_graphs=True)
            row["graphs_check"] = (pct.report(graphed).end_to_end or {}).get("graphs")
            row["graphs_rel_error_vs_fp32"] = relative_error(graphed(x), reference)
            forwards["optimized_graphs_ms"] = lambda: graphed(x)
        row.update(forward_ms(forwards))
    row["rel_error_vs_fp32"] = relative_error(out, reference)
    with mode():
        row["eager_rel_error_vs_fp32"] = relative_error(model(x), reference)
    layers = [r for r in report.rows if r.get("kernel") not in (None, "-")]
    kept = [r for r in layers if r["kernel"] != "torch" and r.get("speedup")]
    row["layers_tuned"] = len(layers)
    row["layers_kept_on_kernels"] = len(kept)
    row["worst_kept_speedup"] = round(min(r["speedup"] for r in kept), 3) if kept else None
    row["chosen"] = (report.end_to_end or {}).get("chosen")
    row["vs_eager"] = round(row["eager_ms"] / row["optimized_ms"], 3)
    row["vs_compile"] = round(row["compiled_ms"] / row["optimized_ms"], 3)
    if cuda_graphs:
        row["graphs_vs_eager"] = round(row["eager_ms"] / row["optimized_graphs_ms"], 3)
        row["graphs_vs_compile_graphs"] = round(row["compiled_graphs_ms"] / row["optimized_graphs_ms"], 3)
    row["goal_optimize"] = row["optimize_s"] <= GOAL_OPTIMIZE_S
    row["goal_kept_>=1"] = all(r["speedup"] >= 1.0 for r in kept)
    distinct = {}
    for r in layers:
        distinct.setdefault((r["pattern"], r["shape"]), r)
    row["layer_rows"] = [{"pattern": r["pattern"], "shape": r["shape"], "kernel": str(r["kernel"]).split("_tnt_")[-1],
                          "cutlass_us": r.get("cutlass_us"), "torch_us": r.get("torch_us"),
                          "speedup": r.get("speedup")} for r in distinct.values()]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compile-only", action="store_true")
    parser.add_argument("--target", default=90)
    parser.add_argument("--jobs", type=int, default=None)
    parser.add_argument("--models", default="vit-b16,gpt2")
    parser.add_argument("--grad-mode", choices=("no_grad", "inference_mode"), default="no_grad")
    parser.add_argument("--max-compiles", default="auto",
                        help="candidates optimize may compile: auto (one round on this host's cores), all, or N")
    parser.add_argument("--cuda-graphs", action="store_true",
                        help="also optimize with cuda_graphs=True and time it against torch.compile's "
                             "reduce-overhead mode (CUDA graphs)")
    parser.add_argument("--out", default=str(RESULTS / "model_pass.json"))
    args = parser.parse_args()
    if args.compile_only:
        from pycutlass.compiler.manager import Compiler
        from pycutlass.session import current

        operations = candidates()
        start = time.perf_counter()
        report = Compiler.of(current()).add_module(operations, jobs=args.jobs, target=args.target, errors="report")
        print(f"{len(operations)} candidates, {len(report.failures)} failed units, {time.perf_counter() - start:.0f} s")
        return
    budget = {"auto": "auto", "all": None}.get(args.max_compiles, args.max_compiles)
    budget = int(budget) if isinstance(budget, str) and budget != "auto" else budget
    rows = []
    for name in args.models.split(","):
        try:
            rows.append(measure(name, args.grad_mode, budget, args.cuda_graphs))
        except Exception as error:  # noqa: BLE001  (one model failing keeps the other's numbers)
            rows.append({"model": name, "error": f"{type(error).__name__}: {error}"})
        print(f"{name}: done", flush=True)
    summary = [{k: v for k, v in row.items() if k not in ("layer_rows", "end_to_end_check", "graphs_check")}
               for row in rows]
    print_table("the model pass (bf16, inference): optimize time, kept layers, forward ms", summary)
    for row in rows:
        check = row.get("end_to_end_check") or {}
        if check.get("candidates"):
            print(f"{row['model']}: the end-to-end check, ms per forward: eager {check['eager_ms']:.3f}, " +
                  ", ".join(f"{name} {ms:.3f}" for name, ms in check["candidates"].items()) +
                  f"; chose {check['chosen']}")
        if row.get("layer_rows"):
            print_table(f"{row['model']}: distinct layers (kernel and torch times from the report)", row["layer_rows"])
    write_json(args.out, {"command": " ".join(sys.argv), "rows": rows})


if __name__ == "__main__":
    main()
