"""Does the sweep harness measure the kernel? Its median against two independent measures of the same kernel.

    python benchmarks/agreement.py [--out benchmarks/results/agreement-h200.json]     # GPU host
    python benchmarks/tune_trust.py --agreement                                       # the same, from tune_trust
    python benchmarks/agreement.py --compile-only --target 90                         # CPU: compile its kernels

For pairs (kernel, problem) over 16x4096x4096, 64x14336x4096, 1024^3, 1000x3000x520 and 4096^3 in f16 and bf16, a
pycutlass SM90 kernel and the torch baseline (cuBLAS) are each timed three ways:

- harness: ``measure_gemm`` / ``measure_torch`` with the default ``BenchConfig`` (what ``pycutlass sweep`` records:
  L2 flushed by a read, a GPU-side lead, the launch timer (CUPTI timestamps from the end of the lead to the end of
  the call's last kernel), median); the same with ``timer="kernel"`` (from the start of the call's first kernel,
  "kernel") and ``timer="events"`` (CUDA events around the call, "events") is reported beside it;
- graph: a CUDA graph of 20 x (L2 flush, launch) replayed, minus a graph of the 20 flushes alone, over 20: launches
  back to back with no host in between, L2 as cold as the harness's (a graph without the flushes is reported too:
  "warm", the inputs left in L2 by the previous launch). A replay's period per launch is the kernel plus the gap
  between two graph kernels; "launch_gap" is that period for an empty kernel (``torch.cuda._sleep(0)``), measured
  once per run on a graph of 200 of them, and "graph_net" the graph figure less it;
- ncu: Nsight Compute's ``gpu__time_duration.sum`` of every kernel the call launches (``--clock-control none``:
  clocks as the harness sees them), in a child process, twice: "ncu" with ``--cache-control all`` (every cache,
  instruction and constant caches included, flushed before each kernel) and "ncu_matched" with ``--cache-control
  none`` and the harness's own L2 flush (a read of twice the L2) before each call, so the caches are in the state the
  harness times.

Goal: harness within 3% of graph and of ncu for every pair. The table gives the verdict for the raw figures
("within_3%") and for the ones that measure what the harness measures, the kernel with the harness's cache state
("within_3%_matched": graph_net and ncu_matched), and the same for the kernel timer ("kernel_within_3%").
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

SHAPES = [(16, 4096, 4096), (64, 14336, 4096), (1024, 1024, 1024), (1000, 3000, 520), (4096, 4096, 4096)]
DTYPES = {"f16_f32acc": "float16", "bf16": "bfloat16"}
# One SM90 configuration per shape size: what the ranking puts first for such shapes (all TN, K tile 64).
CONFIGS = {"small": ([64, 128, 64], [2, 1, 1], "TmaWarpSpecializedPingpong"),
           "medium": ([128, 128, 64], [2, 1, 1], "TmaWarpSpecializedPingpong"),
           "large": ([128, 256, 64], [2, 1, 1], "TmaWarpSpecializedCooperative")}
GRAPH_LAUNCHES, GRAPH_REPLAYS, NCU_CALLS = 20, 15, 10
AGREE = 0.03
MARKER_CYCLES = 1000  # torch.cuda._sleep: a tiny kernel ("spin_kernel") that separates the series in ncu's output


def config_for(shape) -> str:
    m, n, k = shape
    return "large" if m * n >= 4096 * 4096 else "medium" if m >= 1000 else "small"


def params_for(dtype: str, config: str) -> dict:
    tile, cluster, schedule = CONFIGS[config]
    return {"kind": "gemm", "compute_capability": 90, "dtypes": dtype, "layouts": "rcr", "threadblock_shape": tile,
            "cluster_shape": cluster, "kernel_schedule": schedule}


def pairs() -> list[dict]:
    return [{"shape": list(shape), "dtype": dtype, "params": params_for(dtype, config_for(shape))}
            for shape in SHAPES for dtype in DTYPES]


def operation_name(pair: dict) -> str:
    from pycutlass.tune.space import build_operation

    return build_operation(pair["params"]).name


def operations() -> list:
    from pycutlass.tune.space import build_operation

    return list({op.name: op for op in (build_operation(p["params"]) for p in pairs())}.values())


# --- one series: a launch function for a pycutlass kernel or torch, on fixed inputs -----------------------------------
def _series(pair: dict, who: str, stream=None):
    """(launch(), name) for ``who`` = "pycutlass" or "torch" on the pair's problem, inputs random normal."""
    import torch

    from pycutlass import GemmArguments
    from pycutlass.tune.space import build_operation

    m, n, k = pair["shape"]
    dtype = getattr(torch, DTYPES[pair["dtype"]])
    generator = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(m, k, generator=generator, device="cuda").to(dtype)
    b = torch.randn(n, k, generator=generator, device="cuda").to(dtype).t()
    d = torch.empty(m, n, device="cuda", dtype=dtype)
    if who == "torch":
        return (lambda: torch.matmul(a, b, out=d)), "torch.matmul"
    operation = build_operation(pair["params"])
    args = GemmArguments(operation, (m, n, k), a, b, None, d, output_op=operation.epilogue_type(1.0, 0.0),
                         stream=stream)
    operation.run(args)  # prepares the launch (Params built once) outside any capture or profile
    torch.cuda.synchronize()
    expected = a.double() @ b.double()
    error = ((d.double() - expected).norm() / expected.norm()).item()
    if not error <= 3e-2:
        raise RuntimeError(f"{operation.name} on {m}x{n}x{k}: relative error {error:.2e}")
    return (lambda: operation.run(args)), operation.name


