"""Does the sweep harness measure the kernel? Its median against two independent measures of the same kernel.

    python benchmarks/agreement.py [--out benchmarks/results/agreement-h200.json] [--rounds 5]   # GPU host
    python benchmarks/tune_trust.py --agreement                                       # the same, from tune_trust
    python benchmarks/agreement.py --compile-only --target 90                         # CPU: compile its kernels

For pairs (kernel, problem) over 16x4096x4096, 64x14336x4096, 1024^3, 1000x3000x520 and 4096^3 in f16 and bf16, a
pycutlass SM90 kernel and the torch baseline (cuBLAS) are each timed three ways:

- harness: ``measure_gemm`` / ``measure_torch`` with the default ``BenchConfig`` (what ``pycutlass sweep`` records:
  L2 flushed by a read, a GPU-side lead, the launch timer (CUPTI timestamps from the end of the lead to the end of
  the call's last kernel), median of 50); the same with ``timer="kernel"`` (from the start of the call's first
  kernel, "kernel") and ``timer="events"`` (CUDA events around the call, "events") is reported beside it;
- graph: a CUDA graph of 20 x (L2 flush, launch) and a graph of the 20 flushes alone, replayed in alternation; the
  median difference of a replay pair over 20: launches back to back with no host in between, L2 as cold as the
  harness's (a graph without the flushes is reported too: "warm", the inputs left in L2 by the previous launch). A
  replay's period per launch is the kernel plus the gap between two graph kernels; "launch_gap" is that period for
  an empty kernel (``torch.cuda._sleep(0)``), measured once per run on a graph of 200 of them, and "graph_net" the
  graph figure less it;
- ncu: Nsight Compute's ``gpu__time_duration.sum`` of every kernel the call launches (``--clock-control none``:
  clocks as the harness sees them; ``sm__cycles_elapsed.avg.per_second`` beside it, "ncu_mhz"), in a child
  process, twice: "ncu" with ``--cache-control all`` (every cache, instruction and constant caches included, flushed
  before each kernel) and "ncu_matched" with ``--cache-control none`` and the harness's own L2 flush (a read of twice
  the L2) before each call, so the caches are in the state the harness times.

The harness and the graph are measured in ``--rounds`` rounds over all pairs (the order reversed every other round,
so no pair always follows the same one); each figure is the median over the rounds, and every round's harness
figure is judged too. Each graph is replayed after the GPU rested as the harness rests it when its leads show a
lowered SM clock; "notes" keeps what the harness said of a measurement (the clock it still ran below full speed at).

Goal: the harness within 3% of the graph and of ncu for every pair. "within_3%" judges the harness against the
measures taken in the harness's cache state, the graph and ncu_matched; "within_3%_raw" against the graph and ncu
with every cache flushed; "rounds_within" counts the rounds whose own harness figure is within 3% of both;
"kernel_within_3%" judges the kernel timer as "within_3%" does.
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
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

SHAPES = [(16, 4096, 4096), (64, 14336, 4096), (1024, 1024, 1024), (1000, 3000, 520), (4096, 4096, 4096)]
DTYPES = {"f16_f32acc": "float16", "bf16": "bfloat16"}
# One SM90 configuration per shape size: what the ranking puts first for such shapes (all TN, K tile 64).
CONFIGS = {"small": ([64, 128, 64], [2, 1, 1], "TmaWarpSpecializedPingpong"),
           "medium": ([128, 128, 64], [2, 1, 1], "TmaWarpSpecializedPingpong"),
           "large": ([128, 256, 64], [2, 1, 1], "TmaWarpSpecializedCooperative")}
GRAPH_LAUNCHES, GRAPH_REPLAYS, NCU_CALLS, ROUNDS = 20, 15, 10, 5
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
        for who, measurement in (("pycutlass", kernel), ("torch", baseline)):
            if measurement.message:  # e.g. the SM clock below full speed
                found.setdefault(who + "_notes", []).append(f"{timer or 'default'}: {measurement.message}")
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

    flushes, calls = capture(True), capture(True, launch)
    cold = _replay_difference_ms(calls, flushes) / GRAPH_LAUNCHES * 1e3
    warm = _replay_ms(capture(False, launch)) / GRAPH_LAUNCHES * 1e3
    return cold, warm


def _time_replay_ms(graph) -> float:
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(100_000)  # the replay call's host cost stays outside the interval
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def _replay_ms(graph) -> float:
    """Median milliseconds of one replay of ``graph`` (GRAPH_REPLAYS of them, each after a GPU-side lead)."""
    import torch

    graph.replay()
    torch.cuda.synchronize()
    return statistics.median(_time_replay_ms(graph) for _ in range(GRAPH_REPLAYS))


def _replay_difference_ms(graph, baseline) -> float:
    """Median of (replay of ``graph`` - replay of ``baseline``) over GRAPH_REPLAYS pairs taken in alternation, the
    order swapped every other pair: a drift of the clocks over the measurement falls on both alike."""
    import torch

    graph.replay()
    baseline.replay()
    torch.cuda.synchronize()
    differences = []
    for i in range(GRAPH_REPLAYS):
        order = (graph, baseline) if i % 2 == 0 else (baseline, graph)
        took = {id(replayed): _time_replay_ms(replayed) for replayed in order}
        differences.append(took[id(graph)] - took[id(baseline)])
    return statistics.median(differences)


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


# The two ncu runs (see the module's docstring): the child's mode and ncu's cache control
NCU_MODES = {"ncu_us": ("kernels", "all"), "ncu_matched_us": ("flushed", "none")}
NCU_CLOCK = "sm__cycles_elapsed.avg.per_second"  # the SM clock while the kernel ran (read in the "kernels" run)


def ncu_child(spec_path: str, mode: str = "kernels") -> None:
    """Under ncu: each series = a marker kernel, then NCU_CALLS calls; only this part is profiled. ``mode``:
    "kernels" the calls alone; "flushed" each call after the harness's L2 flush (a read of twice the L2)."""
    import torch

    series = json.loads(Path(spec_path).read_text())
    launches = [_series(entry["pair"], entry["who"])[0] for entry in series]
    flush = _harness_flush() if mode == "flushed" else None
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
# a rate's unit "cycle/<time>" or "<prefix>hz", to MHz
_RATE_UNITS = {"cycle/nsecond": 1e3, "cycle/usecond": 1.0, "cycle/msecond": 1e-3, "cycle/second": 1e-6,
               "ghz": 1e3, "mhz": 1.0, "khz": 1e-3, "hz": 1e-6}


