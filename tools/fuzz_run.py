"""Run what the descriptions accept on a GPU: draw random GEMM configurations (tools/fuzz_accept.py's drawing),
keep the accepted ones, compile them in parallel and run each on random aligned problem sizes against a float64
reference with NaN-poisoned outputs (the GPU suite's ``run_case``). Every compile failure, crash or wrong result is
a defect; an ArgumentError for a problem the operation cannot take is recorded, not counted.

    PYCUTLASS_CACHE_DIR=/tmp/fuzzcache python tools/fuzz_run.py --sm80 48 --sm90 32 --seed 3 --jobs 16 --out F.jsonl
"""
from __future__ import annotations

import argparse
import collections
import json
import random
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import fuzz_accept  # noqa: E402

import pycutlass as cutlass  # noqa: E402


def _runnable(cfg) -> bool:
    """What run_case's reference models: dense (not interleaved) GEMMs; the fast clamp only where its K rule holds."""
    return "Interleaved" not in "".join(cfg["layouts"]) and cfg["epilogue"] != "FastLinearCombinationClamp"


def _accepted(rng, family, count, tries=20000):
    found = []
    for _ in range(tries):
        cfg, op, _ = fuzz_accept.draw(rng, family)
        if op is not None and _runnable(cfg) and op.name not in {o.name for _, o in found}:
            found.append((cfg, op))
            if len(found) == count:
                break
    return found


def _compile(ops, backend, jobs):
    cutlass.compiler.nvrtc() if backend == "nvrtc" else cutlass.compiler.nvcc()
    failed = {}
    try:
        cutlass.compiler.add_module(ops, jobs=jobs)
    except cutlass.CompilationError:
        for op in ops:  # which ones
            try:
                cutlass.compiler.add_module([op])
            except cutlass.CompilationError as error:
                failed[op.name] = str(error)[-1500:]
    return failed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sm80", type=int, default=48)
    parser.add_argument("--sm90", type=int, default=32)
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=16)
    parser.add_argument("--sizes", type=int, default=2, help="random problem sizes per operation")
    parser.add_argument("--out", default="fuzz_run.jsonl")
    args = parser.parse_args()
    from tests.gpu import test_gemm_sm90 as suite  # the GPU suite's runner and float64 reference
    suite.TORCH.setdefault(cutlass.DataType.float64, "float64")  # (that suite has no f64: the Sm80 family does)
    suite.TOLERANCE.setdefault(cutlass.DataType.float64, 1e-12)
    run_case = suite.run_case

    cutlass.session.current().set_option("progress", False)
    cutlass.get_memory_pool(2**28, 2**34)
    rng = random.Random(args.seed)
    groups = {"nvcc": _accepted(rng, "gemm80", args.sm80), "nvrtc": _accepted(rng, "gemm90", args.sm90)}
    counts = collections.Counter()
    with open(args.out, "w") as out:
        for backend, entries in groups.items():
            start = time.perf_counter()
            by_arch = collections.defaultdict(list)
            for cfg, op in entries:
                by_arch[90 if cfg["cc"] == 90 else 80].append(op)
            failed = {}
            for arch, ops in by_arch.items():
                cutlass.compiler.set_target_arch(arch)
                failed.update(_compile(ops, backend, args.jobs))
            print(f"{backend}: compiled {len(entries)} in {time.perf_counter() - start:.0f} s, {len(failed)} failed",
                  flush=True)
            for cfg, op in entries:
                record = {"backend": backend, "name": op.name, "cfg": cfg}
                if op.name in failed:
                    record.update(status="COMPILE-FAIL", error=failed[op.name])
                    counts["COMPILE-FAIL"] += 1
                    out.write(json.dumps(record) + "\n")
                    print("COMPILE-FAIL", op.name, flush=True)
                    continue
                cutlass.compiler.set_target_arch(90 if cfg["cc"] == 90 else 80)
                cutlass.compiler.nvrtc() if backend == "nvrtc" else cutlass.compiler.nvcc()
                for _ in range(args.sizes):
                    m, n, k = (rng.randint(1, 24) * 16 for _ in range(3))
                    leaky = (0.1,) if cfg["epilogue"] == "LinearCombinationGeneric" and \
                        cfg["activation"] == "leaky_relu" else ()
                    case = dict(record, m=m, n=n, k=k)
                    try:
                        run_case(op, m, n, k, seed=rng.randint(0, 2**31), bias=bool(cfg.get("bias")),
                                 activation_args=leaky)
                        case["status"] = "ok"
                    except cutlass.ArgumentError as error:
                        case.update(status="argument-rejected", error=str(error)[:300])
                    except AssertionError as error:
                        case.update(status="WRONG", error=str(error)[:300])
                    except Exception as error:  # noqa: BLE001
                        case.update(status="ERROR", error=f"{type(error).__name__}: {str(error)[:300]}",
                                    trace=traceback.format_exc()[-1500:])
                    counts[case["status"]] += 1
                    out.write(json.dumps(case) + "\n")
                    if case["status"] not in ("ok", "argument-rejected"):
                        print(case["status"], op.name, (m, n, k), case.get("error", "")[:200], flush=True)
    print("summary:", dict(counts), flush=True)


if __name__ == "__main__":
    main()