# --- (a) the harness ------------------------------------------------------------------------------------------------
def harness_us(pair: dict) -> dict:
    from pycutlass.tune.bench import BenchConfig, GemmBench, measure_gemm, measure_torch
    from pycutlass.tune.problems import GemmProblem
    from pycutlass.tune.space import build_operation

    problem = GemmProblem(*pair["shape"])
    label = DTYPES[pair["dtype"]]
    found = {}
    for timer, suffix in ((None, ""), ("kernel", "_kernel"), ("events", "_events")):
        bench = GemmBench(BenchConfig(timer=timer))
        kernel, _ = measure_gemm(bench, build_operation(pair["params"]), problem)
        baseline = measure_torch(bench, problem, label, c_label=label)
        found["pycutlass" + suffix] = kernel.seconds * 1e6 if kernel.status == "ok" else None
        found["torch" + suffix] = baseline.seconds * 1e6 if baseline.status == "ok" else None
    return found


def _harness_flush():
    """The harness's own L2 eviction (``GemmBench.flush_l2``: a read of twice the L2), as a call."""
    from pycutlass.tune.bench import BenchConfig, GemmBench

    return GemmBench(BenchConfig()).flush_l2


# --- (b) CUDA-graph replay --------------------------------------------------------------------------------------------
def graph_us(pair: dict, who: str) -> tuple[float, float]:
    """(cold, warm) microseconds per launch from CUDA-graph replays (see the module's docstring)."""
    import torch

    stream = torch.cuda.Stream()
    launch, _ = _series(pair, who, stream=stream.cuda_stream if who == "pycutlass" else None)
    flush = _harness_flush()

    def capture(with_flush: bool, call=None):
        graph = torch.cuda.CUDAGraph()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):  # warm the launch path on the capture stream
                if call:
                    call()
            torch.cuda.synchronize()
            with torch.cuda.graph(graph, stream=stream):
                for _ in range(GRAPH_LAUNCHES):
                    if with_flush:
                        flush()
                    if call:
                        call()
        return graph

    flushes = _replay_ms(capture(True))
    cold = (_replay_ms(capture(True, launch)) - flushes) / GRAPH_LAUNCHES * 1e3
    warm = _replay_ms(capture(False, launch)) / GRAPH_LAUNCHES * 1e3
    return cold, warm


def _replay_ms(graph) -> float:
    """Median milliseconds of one replay of ``graph`` (GRAPH_REPLAYS of them, each after a GPU-side lead)."""
    import torch

    graph.replay()
    torch.cuda.synchronize()
    samples = []
    for _ in range(GRAPH_REPLAYS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(100_000)  # the replay call's host cost stays outside the interval
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end))
    return statistics.median(samples)


GAP_LAUNCHES = 200


def launch_gap_us() -> float:
    """The period of a graph launch that does nothing (``torch.cuda._sleep(0)``), microseconds: what a graph
    replay's per-launch figure adds to a kernel's own time (the gap between two graph kernels, and an empty
    kernel's own start and end). Measured once per run, on a graph of GAP_LAUNCHES of them."""
    import torch

    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        torch.cuda._sleep(0)
        torch.cuda.synchronize()
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(GAP_LAUNCHES):
                torch.cuda._sleep(0)
    return _replay_ms(graph) / GAP_LAUNCHES * 1e3