def parse_ncu_csv(text: str, series: int, calls: int = NCU_CALLS, flushed: bool = False,
                  metric: str = "gpu__time_duration.sum") -> list[float | None]:
    """Per series from ncu's CSV (``--csv --metrics gpu__time_duration.sum``): rows in launch order, a marker kernel
    (``spin_kernel``) before each series. For the duration, microseconds per call: the sum of the kernels the calls
    launched, over ``calls``; for a rate (``metric`` ending in ``per_second``), its mean over
    them in MHz. ``flushed``: every call came after an L2 flush, and one flush ran before the first marker; the
    kernels of that one name the flush's kernels, whose rows are left out everywhere."""
    start = text.find('"ID"')
    if start < 0:
        raise ValueError("no CSV table in ncu's output")
    rate = metric.endswith("per_second")
    groups: list[list[float]] = []
    flush_names: set[str] = set()
    for row in csv.DictReader(io.StringIO(text[start:])):
        if row.get("Metric Name") != metric:
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
        unit = row.get("Metric Unit", "cycle/nsecond" if rate else "nsecond").lower()
        groups[-1].append(value * (_RATE_UNITS.get(unit, 1.0) if rate else _UNITS.get(unit, 1e-3)))
    if flushed and not flush_names:
        raise ValueError("no flush kernels before the first marker: cannot tell them from the measured ones")
    if rate:
        found = [sum(group) / len(group) if group else None for group in groups]
    else:
        found = [sum(group) / calls if group else None for group in groups]
    return (found + [None] * series)[:series]


