"""The small-scale numbers behind docs/distributed.md's scaling plan (any machine, no GPU needed).

    python benchmarks/distributed_scaling.py [--out benchmarks/results/distributed_scaling.json]

Measures:
- the results-DB writer: committed run rows per second (one writer, WAL, one transaction per row as sweeps write);
- the Dask scheduler: round-trip throughput of trivial tasks on a local cluster of 2 worker processes;
- a compiled kernel's size (Sm80 f16 GEMM, NVRTC, sm_90), as transferred from compile workers to the client;
- one Sm80 compile through Dask vs in-process (the per-task overhead a compile pays).
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

import pycutlass as cutlass  # noqa: E402
from pycutlass.tune.db import ResultsDB  # noqa: E402


def db_writer(folder: Path, rows: int = 3000) -> dict:
    db = ResultsDB(folder / "writer.db")
    start = time.perf_counter()
    for i in range(rows):
        db.record_run(sweep="s", device="d", kernel=f"k{i % 300}", problem=f"p{i // 300}", harness="h", status="ok",
                      seconds=1e-4, flops=1e9)
    seconds = time.perf_counter() - start
    size = (folder / "writer.db").stat().st_size
    batch = [dict(sweep="s2", device="d", kernel=f"k{i % 300}", problem=f"p{i // 300}", harness="h", status="ok",
                  seconds=1e-4, flops=1e9) for i in range(rows)]
    start = time.perf_counter()
    for begin in range(0, rows, 300):  # a distributed task's rows: one transaction each
        db.record_runs(batch[begin:begin + 300])
    batched = time.perf_counter() - start
    db.close()
    return {"what": "results DB writer", "rows": rows, "rows_per_s": round(rows / seconds),
            "rows_per_s_batched_300": round(rows / batched), "bytes_per_row": round(size / rows)}


def noop(x):
    return x


def scheduler_throughput(tasks: int = 2000) -> dict:
    from distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None)
    with Client(cluster) as client:
        client.gather(client.map(noop, range(100), pure=False))  # warm up
        start = time.perf_counter()
        client.gather(client.map(noop, range(tasks), pure=False))
        seconds = time.perf_counter() - start
    cluster.close()
    return {"what": "Dask scheduler, trivial tasks (2 local workers)", "tasks": tasks,
            "tasks_per_s": round(tasks / seconds), "ms_per_task": round(seconds / tasks * 1e3, 3)}


def compile_costs(folder: Path) -> list[dict]:
    from pycutlass.tune.distributed import DaskExecutor, compile_task
    from pycutlass.tune.sweep import Sweep

    f16 = cutlass.float16
    math_inst = cutlass.MathInstruction([16, 8, 16], f16, f16, cutlass.float32, cutlass.OpClass.TensorOp,
                                        cutlass.MathOperation.multiply_add)
    a = cutlass.TensorDescription(f16, cutlass.RowMajor, 8)
    b = cutlass.TensorDescription(f16, cutlass.ColumnMajor, 8)

    def op(tile, stages):
        return cutlass.GemmOperationUniversal(80, cutlass.TileDescription(tile, stages, [2, 2, 1], math_inst), a, b,
                                              a, cutlass.LinearCombination(f16, 8, cutlass.float32, cutlass.float32))

    start = time.perf_counter()
    rows = compile_task([op([128, 128, 32], 3)], "sm_90", "nvrtc", str(folder / "inproc.db"))
    in_process = time.perf_counter() - start
    size = len(rows[0]["binary"])
    ops = [op([128, 128, 32], 4), op([64, 64, 32], 3), op([128, 64, 32], 3), op([64, 128, 32], 3)]
    sweep = Sweep(ops, db=folder / "r.db", session=cutlass.Session(target=90, backend="nvrtc",
                                                                     cache_path=str(folder / "client.db")))
    with DaskExecutor("local:2", worker_cache_path=str(folder / "workers.db")) as executor:
        summary = executor.compile(sweep, progress=False)
    return [{"what": "one Sm80 f16 GEMM compile, in process (NVRTC, 2-core machine)", "seconds": round(in_process, 2),
             "cubin_kb": round(size / 1024, 1)},
            {"what": "4 Sm80 compiles through Dask local:2", "seconds": round(summary.seconds, 2),
             "per_kernel_s": round(summary.seconds / len(ops), 2), "statuses": dict(summary.statuses)}]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" /
                                             "distributed_scaling.json"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        rows = [db_writer(folder), scheduler_throughput(), *compile_costs(folder)]
    for row in rows:
        print_table(row["what"], [row])
    write_json(args.out, {"machine": f"{os.cpu_count()} cores", "rows": rows})


if __name__ == "__main__":
    main()
