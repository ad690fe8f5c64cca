"""How a sweep's benchmark phase scales with GPUs, where each GPU's time goes, and whether GPUs agree on rankings.

    python benchmarks/multigpu_sweep.py [--space FILE|PRESET] [--problems SPEC ...] [--gpus 1,2[,4]]
                                        [--rank-gpus 1] [--repetitions 200] [--bundle PATH] [--dask] [--out FILE]

Compiles once (reported separately; nothing compiles when the kernel cache, e.g. ``$PYCUTLASS_CACHE_DIR``, already
holds every kernel, or with ``--bundle``), then benchmarks the same kernels x problems on GPU 0 alone, on each GPU of
``--rank-gpus`` alone (for the rank agreement), and on the first N GPUs for each N of ``--gpus``. Prints:
- the scaling table: benchmark seconds (the whole phase: worker start-up included), speed-up over one GPU and
  efficiency (speed-up / GPUs), and the same after the workers' start-up;
- each run's time per GPU worker (busy, idle, tail, start-up, module loads, inputs, references, timing, ...);
- Spearman's rank correlation of kernel times (medians) between GPU 0 alone and each other GPU alone on the same
  pairs, and between GPU 0 alone and each multi-GPU run (do concurrent GPUs disturb each other's timings?).

``--dask`` also starts a Dask scheduler and ``--dask-workers`` workers (subprocesses; each ``dask worker --nworkers 1
--resources "GPU=G,MEMORY_GB=..."`` sees its own G GPUs through CUDA_VISIBLE_DEVICES, like separate hosts), runs
the same sweep through it, and reports its speed-up over one GPU, where its tasks ran (on the worker holding their
kernels, or with binaries sent), and whether its results hold the same pairs and statuses as the one-GPU run.
``--dask-compile`` compiles through the workers first (the client starts from an empty kernel cache; the workers
read theirs), so benchmark tasks are placed on the worker that compiled their kernels. ``--dask-kill-after S`` kills
one worker S seconds into the benchmark: nothing may be lost.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import print_table, write_json  # noqa: E402

from pycutlass import Session  # noqa: E402
from pycutlass.tune.bench import BenchConfig  # noqa: E402
from pycutlass.tune.problems import parse_problems  # noqa: E402
from pycutlass.tune.runner import run_sweep, visible_gpus  # noqa: E402
from pycutlass.tune.space import SearchSpace  # noqa: E402
from pycutlass.tune.sweep import Sweep  # noqa: E402

HERE = Path(__file__).resolve().parent
DEFAULT_SPACE = HERE / "spaces" / "multigpu_sm80_f16.toml"
DEFAULT_PROBLEMS = ["model:llama-3-8b:batch=128,512,2048,4096"]  # 16 GEMMs: 4 layers x 4 token counts


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--space", default=str(DEFAULT_SPACE), help="a preset name or a .toml/.json space file")
    parser.add_argument("--problems", action="append", default=None,
                        help=f"problem spec, repeatable (default: {' '.join(DEFAULT_PROBLEMS)})")
    parser.add_argument("--gpus", default=None, help="GPU counts to compare, e.g. 1,2 or 1,2,4 (default: 1 and all)")
    parser.add_argument("--rank-gpus", default="1",
                        help="GPUs also run alone, to compare their rankings with GPU 0's ('all', 'none' or ordinals)")
    parser.add_argument("--repetitions", type=int, default=200, help="timed repetitions per pair")
    parser.add_argument("--max-seconds", type=float, default=2.0, help="time budget per pair")
    parser.add_argument("--bundle", default=None, help="run a bundle's precompiled kernels (nothing compiles)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count(), help="compile processes")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per measurement before a worker is killed")
    parser.add_argument("--db", default=None, help="results DB (default: a temporary one)")
    parser.add_argument("--dask", action="store_true", help="also run through a Dask cluster of local subprocesses")
    parser.add_argument("--dask-workers", type=int, default=2, help="Dask workers (each like a host)")
    parser.add_argument("--dask-gpus-per-worker", type=int, default=2)
    parser.add_argument("--dask-compile", action="store_true", help="compile through the Dask workers first")
    parser.add_argument("--dask-kill-after", type=float, default=None,
                        help="kill one Dask worker this many seconds into the benchmark")
    parser.add_argument("--out", default=str(HERE / "results" / "multigpu_sweep.json"))
    return parser.parse_args()


def counts_of(text: str | None, available: int) -> list[int]:
    counts = sorted({1, available} if text is None else {int(c) for c in text.split(",") if c.strip()})
    too_many = [c for c in counts if c > available or c < 1]
    if too_many:
        raise SystemExit(f"--gpus {text}: this host has {available} GPU(s)")
    return counts if 1 in counts else [1, *counts]  # the speed-up needs the one-GPU run


def rank_gpus_of(text: str, available: int) -> list[int]:
    if text == "none":
        return []
    chosen = range(1, available) if text == "all" else [int(g) for g in text.split(",") if g.strip()]
    return [g for g in chosen if 0 < g < available]


def spearman(left: dict, right: dict) -> dict:
    from scipy.stats import spearmanr

    pairs = sorted(set(left) & set(right))
    if len(pairs) < 3:
        return {"pairs": len(pairs), "rho": None}
    rho = spearmanr([left[p] for p in pairs], [right[p] for p in pairs]).statistic
    return {"pairs": len(pairs), "rho": round(float(rho), 4)}


def kernel_times(db, sweep_name: str) -> dict:
    """(kernel, problem) -> median seconds of the run's successful rows."""
    return {(r["kernel"], r["problem"]): r["seconds"] for r in db.query(
        "select kernel, problem, seconds from runs where sweep = ? and status = 'ok'", [sweep_name])}


