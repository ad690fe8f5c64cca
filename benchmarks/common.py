"""Timing helpers shared by the benchmarks: medians of CUDA-event timings, tables, JSON."""
from __future__ import annotations

import json
import os
import platform
import statistics
import time
from pathlib import Path


def device_name() -> str:
    try:
        import torch

        return torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    except ImportError:
        return "no GPU"


def bench_ms(fn, warmup_ms: float = 50, rep_ms: float = 300) -> float:
    """Median milliseconds of ``fn`` on the GPU (triton's do_bench when present, else CUDA events)."""
    try:
        from triton.testing import do_bench

        return float(do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))
    except ImportError:
        import torch

        fn()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        once = max(start.elapsed_time(end), 1e-3)
        for _ in range(max(1, int(warmup_ms / once))):
            fn()
        times = []
        for _ in range(max(5, int(rep_ms / once))):
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return statistics.median(times)


def host_us(fn, repeats: int = 2000) -> float:
    """Median host-side microseconds per call, over batches (the GPU work is queued, not awaited)."""
    samples = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(repeats // 5):
            fn()
        samples.append((time.perf_counter() - start) * 1e6 / (repeats // 5))
    return statistics.median(samples)


def host_submit_us(fn, calls: int = 64, batches: int = 40) -> float:
    """Median host microseconds per call of ``fn``, over short batches that each start on an idle GPU.

    ``host_us`` queues thousands of calls: once the GPU's queue is full the host waits for kernels to finish, so a
    kernel that runs longer on the GPU than its launch costs on the host is timed by its GPU time. Here the device is
    synchronized before each batch (outside the timed region) and a batch is short enough never to fill the queue,
    so the number is what the calls cost the host."""
    import torch

    samples = []
    for _ in range(batches):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - start) * 1e6 / calls)
    torch.cuda.synchronize()
    return statistics.median(samples)


def print_table(title: str, rows: list[dict]) -> None:
    print(f"\n## {title}")
    try:
        from tabulate import tabulate  # the bench extra; imported here so the helpers above load without it
    except ImportError:  # a GPU host without it: plain columns
        keys = list(dict.fromkeys(k for row in rows for k in row))
        cells = [keys] + [[str(row.get(k, "")) for k in keys] for row in rows]
        widths = [max(len(line[i]) for line in cells) for i in range(len(keys))]
        for line in cells:
            print("| " + " | ".join(c.ljust(w) for c, w in zip(line, widths)) + " |")
        return
    print(tabulate(rows, headers="keys", tablefmt="github", floatfmt=".3g"))


def write_json(path: str | os.PathLike, payload: dict) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"device": device_name(), "host": platform.node(), "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
               **payload}
    path.write_text(json.dumps(payload, indent=2))
    print(f"\nwrote {path}")


def compile_only(operations, target=None, jobs=None) -> None:
    """A benchmark's ``--compile-only``: compile its operations into the kernel cache on any host (``target`` 90 for
    a Hopper elsewhere), so that the GPU host only loads them."""
    import pycutlass
    from pycutlass.compiler.manager import Compiler

    session = pycutlass.Session(target=target) if target else pycutlass.Session()
    Compiler.of(session).add_module(operations, jobs=jobs)
    print(f"compiled {len(operations)} operations")
