"""How far the ranking can be trusted: compile only the top K of a space and still get the exhaustive best?

    python benchmarks/tune_trust.py                          # GPU host: (a) sweep, (b) ranking, (c) time-to-kernel
    python benchmarks/tune_trust.py --compile-only --target 90 --jobs 16   # any host: compile the space into the cache
    python benchmarks/tune_trust.py --dry-run                # no GPU, no compiles: synthetic timings through (b)
    python benchmarks/tune_trust.py --replay GEMM_SM90_JSON...   # (b) on grids benchmarks/gemm_sm90.py measured
    python benchmarks/tune_trust.py --agreement               # GPU host: harness vs graph replay vs ncu (agreement.py)
    python benchmarks/tune_trust.py --from-db trust.db        # (b) again on a sweep already measured (no GPU)
    python benchmarks/tune_trust.py --shapes 8x4096x4096,...  # other shapes (e.g. to check the ranking on new ones)

(a) the exhaustive sweep: every configuration of the space (f16 and bf16, A row-major / B column-major, SM90 tiles
    M 64/128/256 x N 64/128/256 (``--tile-n`` widens it), clusters 1x1/2x1/1x2, the three kernel schedules: 108
    configurations) compiled and timed on the nine shapes, with the torch (cuBLAS) baseline beside each;
(b) for K = 4, 8, 16, the ranked top K's best against the exhaustive best per (shape, dtype): hits within 2% and the
    geometric-mean regret; also the configurations the space prunes as unable to win, with their best ratio;
(c) time-to-kernel: ``autotune(..., top_k=8)`` for one new (shape, dtype) with a cold kernel cache, then again.

Goals printed with the result: K = 8 within 2% on >= 16 of 18 pairs, geomean regret <= 1%; (c) <= 60 s cold on a
16-core GPU host and <= 1 s cached. Writes benchmarks/results/tune-trust.json (``--out``).
"""
from __future__ import annotations

import argparse
import hashlib
import math
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import print_table, write_json  # noqa: E402

from pycutlass.tune.problems import GemmProblem  # noqa: E402
from pycutlass.tune.rank import cannot_win, config_of, estimate, device_model, top_k  # noqa: E402
from pycutlass.tune.space import SearchSpace  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (2048, 14336, 4096), (4096, 14336, 4096), (1024, 1024, 1024),
          (16, 4096, 4096), (64, 14336, 4096), (128, 4096, 14336), (1000, 3000, 520)]
DTYPES = ("f16_f32acc", "bf16")
KS = (4, 8, 16)
HIT = 1.02  # "within 2%"
GOAL_HITS, GOAL_REGRET = 16, 0.01
NEW_SHAPE = (3072, 5120, 2048)  # time-to-kernel: a shape no sweep above measured


def local_gpu_name() -> str | None:
    """The GPU this host times on, so the ranking models the GPU it is checked against."""
    try:
        import torch

        return torch.cuda.get_device_name() if torch.cuda.is_available() else None
    except ImportError:
        return None


def trust_space(tile_n=(64, 128, 256)) -> SearchSpace:
    """The exhaustive space, without the cannot-win filter (the sweep checks the rule's verdicts too)."""
    return SearchSpace(name="sm90-trust", kind="gemm", compute_capability=90, dtypes=list(DTYPES), layouts="rcr",
                       threadblock_shape=[[m, n, 64] for m in (64, 128, 256) for n in tile_n], warp_count="auto",
                       stages=0, cluster_shape=[[1, 1, 1], [2, 1, 1], [1, 2, 1]],
                       kernel_schedule=["TmaWarpSpecialized", "TmaWarpSpecializedCooperative",
                                        "TmaWarpSpecializedPingpong"])


def operations_by_dtype(space: SearchSpace) -> dict[str, list]:
    built = space.build()
    found: dict[str, list] = {}
    for op in built.operations:
        found.setdefault(built.params_of(op)["dtypes"], []).append(op)
    return found


def available_models() -> list[str]:
    """The analytic model, and nvMatmulHeuristics when installed (the ``rank`` extra)."""
    try:
        import nvMatmulHeuristics  # noqa: F401
    except ImportError:
        return ["analytic"]
    return ["analytic", "nvmmh"]