# --- (c) ncu -------------------------------------------------------------------------------------------------------------
def ncu_path() -> str | None:
    found = shutil.which("ncu")
    if found:
        return found
    for candidate in ("/usr/local/cuda/bin/ncu", "/opt/nvidia/nsight-compute/ncu"):
        if os.path.exists(candidate):
            return candidate
    return None


def ncu_child(spec_path: str, flush_l2: bool = False) -> None:
    """Under ncu: each series = a marker kernel, then NCU_CALLS calls (with ``flush_l2``: each after the harness's
    L2 flush, a read of twice the L2); only this part is profiled."""
    import torch

    series = json.loads(Path(spec_path).read_text())
    launches = [_series(entry["pair"], entry["who"])[0] for entry in series]
    flush = _harness_flush() if flush_l2 else None
    for launch in launches:
        launch()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    if flush:
        flush()  # before the first marker: names the flush's own kernels (a cast, a reduction)
    for launch in launches:
        torch.cuda._sleep(MARKER_CYCLES)
        for _ in range(NCU_CALLS):
            if flush:
                flush()
            launch()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


_UNITS = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6}


def parse_ncu_csv(text: str, series: int, calls: int = NCU_CALLS, flushed: bool = False) -> list[float | None]:
    """Microseconds per call of each series from ncu's CSV (``--csv --metrics gpu__time_duration.sum``): rows
    in launch order, a marker kernel (``spin_kernel``) before each series; a call's time is the sum of the kernels
    it launched. ``flushed``: every call came after an L2 flush, and one flush ran before the first marker; the
    kernels of that one name the flush's kernels, whose rows are left out everywhere."""
    start = text.find('"ID"')
    if start < 0:
        raise ValueError("no CSV table in ncu's output")
    groups: list[list[float]] = []
    flush_names: set[str] = set()
    for row in csv.DictReader(io.StringIO(text[start:])):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        name = row.get("Kernel Name", "")
        if any(word in name for word in ("spin_kernel", "sleep")):
            groups.append([])
            continue
        if not groups:
            if flushed:
                flush_names.add(name)
            continue  # kernels before the first marker: only the naming flush is expected there
        if name in flush_names:
            continue
        value = float(row["Metric Value"].replace(",", ""))
        groups[-1].append(value * _UNITS.get(row.get("Metric Unit", "nsecond"), 1e-3))
    if flushed and not flush_names:
        raise ValueError("no flush kernels before the first marker: cannot tell them from the measured ones")
    found = [sum(group) / calls if group else None for group in groups]
    return (found + [None] * series)[:series]


def ncu_us(entries: list[dict], matched: bool = False) -> tuple[list[float | None], str]:
    """ncu's time per call of each entry: caches flushed by ncu (``matched=False``) or, ``matched``, left alone with
    the harness's L2 flush before each call."""
    ncu = ncu_path()
    if ncu is None:
        return [None] * len(entries), "ncu not found"
    with tempfile.TemporaryDirectory() as folder:
        spec = Path(folder) / "series.json"
        spec.write_text(json.dumps(entries))
        log = Path(folder) / "ncu.csv"
        command = [ncu, "--csv", "--metrics", "gpu__time_duration.sum", "--cache-control",
                   "none" if matched else "all", "--clock-control", "none", "--profile-from-start", "off",
                   "--log-file", str(log), sys.executable, os.path.abspath(__file__),
                   "--ncu-child-flushed" if matched else "--ncu-child", str(spec)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=900)
        text = log.read_text() if log.exists() else ""
        if done.returncode or not text:
            why = (done.stderr or done.stdout or text)[-400:].strip().replace("\n", " ")
            return [None] * len(entries), f"ncu failed: {why}"
        try:
            return parse_ncu_csv(text, len(entries), flushed=matched), ""
        except ValueError as exc:
            return [None] * len(entries), f"ncu output unreadable: {exc}"