def contents(db, sweep_name: str) -> set:
    return {(r["kernel"], r["problem"], r["status"]) for r in db.query(
        "select kernel, problem, status from runs where sweep = ?", [sweep_name])}


def scaling_row(name: str, gpus: int, summary, base) -> dict:
    steady = steady_seconds(summary.breakdown)
    row = {"run": name, "gpus": gpus, "benchmark_s": round(summary.seconds, 2), "after_startup_s": round(steady, 2),
           "measured": summary.done, "statuses": dict(summary.statuses)}
    if base is not None:
        row["speedup"] = round(base[0] / summary.seconds, 3)
        row["efficiency"] = round(base[0] / summary.seconds / gpus, 3)
        row["speedup_after_startup"] = round(base[1] / steady, 3) if steady else None
    return row


def steady_seconds(breakdown) -> float:
    """The phase without its start-up: wall minus the slowest worker's start-up (they start together)."""
    startup = max((w.startup for w in breakdown.workers), default=0.0)
    return max(0.0, breakdown.wall - startup)


def breakdown_rows(name: str, breakdown) -> list[dict]:
    return [{"run": name, **{k: v for k, v in row.items() if k != "wall_s"}} for row in breakdown.rows()]


# --- Dask: a scheduler and workers as subprocesses ------------------------------------------------------------------
class DaskCluster:
    """``dask scheduler`` and ``dask worker`` subprocesses (run as modules of this interpreter, so no ``dask``
    command needs to be on the PATH); each worker sees only its own GPUs."""

    def __init__(self, workers: int, gpus_per_worker: int, folder: Path):
        self.processes = []
        scheduler_file = folder / "scheduler.json"
        environment = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(HERE.parent), *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]])}
        self.processes.append(subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_scheduler", "--scheduler-file", str(scheduler_file),
             "--port", "0", "--no-dashboard"],
            env=environment, stdout=subprocess.DEVNULL, stderr=open(folder / "scheduler.log", "w")))
        deadline = time.monotonic() + 60
        while not scheduler_file.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(0.5)  # written: let it finish
        self.address = json.loads(scheduler_file.read_text())["address"]
        for index in range(workers):
            gpus = ",".join(str(index * gpus_per_worker + g) for g in range(gpus_per_worker))
            self.processes.append(subprocess.Popen(
                [sys.executable, "-m", "distributed.cli.dask_worker", self.address, "--name", f"host{index}",
                 "--nworkers", "1",
                 "--nthreads", str(2 * gpus_per_worker), "--no-dashboard",
                 "--resources", f"GPU={gpus_per_worker},MEMORY_GB={3 * gpus_per_worker}"],
                env={**environment, "CUDA_VISIBLE_DEVICES": gpus}, stdout=subprocess.DEVNULL,
                stderr=open(folder / f"worker{index}.log", "w")))

    def close(self) -> None:
        """The workers first (they say goodbye to the scheduler), then the scheduler."""
        scheduler, workers = self.processes[0], self.processes[1:]
        for group in (workers, [scheduler]):
            for process in group:
                process.terminate()
            for process in group:
                try:
                    process.wait(20)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


