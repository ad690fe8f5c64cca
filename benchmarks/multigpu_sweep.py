"""Two-GPU goals of a sweep: the benchmark phase of one sweep on one GPU vs on two GPUs of the same host, and the
rank agreement of the two GPUs on the same pairs.

    python benchmarks/multigpu_sweep.py [--space sm80-f16] [--out benchmarks/results/multigpu_sweep.json]

Compiles once (reported separately), then benchmarks the same kernels x problems three times: on GPU 0 alone, on
GPU 1 alone, and on both (one pinned worker each). Speed-up = time(GPU 0 alone) / time(both); the Spearman rank
correlation compares GPU 0's and GPU 1's times for every pair.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import print_table, write_json  # noqa: E402

from pycutlass.tune.bench import BenchConfig  # noqa: E402
from pycutlass.tune.problems import model_problems, square_problems  # noqa: E402
from pycutlass.tune.space import SearchSpace  # noqa: E402
from pycutlass.tune.sweep import Sweep  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--space", default="sm80-f16")
    parser.add_argument("--repetitions", type=int, default=50)
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "multigpu_sweep.json"))
    args = parser.parse_args()
    from scipy.stats import spearmanr

    space = SearchSpace.preset(args.space)
    problems = list(model_problems("llama-3-8b", batch_sizes=(16, 512))) + list(square_problems(2048, 4096, 2048))
    db = Path(tempfile.mkdtemp(prefix="pycutlass-multigpu-")) / "sweep.db"
    start = time.perf_counter()
    compiled = Sweep(space, problems, db=db, name="compile").compile(jobs=os.cpu_count())
    compile_s = time.perf_counter() - start
    config = BenchConfig(repetitions=args.repetitions)
    timings, per_gpu = {}, {}
    for name, devices in (("gpu0", [0]), ("gpu1", [1]), ("both", [0, 1])):
        sweep = Sweep(space, problems, db=db, name=name)
        summary = sweep.benchmark(config=config, devices=devices, baseline=False)
        timings[name] = summary.seconds
        per_gpu[name] = {(k, p): s for k, p, s in sweep.db.results(sweep=name)}
    pairs = sorted(set(per_gpu["gpu0"]) & set(per_gpu["gpu1"]))
    rho = spearmanr([per_gpu["gpu0"][p] for p in pairs], [per_gpu["gpu1"][p] for p in pairs]).statistic
    row = {"configurations": compiled.ready, "problems": len(problems), "compile_s": round(compile_s, 1),
           "gpu0_alone_s": round(timings["gpu0"], 1), "gpu1_alone_s": round(timings["gpu1"], 1),
           "both_s": round(timings["both"], 1), "speedup": round(timings["gpu0"] / timings["both"], 3),
           "goal_speedup": 1.8, "spearman_gpu0_gpu1": round(float(rho), 4), "goal_spearman": 0.95,
           "pairs": len(pairs)}
    print_table("two GPUs vs one (benchmark phase)", [row])
    write_json(args.out, row)


if __name__ == "__main__":
    main()
