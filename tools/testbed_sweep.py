"""PyCUTLASS 2.11 client code over random configurations: draw what the descriptions accept (tools/fuzz_accept.py's
drawing, deterministic by --seed) and run PyCUTLASS's own testbeds on each, as its unit tests do:
``test_all_gemm(op, "universal")`` (``"interleaved"`` for interleaved int8), ``test_all_conv2d(op)`` (Sm80-family
and SM90 convolutions) and ``TestbedGrouped(op).run(n)`` (Sm80-family and SM90 grouped GEMMs, through
``gemm_grouped_testbed.sweep``).

    # GPU host (16 cores): compile everything in parallel, then one subprocess per configuration, 8 at once
    PYCUTLASS_CACHE_DIR=/tmp/tbcache python tools/testbed_sweep.py --gemm80 24 --conv80 12 --gemm90 8 --conv90 3 \\
        --grouped80 6 --grouped90 3 --seed 1 --jobs 16 --parallel 8 --out testbed-sweep.jsonl
    # what would be drawn (no GPU)
    python tools/testbed_sweep.py --gemm80 24 --conv80 12 --gemm90 8 --seed 1 --dry-run
    # compile that draw here (no GPU) into a cache to carry to an H100 host
    PYCUTLASS_CACHE_DIR=.gpucache python tools/testbed_sweep.py --gemm80 24 --conv80 12 --gemm90 8 --seed 1 \\
        --jobs 2 --compile-only --arch 90

A configuration passes when its testbed returns True; FAIL is a wrong result, CRASH a dead process, TIMEOUT a hang.
Operations with pycutlass's bias vectors are not drawn (PyCUTLASS's testbeds have no bias).
"""
from __future__ import annotations

import argparse
import concurrent.futures as futures
import json
import os
import random
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import fuzz_accept  # noqa: E402

import pycutlass as cutlass  # noqa: E402
from pycutlass.compiler.manager import Compiler  # noqa: E402
from pycutlass.test import _common  # noqa: E402

FAMILIES = ("gemm80", "conv80", "gemm90", "conv90", "grouped80", "grouped90")


def _wide_c(op) -> bool:
    return op.C.access_bits > 128


def _warp_n128(op) -> bool:
    tile = op.tile_description
    return (tile.warp_count is not None and not tile.sm90_only and tile.warp_shape[1] == 128
            and tile.math_instruction.opcode_class.name == "TensorOp")


# --feature: draw only operations that use something accepted since session 15 (PyCUTLASS 2.11's unit tests).
FEATURES = {
    "direct_store": lambda op: getattr(op, "direct_store", False),
    "int32_epilogue": lambda op: op.epilogue_functor.element_epilogue.is_integer,
    "simt_conv_alignment": lambda op: (op.kind == "conv2d" and op.tile_description.math_instruction.opcode_class.name
                                       == "Simt" and max(op.A.alignment, op.B.alignment) > 1),
    "wide_c": _wide_c,
    "warp_n128": _warp_n128,
}


def draw_configs(seed: int, counts: dict, features=()) -> list:
    rng = random.Random(seed)
    picked = []
    for family in FAMILIES:
        want, seen, tries = counts.get(family, 0), set(), 0
        while want and tries < 20000:
            tries += 1
            cfg, op, _ = fuzz_accept.draw(rng, family)
            if op is None or op.name in seen:
                continue
            if op.bias:  # bias vectors: pycutlass's extension, not in PyCUTLASS's testbeds
                continue
            if features and not any(FEATURES[f](op) for f in features):
                continue
            seen.add(op.name)
            picked.append(dict(cfg, family=family))
            want -= 1
    return picked


def activation_args(op) -> tuple:
    functor = op.epilogue_functor
    return (0.1,) * getattr(functor, "num_activation_args", 0)


def run_one(cfg) -> dict:
    from pycutlass.test import conv2d_testbed, gemm_grouped_testbed, gemm_testbed

    op = fuzz_accept.build(cfg)
    start = time.time()
    kwargs = dict(activation_args=activation_args(op))
    if cfg["family"].startswith("conv"):
        launcher = cutlass.test.Conv2dLauncher(op, interleaved=op.A.layout.is_interleaved, **kwargs)
        passed = conv2d_testbed.sweep(launcher)
    elif cfg["family"].startswith("grouped"):
        launcher = cutlass.test.TestbedGrouped(op, **kwargs)
        passed = gemm_grouped_testbed.sweep(launcher)
    else:
        launcher = cutlass.test.GemmUniversalLauncher(op, interleaved=op.A.layout.is_interleaved, **kwargs)
        passed = gemm_testbed.sweep(launcher, "interleaved" if op.A.layout.is_interleaved else "universal")
    return {"passed": bool(passed), "skipped": len(launcher.skipped), "skipped_first": launcher.skipped[:1],
            "seconds": round(time.time() - start, 1)}