def run_dask(args, space, problems, config, db_path: Path, folder: Path, base) -> dict:
    from distributed import Client

    from pycutlass.tune.distributed import DaskExecutor

    cluster = DaskCluster(args.dask_workers, args.dask_gpus_per_worker, folder)
    result = {"workers": args.dask_workers, "gpus_per_worker": args.dask_gpus_per_worker}
    try:
        client = Client(cluster.address)
        client.wait_for_workers(args.dask_workers, timeout=120)
        # --dask-compile: the client starts from an empty kernel cache, so every kernel is compiled by a worker (which
        # finds it in its own cache when that was filled beforehand) and stays there for placement
        session = Session(cache_path=str(folder / "client-cache.db")) if args.dask_compile else Session()
        sweep = Sweep(space, problems, db=db_path, name="dask", session=session)
        with DaskExecutor(client) as executor:
            if args.dask_compile:
                compiled = executor.compile(sweep, progress=False)
                result["compile"] = {"seconds": round(compiled.seconds, 2), "statuses": dict(compiled.statuses),
                                     "workers": dict(compiled.workers)}
            killed = []
            if args.dask_kill_after is not None:
                pids = client.run(os.getpid)
                victim = sorted(pids)[-1]

                def kill_later():
                    time.sleep(args.dask_kill_after)
                    os.kill(pids[victim], signal.SIGKILL)  # its nanny starts a fresh worker
                    killed.append(victim)

                threading.Thread(target=kill_later, daemon=True).start()
            summary = executor.benchmark(sweep, config=config, timeout=args.timeout, progress=False)
        client.close()
        result.update(benchmark_s=round(summary.seconds, 2), measured=summary.done, statuses=dict(summary.statuses),
                      placed=summary.placed, binaries_sent=summary.binaries_sent, resent=summary.resent,
                      killed=killed, breakdown=summary.breakdown.to_dict())
        gpus = args.dask_workers * args.dask_gpus_per_worker
        result["speedup"] = round(base[0] / summary.seconds, 3)
        result["efficiency"] = round(base[0] / summary.seconds / gpus, 3)
        result["breakdown_table"] = str(summary.breakdown)
    finally:
        cluster.close()
    return result