def trust_table(timings: dict, by_dtype: dict, problems, device, ks=KS, model: str = "analytic") -> dict:
    """(b): ``timings[(kernel, problem key)] = seconds``. Per (shape, dtype): the exhaustive best, and for each K
    the best measured among the ranked top K of the candidates the space keeps (cannot-win pruned)."""
    rows, per_k = [], {k: {"hits": 0, "logs": [], "pairs": 0} for k in ks}
    never = {}
    for problem in problems:
        for dtype, ops in by_dtype.items():
            measured = {op.name: timings.get((op.name, problem.key)) for op in ops}
            measured = {name: t for name, t in measured.items() if t}
            if not measured:
                continue
            best_name = min(measured, key=measured.get)
            best = measured[best_name]
            for op in ops:
                if cannot_win(config_of(op)) and op.name in measured:
                    never[op.name] = min(never.get(op.name, math.inf), measured[op.name] / best)
            kept = [op for op in ops if not cannot_win(config_of(op))]
            row = {"shape": "x".join(map(str, problem.shape)), "dtype": dtype, "best": best_name.split("_tnt_")[-1],
                   "best_us": round(best * 1e6, 2)}
            for k in ks:
                chosen = [op.name for op in top_k(kept, problem, k, device, model=model) if op.name in measured]
                picked = min((measured[name] for name in chosen), default=math.inf)
                ratio = picked / best
                row[f"top{k}/best"] = round(ratio, 4)
                stats = per_k[k]
                stats["pairs"] += 1
                stats["hits"] += ratio <= HIT
                stats["logs"].append(math.log(ratio) if math.isfinite(ratio) else math.log(10.0))
            rows.append(row)
    summary = []
    for k, stats in per_k.items():
        regret = math.exp(sum(stats["logs"]) / len(stats["logs"])) - 1 if stats["logs"] else None
        summary.append({"K": k, "pairs": stats["pairs"], "within_2%": stats["hits"],
                        "geomean_regret_%": None if regret is None else round(100 * regret, 2)})
    goal = next((s for s in summary if s["K"] == 8), None)
    goal_met = bool(goal and goal["within_2%"] >= GOAL_HITS and goal["geomean_regret_%"] is not None
                    and goal["geomean_regret_%"] <= 100 * GOAL_REGRET)
    pruned = [{"kernel": name.split("_tnt_")[-1], "best_ratio": round(ratio, 2), "within_2x": ratio <= 2.0}
              for name, ratio in sorted(never.items(), key=lambda item: item[1])]
    return {"model": model, "rows": rows, "summary": summary, "pruned_cannot_win": pruned, "goal_met": goal_met,
            "goal": f"K=8: >= {GOAL_HITS} pairs within 2% and geomean regret <= {GOAL_REGRET:.0%}"}


def synthetic_timings(by_dtype: dict, problems, device) -> dict:
    """Dry run: the analytic model's seconds perturbed by a deterministic +-8% per (kernel, shape), so the ranking
    is not simply checked against itself."""
    timings = {}
    for ops in by_dtype.values():
        for op in ops:
            config = config_of(op)
            for problem in problems:
                digest = hashlib.sha256(f"{op.name}|{problem.key}".encode()).digest()
                noise = 1 + 0.16 * (digest[0] / 255 - 0.5)
                timings[(op.name, problem.key)] = estimate(config, problem, device).seconds * noise
    return timings


_REPLAY_SCHEDULES = {"coop": "TmaWarpSpecializedCooperative", "pp": "TmaWarpSpecializedPingpong",
                     "ws": "TmaWarpSpecialized"}
_REPLAY_DTYPES = {"f16": "f16_f32acc", "bf16": "bf16"}


def replay_timings(paths) -> tuple[dict, dict, list]:
    """(b) from grids already measured by benchmarks/gemm_sm90.py (its JSON: per dtype and shape, each
    configuration's milliseconds, e.g. "128x256x64 c2x1 coop sk"); variants with other knobs are left out."""
    import json

    from pycutlass.tune.space import build_operation

    by_dtype, timings, problems = {}, {}, {}
    for path in paths:
        results = json.loads(Path(path).read_text())["results"]
        for label, dtype in _REPLAY_DTYPES.items():
            for entry in results.get(label, []):
                problem = GemmProblem(*(int(v) for v in entry["shape"].split("x")))
                problems.setdefault(problem.key, problem)
                for measured in entry.get("configs", []):
                    words = measured["config"].split()
                    if not measured.get("ms") or len(words) not in (3, 4) or words[2] not in _REPLAY_SCHEDULES \
                            or words[3:] not in ([], ["sk"]):
                        continue
                    cluster = [int(v) for v in words[1][1:].split("x")] + [1]
                    op = build_operation({
                        "compute_capability": 90, "dtypes": dtype, "warp_count": "auto", "stages": 0,
                        "threadblock_shape": [int(v) for v in words[0].split("x")], "cluster_shape": cluster,
                        "kernel_schedule": _REPLAY_SCHEDULES[words[2]],
                        "tile_scheduler": "StreamK" if words[3:] == ["sk"] else "Default"})
                    ops = by_dtype.setdefault(dtype, {})
                    ops.setdefault(op.name, op)
                    # the grid's own entry comes first; later ones with the same label are variants with runtime
                    # knobs (split-K, swizzle) that the label does not show
                    timings.setdefault((op.name, problem.key), measured["ms"] / 1e3)
    return {dtype: list(ops.values()) for dtype, ops in by_dtype.items()}, timings, list(problems.values())