def precompile(configs, jobs: int) -> int:
    """Every operation and its split-K reduction, per (backend, target), in parallel units; how many units failed."""
    failures = 0
    sm80, sm90 = [], []
    for cfg in configs:
        op = fuzz_accept.build(cfg)
        group = sm90 if op.family != "sm80" else sm80
        group.append(op)
        if cfg["family"].startswith("grouped"):
            continue  # the grouped testbed runs no split-K
        try:  # the split-K reduction is an Sm80-family kernel whatever the producer
            sm80.append(_common.reduction_for(op))
        except cutlass.DescriptionError:
            pass
    for ops in (sm80, sm90):
        if ops:
            report = Compiler.of().add_module(ops, jobs=jobs, errors="report")
            for unit, error in report.failures:
                print(f"COMPILE-FAIL {[o.name for o in unit]}: {str(error)[:300]}", flush=True)
            failures += len(report.failures)
    return failures


def child(cfg, timeout: int) -> dict:
    command = [sys.executable, os.path.abspath(__file__), "--one", json.dumps(cfg)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"status": "TIMEOUT"}
    result = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not result:
        return {"status": "CRASH", "rc": done.returncode, "tail": (done.stdout + done.stderr)[-1500:]}
    record = json.loads(result[-1][7:])
    record["status"] = ("ok" if not record["skipped"] else "ok+skips") if record["passed"] else "FAIL"
    if not record["passed"]:
        record["tail"] = done.stdout[-1500:]
    return record


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for family in FAMILIES:
        parser.add_argument(f"--{family}", type=int, default=0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--parallel", type=int, default=4)
    parser.add_argument("--timeout", type=int, default=300)
    parser.add_argument("--out", default="testbed-sweep.jsonl")
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--one")
    parser.add_argument("--compile-only", action="store_true",
                        help="compile the drawn operations into the cache and stop (no GPU); with --arch")
    parser.add_argument("--arch", type=int, default=None,
                        help="target of the Sm80-family operations (default: this machine's GPU)")
    parser.add_argument("--feature", action="append", choices=sorted(FEATURES), default=[],
                        help="draw only operations using this (repeatable: any of them)")
    args = parser.parse_args(argv)
    if args.one:
        print("RESULT " + json.dumps(run_one(json.loads(args.one))), flush=True)
        return 0
    configs = draw_configs(args.seed, {f: getattr(args, f) for f in FAMILIES}, args.feature)
    if args.dry_run:
        for cfg in configs:
            print(cfg["family"], fuzz_accept.build(cfg).describe())
        return 0
    if args.arch:
        cutlass.compiler.set_target_arch(args.arch)
    failures = precompile(configs, args.jobs)
    if args.compile_only:
        print(f"compiled {len(configs)} configurations; {failures} compile unit(s) failed", flush=True)
        return 1 if failures else 0
    counts = {}
    with open(args.out, "a") as out, futures.ThreadPoolExecutor(args.parallel) as pool:
        for cfg, record in zip(configs, pool.map(lambda c: child(c, args.timeout), configs)):
            record.update(cfg=cfg, describe=fuzz_accept.build(cfg).describe())
            out.write(json.dumps(record) + "\n")
            out.flush()
            counts[(cfg["family"], record["status"])] = counts.get((cfg["family"], record["status"]), 0) + 1
            print(f"{record['status']:8} {record.get('seconds', '')!s:>6} {record['describe']}", flush=True)
            if record.get("skipped"):
                print(f"    {record['skipped']} case(s) refused, e.g. {record['skipped_first'][0][:300]}", flush=True)
            if record["status"] != "ok":
                print("    " + record.get("tail", "").replace("\n", "\n    ")[-1200:], flush=True)
    print("summary:", {f"{f} {s}": n for (f, s), n in sorted(counts.items())})
    return 0


if __name__ == "__main__":
    sys.exit(main())