def main() -> None:
    args = parse_args()
    available = len(visible_gpus())
    if not available:
        raise SystemExit("no GPU visible: this benchmark times kernels (compile elsewhere with "
                         "`pycutlass sweep --compile-only --target 90 ...`)")
    counts = counts_of(args.gpus, available)
    rank_gpus = rank_gpus_of(args.rank_gpus, available)
    config = BenchConfig(repetitions=args.repetitions, max_seconds=args.max_seconds)
    folder = Path(tempfile.mkdtemp(prefix="pycutlass-multigpu-"))
    db_path = Path(args.db) if args.db else folder / "sweep.db"

    prepare, operations = None, None
    if args.bundle and args.dask:
        raise SystemExit("--dask runs kernels from the kernel cache (or compiles them with --dask-compile), not from a "
                         "bundle: drop one of --bundle and --dask")
    if args.bundle:
        from pycutlass.tune.bundle import Bundle, adopt_bundle

        bundle = Bundle.open(args.bundle)
        space = bundle.space()
        problems = [p for spec in args.problems for p in parse_problems(spec)] if args.problems else \
            list(bundle.problems())
        operations = bundle.operations()
        prepare = functools.partial(adopt_bundle, str(Path(args.bundle).resolve()))
        compile_row = {"what": "bundle", "kernels": len(operations), "compiled": 0, "seconds": 0.0}
    else:
        path = Path(args.space)
        space = SearchSpace.from_file(path) if path.suffix in (".toml", ".json", ".yaml", ".yml") else \
            SearchSpace.preset(args.space)
        problems = list(dict.fromkeys(p for spec in (args.problems or DEFAULT_PROBLEMS) for p in parse_problems(spec)))
        compiling = Sweep(space, problems, db=db_path, name="compile")
        compiled = compiling.compile(jobs=args.jobs, progress=False)
        operations = compiling.ready_operations()
        compile_row = {"what": "compile phase (separate from the benchmark)", "kernels": len(operations),
                       "compiled": compiled.compiled, "from_cache": compiled.from_cache,
                       "failed": sum(compiled.failed.values()), "seconds": round(compiled.seconds, 1)}
    print_table("kernels", [compile_row])

    def benchmark(name: str, devices: list[int]):
        sweep = Sweep(space, problems, db=db_path, name=name)
        summary = run_sweep(sweep, config=config, devices=devices, timeout=args.timeout, progress=False,
                            baseline=False, prepare_session=prepare, operations=operations)
        print(f"{name} on GPUs {devices}: {summary}", flush=True)
        return sweep.db, summary

    runs, scaling, breakdowns = {}, [], []
    db, alone = benchmark("gpu0", [0])
    base = (alone.seconds, steady_seconds(alone.breakdown))
    runs["gpu0"] = alone
    scaling.append(scaling_row("gpu0", 1, alone, base))
    for count in counts:
        if count == 1:
            continue
        name = f"gpus{count}"
        _, runs[name] = benchmark(name, list(range(count)))
        scaling.append(scaling_row(name, count, runs[name], base))
    for gpu in rank_gpus:
        _, runs[f"gpu{gpu}"] = benchmark(f"gpu{gpu}", [gpu])
    for name, summary in runs.items():
        breakdowns.extend(breakdown_rows(name, summary.breakdown))

    reference = kernel_times(db, "gpu0")
    agreement = []
    for name in runs:
        if name != "gpu0":
            agreement.append({"compared": f"gpu0 alone vs {name}", **spearman(reference, kernel_times(db, name))})
    same = {name: contents(db, name) == contents(db, "gpu0") for name in runs}

    dask = None
    if args.dask:
        needed = args.dask_workers * args.dask_gpus_per_worker
        if needed > available:
            raise SystemExit(f"--dask needs {needed} GPUs ({args.dask_workers} workers x {args.dask_gpus_per_worker});"
                             f" this host has {available}: pass --dask-gpus-per-worker 1")
        dask = run_dask(args, space, problems, config, db_path, folder, base)
        agreement.append({"compared": "gpu0 alone vs dask", **spearman(reference, kernel_times(db, "dask"))})
        dask["same_pairs_and_statuses_as_gpu0"] = contents(db, "dask") == contents(db, "gpu0")
        scaling.append({"run": "dask", "gpus": needed, "benchmark_s": dask["benchmark_s"],
                        "measured": dask["measured"], "statuses": dask["statuses"], "speedup": dask["speedup"],
                        "efficiency": dask["efficiency"]})

    print_table(f"benchmark phase: {len(operations)} kernels x {len(problems)} problems, {args.repetitions} "
                f"repetitions (speed-up over GPU 0 alone)", scaling)
    print_table("time per GPU worker (seconds)", breakdowns)
    print_table("rank agreement of kernel times (Spearman)", agreement)
    if dask is not None:
        print_table("Dask placement", [{k: dask.get(k) for k in ("placed", "binaries_sent", "resent", "killed",
                                                                 "same_pairs_and_statuses_as_gpu0")}])
        print(dask.pop("breakdown_table"))
    write_json(args.out, {
        "space": getattr(space, "name", str(args.space)), "kernels": len(operations), "problems": len(problems),
        "pairs": len(operations) * len(problems), "repetitions": args.repetitions, "compile": compile_row,
        "scaling": scaling, "breakdown": {name: s.breakdown.to_dict() for name, s in runs.items()},
        "spearman": agreement, "same_pairs_and_statuses_as_gpu0": same, "dask": dask,
        "goals": {"speedup_2": 1.85, "speedup_4": 3.5, "spearman": 0.95, "dask_2x2_speedup": 3.3}})


if __name__ == "__main__":
    main()