def ncu_us(entries: list[dict], column: str = "ncu_us", log_dir: str | None = None) \
        -> tuple[list[float | None], list[float | None], str]:
    """ncu's time per call of each entry, measured as ``column`` names (NCU_MODES), the SM clock (MHz) of the
    "kernels" run, and a note on what failed. ``log_dir``: keep ncu's CSV there."""
    mode, cache = NCU_MODES[column]
    missing = [None] * len(entries)
    ncu = ncu_path()
    if ncu is None:
        return missing, missing, "ncu not found"
    with tempfile.TemporaryDirectory() as folder:
        spec = Path(folder) / "series.json"
        spec.write_text(json.dumps(entries))
        log = Path(folder) / "ncu.csv"
        metrics = "gpu__time_duration.sum" + (f",{NCU_CLOCK}" if mode == "kernels" else "")
        command = [ncu, "--csv", "--metrics", metrics, "--cache-control", cache, "--clock-control", "none",
                   "--profile-from-start", "off", "--log-file", str(log)]
        command += [sys.executable, os.path.abspath(__file__), "--ncu-child", str(spec), "--ncu-mode", mode]
        done = subprocess.run(command, capture_output=True, text=True, timeout=900)
        text = log.read_text() if log.exists() else ""
        if log_dir:
            Path(log_dir).mkdir(parents=True, exist_ok=True)
            (Path(log_dir) / f"{column[:-3]}.csv").write_text(text + "\n" + done.stdout[-4000:] + done.stderr[-4000:])
        if done.returncode or not text:
            why = (done.stderr or done.stdout or text)[-400:].strip().replace("\n", " ")
            return missing, missing, f"ncu failed: {why}"
        try:
            times = parse_ncu_csv(text, len(entries), flushed=mode != "kernels")
            clocks = parse_ncu_csv(text, len(entries), metric=NCU_CLOCK) if mode == "kernels" else missing
            return times, clocks, ""
        except ValueError as exc:
            return missing, missing, f"ncu output unreadable: {exc}"


# --- the table ----------------------------------------------------------------------------------------------------------
def _within(value, other) -> tuple[float | None, bool | None]:
    ratio = value / other if value and other else None
    return (None, None) if ratio is None else (round(ratio, 4), abs(ratio - 1) <= AGREE)


def _agrees(value, row: dict, names) -> bool:
    """``value`` within 3% of every reference in ``names`` that ``row`` has, and at least one has it."""
    verdicts = [ok for ok in (_within(value, row.get(name))[1] for name in names) if ok is not None]
    return bool(verdicts) and all(verdicts)


VERDICTS = {"within_3%": ("graph_us", "ncu_matched_us"), "within_3%_raw": ("graph_us", "ncu_us")}


def agreement_rows(measured: list[dict]) -> list[dict]:
    """Rows with the ratios and the verdicts from ``measured`` = [{who, dtype, shape, kernel, harness_us,
    harness_rounds, kernel_us, graph_us, launch_gap_us, ncu_us, ncu_matched_us, ...}]; a verdict
    with no reference to judge by is False."""
    rows = []
    for entry in measured:
        row = dict(entry)
        if entry.get("graph_us") is not None and entry.get("launch_gap_us") is not None:
            row["graph_net_us"] = entry["graph_us"] - entry["launch_gap_us"]
        # the harness's default timer ("launch"), and the "kernel" timer (from the first kernel's start) judged alike
        for timed, prefix in (("harness_us", ""), ("kernel_us", "kernel_")):
            value = entry.get(timed)
            if timed != "harness_us" and value is None:
                continue
            for verdict, names in VERDICTS.items():
                for name in names:
                    row[f"{timed[:-3]}/{name[:-3]}"] = _within(value, row.get(name))[0]
                row[prefix + verdict] = _agrees(value, row, names)
        rounds = entry.get("harness_rounds") or []
        if rounds:
            row["rounds_verdicts"] = [_agrees(value, row, VERDICTS["within_3%"]) for value in rounds]
            row["rounds_within"] = f"{sum(row['rounds_verdicts'])}/{len(rounds)}"
            present = [value for value in rounds if value]
            row["harness_spread"] = round(max(present) / min(present), 4) if present else None
        for name, value in list(row.items()):
            if name.endswith("_us") and isinstance(value, float):
                row[name] = round(value, 2)
            elif name.endswith("_rounds") and isinstance(value, list):
                row[name] = [None if v is None else round(v, 2) for v in value]
        rows.append(row)
    return rows