def measured_timings(args, space, problems) -> tuple[dict, dict]:
    """(a): compile and time the whole space with the torch baseline."""
    from pycutlass.tune.bench import BenchConfig
    from pycutlass.tune.db import ResultsDB
    from pycutlass.tune.bench import element_label
    from pycutlass.tune.runner import baseline_name
    from pycutlass.tune.sweep import Sweep

    db = ResultsDB(args.db)
    start = time.perf_counter()
    sweep = Sweep(space, problems, db=db, name="tune-trust")
    compiled = sweep.compile(jobs=args.jobs)
    compile_s = time.perf_counter() - start
    bench = sweep.benchmark(config=BenchConfig(repetitions=args.repetitions), timeout=120)
    rows = db.results(sweep="tune-trust", include_baselines=True)
    timings = {(kernel, problem): seconds for kernel, problem, seconds in rows}
    baseline_rows = []
    for problem in problems:
        for dtype, ops in operations_by_dtype(space).items():
            mi = ops[0].tile_description.math_instruction
            torch_s = timings.get((baseline_name(element_label(mi.element_a), element_label(ops[0].C.element)),
                                   problem.key))
            kernel_s = min((timings.get((op.name, problem.key)) or math.inf for op in ops), default=math.inf)
            baseline_rows.append({"shape": "x".join(map(str, problem.shape)), "dtype": dtype,
                                  "kernel_us": round(kernel_s * 1e6, 2) if math.isfinite(kernel_s) else None,
                                  "torch_us": round(torch_s * 1e6, 2) if torch_s else None,
                                  "torch/kernel": round(torch_s / kernel_s, 3) if torch_s and math.isfinite(kernel_s)
                                  else None})
    print_table("(a) exhaustive sweep: best kernel vs torch", baseline_rows)
    return timings, {"compile": str(compiled), "compile_s": round(compile_s, 1), "benchmark_s": round(bench.seconds, 1),
                     "measured": bench.done, "rows": baseline_rows}