# --- the table ----------------------------------------------------------------------------------------------------------
def agreement_rows(measured: list[dict]) -> list[dict]:
    """Rows with the ratios and the verdict from ``measured`` = [{who, dtype, shape, kernel, harness_us, graph_us,
    graph_warm_us, ncu_us}]."""
    rows = []
    for entry in measured:
        row = dict(entry)
        if entry.get("graph_us") is not None and entry.get("launch_gap_us") is not None:
            row["graph_net_us"] = entry["graph_us"] - entry["launch_gap_us"]
        # the harness's default timer ("launch"), and the "kernel" timer (from the first kernel's start) judged alike
        for timed, prefix in (("harness_us", ""), ("kernel_us", "kernel_")):
            measured_us = entry.get(timed)
            if timed != "harness_us" and measured_us is None:
                continue
            for verdict, names in (("within_3%", ("graph_us", "ncu_us")),
                                   ("within_3%_matched", ("graph_net_us", "ncu_matched_us"))):
                verdicts = []
                for name in names:
                    other = row.get(name)
                    ratio = measured_us / other if measured_us and other else None
                    row[f"{timed[:-3]}/{name[:-3]}"] = None if ratio is None else round(ratio, 4)
                    if ratio is not None:
                        verdicts.append(abs(ratio - 1) <= AGREE)
                row[prefix + verdict] = bool(verdicts) and all(verdicts)
        for name in ("harness_us", "kernel_us", "events_us", "graph_us", "graph_warm_us", "launch_gap_us",
                     "graph_net_us", "ncu_us", "ncu_matched_us"):
            if isinstance(row.get(name), float):
                row[name] = round(row[name], 2)
        rows.append(row)
    return rows


def run(out_path: str | None = None) -> dict:
    from common import print_table, write_json

    measured, ncu_entries = [], []
    gap = launch_gap_us()
    print(f"  launch gap (graph period of an empty launch): {gap:.2f} us", flush=True)
    for pair in pairs():
        harness = harness_us(pair)
        for who in ("pycutlass", "torch"):
            cold, warm = graph_us(pair, who)
            kernel = operation_name(pair) if who == "pycutlass" else "torch.matmul"
            measured.append({"who": who, "dtype": pair["dtype"], "shape": "x".join(map(str, pair["shape"])),
                             "kernel": kernel.split("_tnt_")[-1], "harness_us": harness[who],
                             "kernel_us": harness[who + "_kernel"], "events_us": harness[who + "_events"],
                             "graph_us": cold,
                             "graph_warm_us": warm, "launch_gap_us": gap})
            ncu_entries.append({"pair": pair, "who": who})
        print(f"  {measured[-2]['shape']} {pair['dtype']}: harness {harness}", flush=True)
    notes = []
    for column, matched in (("ncu_us", False), ("ncu_matched_us", True)):
        found, note = ncu_us(ncu_entries, matched=matched)
        for entry, value in zip(measured, found):
            entry[column] = value
        if note:
            notes.append(f"{column}: {note}")
    rows = agreement_rows(measured)
    within = sum(row["within_3%"] for row in rows)
    matched_within = sum(row["within_3%_matched"] for row in rows)
    kernel_within = sum(row.get("kernel_within_3%", False) for row in rows)
    kernel_matched = sum(row.get("kernel_within_3%_matched", False) for row in rows)
    result = {"rows": rows, "launch_gap_us": round(gap, 3), "within_3%": within,
              "within_3%_matched": matched_within, "kernel_within_3%": kernel_within,
              "kernel_within_3%_matched": kernel_matched, "pairs": len(rows),
              "ncu_note": "; ".join(notes),
              "goal": "every pair within 3% of graph and ncu", "goal_met": within == len(rows),
              "goal_met_matched": matched_within == len(rows)}
    print_table(f"agreement: harness vs CUDA-graph replay (L2 flushed) vs ncu; {within}/{len(rows)} within 3% of the "
                f"raw figures, {matched_within}/{len(rows)} of graph_net and ncu_matched; timer='kernel': "
                f"{kernel_within}/{len(rows)} and {kernel_matched}/{len(rows)}"
                + (f" ({result['ncu_note']})" if notes else ""), rows)
    if out_path:
        write_json(out_path, {"agreement": result})
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None)
    parser.add_argument("--compile-only", action="store_true")
    parser.add_argument("--target", default=90)
    parser.add_argument("--jobs", type=int, default=None)
    parser.add_argument("--ncu-child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--ncu-child-flushed", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.ncu_child or args.ncu_child_flushed:
        ncu_child(args.ncu_child or args.ncu_child_flushed, flush_l2=bool(args.ncu_child_flushed))
        return
    if args.compile_only:
        from pycutlass.compiler.manager import Compiler
        from pycutlass.session import current

        report = Compiler.of(current()).add_module(operations(), target=args.target, jobs=args.jobs)
        print(f"compiled {len(report.kernels)} operations")
        return
    run(args.out)


if __name__ == "__main__":
    main()