def _median(values: list) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def measure_rounds(rounds: int) -> list[dict]:
    """The harness's and the graph's figures for every (pair, who), over ``rounds`` rounds of all pairs. Each graph
    is replayed after the GPU rested as the harness rests it (``SETTLE_IDLE_S``)."""
    from pycutlass.tune.bench import SETTLE_IDLE_S

    gap = launch_gap_us()
    print(f"  launch gap (graph period of an empty launch): {gap:.2f} us", flush=True)
    numbered = list(enumerate(pairs()))
    series: dict[tuple, dict] = {}
    for index, pair in numbered:
        for who in ("pycutlass", "torch"):
            kernel = operation_name(pair) if who == "pycutlass" else "torch.matmul"
            series[(index, who)] = {
                "who": who, "dtype": pair["dtype"], "shape": "x".join(map(str, pair["shape"])),
                "kernel": kernel.split("_tnt_")[-1], "launch_gap_us": gap, "pair": pair, "harness_rounds": [],
                "kernel_rounds": [], "events_rounds": [], "graph_rounds": [], "graph_warm_rounds": [], "notes": []}
    for round_index in range(rounds):
        for index, pair in numbered if round_index % 2 == 0 else numbered[::-1]:
            harness = harness_us(pair)
            for who in ("pycutlass", "torch"):
                entry = series[(index, who)]
                entry["harness_rounds"].append(harness[who])
                entry["kernel_rounds"].append(harness[who + "_kernel"])
                entry["events_rounds"].append(harness[who + "_events"])
                entry["notes"] += [f"round {round_index + 1} {note}" for note in harness.get(who + "_notes", [])]
                time.sleep(SETTLE_IDLE_S)  # rested as the harness rests a GPU whose clock it saw lowered
                cold, warm = graph_us(pair, who)
                entry["graph_rounds"].append(cold)
                entry["graph_warm_rounds"].append(warm)
            print(f"  round {round_index + 1}/{rounds} {'x'.join(map(str, pair['shape']))} {pair['dtype']}: "
                  f"harness {harness}", flush=True)
    measured = []
    for entry in series.values():
        for name in ("harness", "kernel", "events", "graph", "graph_warm"):
            entry[f"{name}_us"] = _median(entry[f"{name}_rounds"])
        measured.append(entry)
    return measured


def run(out_path: str | None = None, rounds: int = ROUNDS, ncu_logs: str | None = None) -> dict:
    from common import print_table, write_json

    measured = measure_rounds(rounds)
    ncu_entries = [{"pair": entry.pop("pair"), "who": entry["who"]} for entry in measured]
    notes = []
    for column in NCU_MODES:
        found, clocks, note = ncu_us(ncu_entries, column, log_dir=ncu_logs)
        for entry, value, mhz in zip(measured, found, clocks):
            entry[column] = value
            if column == "ncu_us":
                entry["ncu_mhz"] = mhz
        if note:
            notes.append(f"{column}: {note}")
    rows = agreement_rows(measured)
    counts = {verdict: sum(row.get(verdict, False) for row in rows)
              for verdict in ("within_3%", "within_3%_raw", "kernel_within_3%", "kernel_within_3%_raw")}
    per_round = [sum(row["rounds_verdicts"][i] for row in rows) for i in range(rounds)]
    result = {"rows": rows, "launch_gap_us": rows[0]["launch_gap_us"] if rows else None, **counts,
              "rounds": rounds, "within_3%_per_round": per_round, "pairs": len(rows), "ncu_note": "; ".join(notes),
              "goal": "every pair within 3% of graph and ncu", "goal_met": counts["within_3%"] == len(rows)}
    shown = ["who", "dtype", "shape", "harness_us", "kernel_us", "events_us", "graph_us", "ncu_matched_us", "ncu_us",
             "harness/graph", "harness/ncu_matched", "harness/ncu", "within_3%", "within_3%_raw", "rounds_within",
             "harness_spread", "ncu_mhz"]
    print_table(f"agreement over {rounds} rounds: harness vs CUDA-graph replay (L2 flushed) vs ncu; "
                f"{counts['within_3%']}/{len(rows)} within 3% in the harness's cache state (each round: {per_round}), "
                f"{counts['within_3%_raw']}/{len(rows)} of ncu with every cache flushed; timer='kernel': "
                f"{counts['kernel_within_3%']}/{len(rows)}" + (f" ({result['ncu_note']})" if notes else ""),
                [{name: row.get(name) for name in shown} for row in rows])
    if out_path:
        write_json(out_path, {"agreement": result})
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None)
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="rounds over all pairs (default %(default)s)")
    parser.add_argument("--ncu-logs", default=None, help="a folder to keep ncu's CSV output in")
    parser.add_argument("--compile-only", action="store_true")
    parser.add_argument("--target", default=90)
    parser.add_argument("--jobs", type=int, default=None)
    parser.add_argument("--ncu-child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--ncu-mode", default="kernels", choices=sorted({m for m, _ in NCU_MODES.values()}),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.ncu_child:
        ncu_child(args.ncu_child, args.ncu_mode)
        return
    if args.compile_only:
        from pycutlass.compiler.manager import Compiler
        from pycutlass.session import current

        report = Compiler.of(current()).add_module(operations(), target=args.target, jobs=args.jobs)
        print(f"compiled {len(report.kernels)} operations")
        return
    run(args.out, args.rounds, args.ncu_logs)


if __name__ == "__main__":
    main()
