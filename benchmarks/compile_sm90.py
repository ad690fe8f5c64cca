"""Compile time of SM90 GEMM operations on this machine (NVRTC; kernel + device-side Params builder): one cold
operation, and a batch compiled by one add_module call in parallel units.

    python benchmarks/compile_sm90.py [--batch 4] [--jobs 2] [--out benchmarks/results/compile_sm90.json]

Goals (2-core machine): one cold operation <= 20 s; a batch of 8 <= 10 s per operation.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import print_table, write_json  # noqa: E402

CHILD = r"""
import sys, time
import pycutlass as cutlass
sys.path.insert(0, "benchmarks")
from gemm_sm90 import GRID, make_op
count, jobs = int(sys.argv[1]), int(sys.argv[2])
cutlass.compiler.set_target_arch(90)
ops = [make_op(cutlass.float16, config) for config in GRID[:count]]
start = time.perf_counter()
report = cutlass.compiler.add_module(ops, jobs=jobs)
print("RESULT", report.compiled, time.perf_counter() - start)
"""


def run(count: int, jobs: int) -> tuple[int, float, float]:
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "PYCUTLASS_CACHE_DIR": cache}
        start = time.perf_counter()
        out = subprocess.run(["/usr/bin/time", "-f", "MAXRSS %M", sys.executable, "-c", CHILD, str(count), str(jobs)],
                             env=env, capture_output=True, text=True, cwd=os.path.dirname(os.path.dirname(
                                 os.path.abspath(__file__))))
        if out.returncode:
            raise RuntimeError(out.stderr[-3000:])
        line = [x for x in out.stdout.splitlines() if x.startswith("RESULT")][-1].split()
        rss = [x for x in out.stderr.splitlines() if x.startswith("MAXRSS")]
        return int(line[1]), float(line[2]), (int(rss[-1].split()[1]) / 1e6 if rss else 0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--out", default="benchmarks/results/compile_sm90.json")
    args = parser.parse_args()
    rows = []
    for count, jobs in ((1, 1), (args.batch, args.jobs)):
        compiled, seconds, rss_gb = run(count, jobs)
        rows.append({"operations": compiled, "processes": jobs, "wall s": seconds,
                     "s per operation": seconds / compiled, "peak RSS of the parent (GB)": rss_gb})
        print(rows[-1], flush=True)
    print_table(f"SM90 GEMM compile on {os.cpu_count()} cores (NVRTC)", rows)
    write_json(args.out, {"rows": rows, "cores": os.cpu_count()})


if __name__ == "__main__":
    main()