def time_to_kernel(args) -> dict:
    """(c): autotune one new (shape, dtype) with top_k=8 and a cold kernel cache, then the same call again."""
    import pycutlass
    from pycutlass.tune.autotune import autotune
    from pycutlass.tune.space import PRESETS

    space = SearchSpace.from_dict({**PRESETS["sm90-f16"], "dtypes": ["bf16"], "name": "sm90-bf16-trust"})
    problem = GemmProblem(*NEW_SHAPE)
    with tempfile.TemporaryDirectory() as scratch:
        session = pycutlass.Session(cache_path=os.path.join(scratch, "kernels.db"))
        db = os.path.join(scratch, "tune.db")
        start = time.perf_counter()
        first = autotune(space, problem, db=db, session=session, jobs=args.jobs, top_k=8)
        cold = time.perf_counter() - start
        start = time.perf_counter()
        again = autotune(space, problem, db=db, session=session, jobs=args.jobs, top_k=8)
        cached = time.perf_counter() - start
    row = {"shape": "x".join(map(str, NEW_SHAPE)), "dtype": "bf16", "candidates": first.candidates,
           "kernel": first.operation.name.split("_tnt_")[-1], "cold_s": round(cold, 1), "cached_s": round(cached, 3),
           "from_cache": again.from_cache, "cores": os.cpu_count(), "goal_cold_s": 60, "goal_cached_s": 1}
    row["goal_met"] = cold <= 60 and cached <= 1
    print_table("(c) time-to-kernel (autotune, top_k=8)", [row])
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compile-only", action="store_true", help="compile the space into the kernel cache")
    parser.add_argument("--target", default=None, help="compile for this GPU (e.g. 90) instead of the local one")
    parser.add_argument("--jobs", type=int, default=os.cpu_count())
    parser.add_argument("--repetitions", type=int, default=50)
    parser.add_argument("--tile-n", default="64,128,256", help="tile N values (the SM90 kind takes 32..256)")
    parser.add_argument("--device", default=None,
                        help="the GPU model the ranking assumes (H100, H200; default: this host's GPU, else H100)")
    parser.add_argument("--model", default="all", choices=["all", "analytic", "nvmmh"],
                        help="ranking model(s) to evaluate (all: the analytic one and nvMatmulHeuristics if installed)")
    parser.add_argument("--db", default=str(RESULTS / "tune-trust.db"))
    parser.add_argument("--dry-run", action="store_true", help="synthetic timings: no GPU, nothing compiles")
    parser.add_argument("--replay", nargs="+", default=None, metavar="JSON",
                        help="(b) only, from grids benchmarks/gemm_sm90.py measured (no GPU, nothing compiles)")
    parser.add_argument("--out", default=str(RESULTS / "tune-trust.json"))
    parser.add_argument("--no-time-to-kernel", action="store_true", help="skip (c)")
    parser.add_argument("--shapes", default=None, help="MxNxK,... instead of the nine standard shapes")
    parser.add_argument("--from-db", default=None, metavar="DB",
                        help="(b) only, ranking the sweep this results DB holds (measured before; no GPU)")
    parser.add_argument("--agreement", action="store_true",
                        help="only the agreement table: harness vs CUDA-graph replay vs ncu (benchmarks/agreement.py)")
    args = parser.parse_args()
    if args.agreement:
        import agreement

        if args.compile_only:
            import pycutlass
            from pycutlass.compiler.manager import Compiler

            session = pycutlass.Session(target=args.target) if args.target else pycutlass.Session()
            Compiler.of(session).add_module(agreement.operations(), jobs=args.jobs)
            return
        agreement.run(str(RESULTS / "agreement.json") if args.out == str(RESULTS / "tune-trust.json") else args.out)
        return
    space = trust_space(tuple(int(v) for v in args.tile_n.split(",")))
    shapes = [tuple(int(v) for v in item.split("x")) for item in args.shapes.split(",")] if args.shapes else SHAPES
    problems = [GemmProblem(*shape) for shape in shapes]
    by_dtype = operations_by_dtype(space)
    device = device_model(args.device or local_gpu_name())
    if args.compile_only:
        import pycutlass
        from pycutlass.tune.sweep import Sweep

        session = pycutlass.Session(target=args.target) if args.target else pycutlass.Session()
        summary = Sweep(space, problems, db=args.db, name="tune-trust", session=session).compile(jobs=args.jobs)
        print(f"compile: {summary}")
        return
    payload = {"space": space.to_dict(), "configurations": sum(map(len, by_dtype.values())),
               "device_model": device.name}
    if args.replay:
        by_dtype, timings, problems = replay_timings(args.replay)
        payload.update(timings=f"measured by benchmarks/gemm_sm90.py ({len(args.replay)} result files)", space=None,
                       configurations=sum(map(len, by_dtype.values())))
    elif args.from_db:
        from pycutlass.tune.db import ResultsDB

        timings = {(kernel, problem): seconds for kernel, problem, seconds in
                   ResultsDB(args.from_db).results(sweep="tune-trust")}
        payload["timings"] = f"measured before, read from {Path(args.from_db).name}"
    elif args.dry_run:
        timings = synthetic_timings(by_dtype, problems, device)
        payload["timings"] = "synthetic (analytic model x deterministic +-8% noise)"
    else:
        timings, payload["sweep"] = measured_timings(args, space, problems)
    payload["ranking"] = {}
    for model in available_models() if args.model == "all" else [args.model]:
        table = trust_table(timings, by_dtype, problems, device, model=model)
        print_table(f"(b) ranked top K ({model}) vs exhaustive best", table["rows"])
        print_table(f"(b) summary ({model}); goal: {table['goal']}", table["summary"])
        payload["ranking"][model] = table
    if table["pruned_cannot_win"]:
        print_table("configurations pruned as unable to win: their best ratio to the best", table["pruned_cannot_win"])
    if not (args.dry_run or args.replay or args.from_db or args.no_time_to_kernel):
        payload["time_to_kernel"] = time_to_kernel(args)
    write_json(args.out, payload)


if __name__ == "__main__":
    main()
