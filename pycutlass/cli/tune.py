"""``pycutlass sweep | tune | select | heatmap | bundle | db``: the tuning workflows from the command line."""
from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import click

from ..errors import PyCutlassError

# The tuning commands' own group: pycutlass.cli adds each of them to the ``pycutlass`` command (this module does not
# import the package's __init__, so the two do not import each other).
main = click.Group("pycutlass-tune", help="The tuning workflows.")

_db_option = click.option("--db", "db_path", required=True, type=click.Path(dir_okay=False, path_type=Path),
                          help="The results database (SQLite; created if missing).")


@contextlib.contextmanager
def _reported() -> Iterator[None]:
    """pycutlass errors as one-line messages, not tracebacks."""
    try:
        yield
    except PyCutlassError as exc:
        raise click.ClickException(f"{type(exc).__name__}: {exc}") from exc


def _require_gpu(command: str) -> None:
    """Benchmarking and tuning time kernels on a GPU: without one, fail before compiling anything."""
    from ..compiler.target import detected_compute_capability
    from ..errors import NoGpuError

    if detected_compute_capability(0) is None:
        raise NoGpuError(f"`pycutlass {command}` times kernels on a GPU and none is usable on this machine; nothing "
                         f"was compiled. Without a GPU, compile only: `pycutlass sweep --compile-only` (records "
                         f"what compiles) or `pycutlass bundle export --target N` (to run on another machine)")


def _space(value: str):
    from ..tune.space import SearchSpace

    path = Path(value)
    return SearchSpace.from_file(path) if path.suffix in (".toml", ".json", ".yaml", ".yml") else \
        SearchSpace.preset(value)


def _problems(specs: tuple[str, ...]):
    from ..tune.problems import parse_problems

    found = []
    for spec in specs:
        found.extend(parse_problems(spec))
    return list(dict.fromkeys(found))


_SETTLE_MS = 300.0  # BenchConfig's default (DEFAULT_SETTLE_MS), without importing the harness to build the CLI


def _bench_config(repetitions, cuda_graph, arg_pool, verify, max_seconds, timer="launch", settle_ms=_SETTLE_MS):
    from ..tune.bench import BenchConfig

    return BenchConfig(repetitions=repetitions, cuda_graph=cuda_graph, arg_pool=arg_pool, verify=verify,
                       max_seconds=max_seconds, timer=timer, settle_ms=settle_ms)


_harness_options = [
    click.option("--repetitions", default=50, show_default=True, help="Timed repetitions per (kernel, problem)."),
    click.option("--cuda-graph", default=0, show_default=True, help="Launches per captured CUDA graph (0: none)."),
    click.option("--arg-pool", default=1, show_default=True, help="Argument sets cycled (> 1: pool beyond L2)."),
    click.option("--verify/--no-verify", default=True, show_default=True, help="Check each kernel once first."),
    click.option("--max-seconds", default=2.0, show_default=True, help="Time budget per (kernel, problem)."),
    click.option("--timer", type=click.Choice(["launch", "kernel", "events"]), default="launch", show_default=True,
                 help="launch: GPU timestamps from CUPTI, from the end of the lead (the GPU's launch of the call "
                      "counts); kernel: the same from the first kernel's start; events: CUDA events around each call "
                      "(under ncu/nsys)."),
    click.option("--settle-ms", type=click.FloatRange(0, 10_000), default=_SETTLE_MS, show_default=True,
                 help="When the leads show the samples ran below 97% of full SM clock (a GPU at its power limit "
                      "after heavy work), rest the GPU and time again within this many milliseconds; 0: never."),
]


def _with_harness(function):
    for option in reversed(_harness_options):
        function = option(function)
    return function


@main.command()
@click.option("--space", help="A preset name (sm80-f16, sm90-f16, ...) or a .toml/.json/.yaml space file.")
@click.option("--problems", "problem_specs", multiple=True,
              help="Problem set, e.g. square:256:4096:256, model:llama-3-8b:tp=1:batch=1,16,128 (repeatable).")
@_db_option
@click.option("--name", default=None, help="Sweep name (default: from the space's fingerprint).")
@click.option("--compile-only", is_flag=True, help="Compile and record compile status; no GPU needed.")
@click.option("--jobs", type=click.IntRange(min=1), default=None,
              help="Parallel compile processes (default: by cores and memory).")
@click.option("--target", default=None, help="Compile for this GPU (e.g. 90) instead of the local one.")
@click.option("--bundle", "bundle_path", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Run a bundle's precompiled kernels (from `pycutlass bundle export`); nothing compiles.")
@click.option("--gpus", "--devices", "devices", default=None,
              help="GPU ordinals, e.g. 0,1, or all (default): one pinned benchmark worker per GPU.")
@click.option("--scheduler", default=None,
              help="Run through Dask: local:N (a local cluster: N compile workers and one benchmark worker for this "
                   "host's GPUs) or a scheduler address tcp://host:8786.")
@click.option("--timeout", default=120.0, show_default=True, help="Seconds per measurement before the worker is killed.")
@click.option("--no-baseline", is_flag=True, help="Skip the torch (cuBLAS) baseline rows.")
@click.option("--top-k", "top_k", type=click.IntRange(min=1), default=None,
              help="Keep each problem's K best-ranked configurations (their union) plus those already compiled; "
                   "default: every configuration.")
@click.option("--breakdown", is_flag=True,
              help="After benchmarking, print where the time went per GPU worker (start-up, inputs, reference, "
                   "timing, idle, tail, ...).")
@_with_harness
def sweep(space, problem_specs, db_path, name, compile_only, jobs, target, bundle_path, devices, scheduler, timeout,
          no_baseline, top_k, breakdown, repetitions, cuda_graph, arg_pool, verify, max_seconds, timer, settle_ms):
    """Compile a search space and benchmark it over problems; results go to --db (resumable)."""
    from .. import Session
    from ..tune.db import ResultsDB
    from ..tune.sweep import Sweep

    with _reported():
        # Everything that can be wrong is checked before the results DB is opened (which creates it).
        try:
            ordinals = None if devices in (None, "all") else [int(d) for d in devices.split(",") if d.strip()]
        except ValueError:
            raise click.UsageError(f"--gpus takes 'all' or ordinals such as 0,1; got {devices!r}") from None
        config = _bench_config(repetitions, cuda_graph, arg_pool, verify, max_seconds, timer, settle_ms)
        if bundle_path:
            from ..tune.bundle import run_bundle

            _require_gpu("sweep")
            summary = run_bundle(bundle_path, ResultsDB(db_path), config=config, devices=ordinals, timeout=timeout,
                                 baseline=not no_baseline)
            click.echo(f"benchmark: {summary}")
            _echo_breakdown(summary, breakdown)
            return
        if not space:
            raise click.UsageError("--space is required (or --bundle)")
        if scheduler:
            from ..tune.distributed import parse_scheduler

            parse_scheduler(scheduler)
        session = Session(target=target) if target else Session()
        search_space, problems = _space(space), _problems(problem_specs)
        if not compile_only:
            if not problems:
                raise click.UsageError("--problems is required to benchmark (or pass --compile-only)")
            if not scheduler:
                _require_gpu("sweep")
        job = Sweep(search_space, problems, db=db_path, name=name, session=session, top_k=top_k)
        if scheduler:
            from ..tune.distributed import DaskExecutor

            with DaskExecutor(scheduler) as executor:
                click.echo(f"compile (dask): {executor.compile(job)}")
                if not compile_only:
                    summary = executor.benchmark(job, config=config, timeout=timeout, baseline=not no_baseline)
                    click.echo(f"benchmark (dask): {summary}")
                    _echo_breakdown(summary, breakdown)
            return
        click.echo(f"compile: {job.compile(jobs=jobs)}")
        if compile_only:
            return
        summary = job.benchmark(config=config, devices=ordinals, timeout=timeout, baseline=not no_baseline)
        click.echo(f"benchmark: {summary}")
        _echo_breakdown(summary, breakdown)


def _echo_breakdown(summary, wanted: bool) -> None:
    breakdown = getattr(summary, "breakdown", None)
    if wanted and breakdown is not None:
        click.echo(f"time per GPU worker (seconds):\n{breakdown}")


@main.command()
@click.option("--space", required=True, help="A preset name or a .toml/.json space file.")
@click.option("--problem", "problem_specs", required=True, multiple=True, help="Problem(s), e.g. gemm:4096x4096x4096.")
@_db_option
@click.option("--policy", type=click.Choice(["exact", "pow2"]), default="exact", show_default=True)
@click.option("--jobs", type=click.IntRange(min=1), default=None)
@click.option("--retune", is_flag=True, help="Ignore the tuning cache.")
@click.option("--top-k", "top_k", default="8", show_default=True,
              help="Compile and time each problem's K best-ranked configurations plus those already compiled; "
                   "'all' for every configuration.")
def tune(space, problem_specs, db_path, policy, jobs, retune, top_k):
    """Find the fastest kernel of a space for each problem (tuning cache in --db)."""
    from ..tune.autotune import autotune, candidates, check_problem_kind

    if top_k == "all":
        top_k = None
    else:
        try:
            top_k = int(top_k)
            if top_k < 1:
                raise ValueError
        except ValueError:
            raise click.BadParameter(f"give a positive integer or 'all', got {top_k!r}", param_hint="--top-k") \
                from None
    with _reported():
        problems = _problems(problem_specs)
        search_space = _space(space)
        operations, _ = candidates(search_space)  # a space the tuner refuses (no candidate, two classes) or a
        for problem in problems:  # problem its kind cannot compute is named before the GPU
            check_problem_kind(operations, problem)
        _require_gpu("tune")
        for problem in problems:
            result = autotune(search_space, problem, db=str(db_path), policy=policy, jobs=jobs, retune=retune,
                              top_k=top_k)
            source = "cache" if result.from_cache else f"tuned over {result.candidates}"
            click.echo(f"{problem.key}: {result.operation.name} {result.seconds * 1e6:.1f} us ({source})")


def _load_results(db_path: Path, sweep_name: str | None, *, with_params: bool = False):
    """(kernel name, problem object, seconds) rows from a results DB, each carrying its operation class
    (``Result.op_class``); with ``with_params`` also ``{kernel name: space parameters}``."""
    from ..tune.db import Result, ResultsDB
    from ..tune.problems import problem_from_dict

    with ResultsDB(db_path, read_only=True) as db:
        rows = db.results(sweep=sweep_name)
        specs = {row["key"]: json.loads(row["spec"]) for row in db.query("select key, spec from problems")}
        params = {row["name"]: json.loads(row["params"] or "{}")
                  for row in db.query("select name, params from kernels")} if with_params else None
    if not rows:
        raise click.ClickException(f"{db_path} has no successful runs{' for sweep ' + sweep_name if sweep_name else ''}")
    problems = {key: problem_from_dict(spec) for key, spec in specs.items()}
    results = [Result(row[0], problems[row[1]], row[2], row.op_class) for row in rows]
    return (results, params) if with_params else results


def _by_class(results) -> dict:
    from ..tune.select import split_classes

    return split_classes(results)


def _class_file(path: Path, op_class: str, several: bool) -> Path:
    from ..tune.plots import class_path

    return class_path(path, op_class) if several else path


def _report_selection(results, min_efficiency: float, indent: str = ""):
    """The exact and greedy selections of one operation class, printed."""
    from ..tune.select import greedy_select, select_kernels

    exact = select_kernels(results, min_efficiency)
    greedy = greedy_select(results, min_efficiency)
    click.echo(f"{indent}{len(exact.kernels)} kernels cover {len(exact.assignment)} problems at >= {min_efficiency} "
               f"(worst {exact.worst:.3f}, geomean {exact.geomean:.3f}; greedy needs {len(greedy.kernels)})")
    for kernel in exact.kernels:
        served = sum(1 for k in exact.assignment.values() if k == kernel)
        click.echo(f"{indent}  {kernel}  ({served} problems)")
    return exact, greedy


@main.command()
@_db_option
@click.option("--sweep", "sweep_name", default=None, help="Only this sweep's runs.")
@click.option("--min-efficiency", default=0.98, show_default=True, type=float)
@click.option("--pareto", "pareto_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also draw the set-size vs efficiency curve (.png/.svg).")
@click.option("--pareto-max-size", default=12, show_default=True,
              help="Largest set size on the Pareto curve (each size is a few exact integer programs).")
@click.option("--dispatch-json", type=click.Path(dir_okay=False, path_type=Path), default=None)
@click.option("--dispatch-py", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write a standalone Python dispatcher (by M, N, K).")
@click.option("--policy", type=click.Choice(["exact", "pow2"]), default="exact", show_default=True,
              help="The generated dispatcher's key policy.")
def select(db_path, sweep_name, min_efficiency, pareto_path, pareto_max_size, dispatch_json, dispatch_py, policy):
    """The minimum kernel set covering every problem within --min-efficiency of its best kernel.

    Kernels compete only within their operation class (types, layouts, alignments, epilogue): with several
    classes in the DB, each gets its own section, Pareto plot (PATH-<class>.png) and dispatch table."""
    from ..tune.select import generate_dispatch_python, pareto_curve, write_dispatch_table

    with _reported():
        classes = _by_class(_load_results(db_path, sweep_name))
        several = len(classes) > 1
        if several:
            click.echo(f"{len(classes)} operation classes; kernels compete only within their class")
        chosen = {}
        for op_class, results in classes.items():
            if several:
                click.echo(f"class {op_class}:")
            exact, greedy = _report_selection(results, min_efficiency, "  " if several else "")
            chosen[op_class] = exact
            if pareto_path:
                from ..tune.plots import pareto_plot

                kernels = len({kernel for kernel, _, _ in results})
                curve = pareto_curve(results, max_size=max(len(exact.kernels), min(pareto_max_size, kernels)))
                target = _class_file(pareto_path, op_class, several)
                pareto_plot(curve, target, greedy=greedy, title=op_class if several else None)
                click.echo(f"{'  ' if several else ''}wrote {target}")
        if dispatch_json:
            write_dispatch_table(chosen, dispatch_json, key_fn=lambda problem: problem.key)
            click.echo(f"wrote {dispatch_json}")
        if dispatch_py:
            dispatch_py.write_text(generate_dispatch_python(chosen, ("m", "n", "k"), policy=policy))
            click.echo(f"wrote {dispatch_py}" + (" (select_kernel(op_class, m, n, k))" if several else ""))


@main.command()
@_db_option
@click.argument("out", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--sweep", "sweep_name", default=None)
@click.option("--select", "min_efficiency", type=float, default=None,
              help="Mark the minimum kernel set at this efficiency (e.g. 0.98).")
@click.option("--max-kernels", type=int, default=40, show_default=True,
              help="Show at most this many kernels (selected first, then the best by geomean); one row sums up "
                   "the rest. 0: all.")
def heatmap(db_path, out, sweep_name, min_efficiency, max_kernels):
    """Kernels x problems, normalized per problem, as a PNG or SVG: one figure per operation class (OUT when the
    DB holds one class, OUT-<class>.png for each of several)."""
    from ..tune.plots import heatmap as draw

    with _reported():
        results, params = _load_results(db_path, sweep_name, with_params=True)
        classes = _by_class(results)
        for op_class, items in classes.items():
            selected = None
            if min_efficiency is not None:
                from ..tune.select import select_kernels

                selected = select_kernels(items, min_efficiency)
            target = _class_file(out, op_class, len(classes) > 1)
            draw(items, target, selected=selected, max_kernels=max_kernels or None, kernel_params=params)
            click.echo(f"wrote {target}" + (f" ({op_class})" if len(classes) > 1 else ""))


@main.group()
def bundle():
    """Compile here, run there: one portable file of compiled kernels."""


@bundle.command("export")
@click.option("--space", required=True)
@click.option("--problems", "problem_specs", multiple=True)
@click.option("--target", required=True, help="The GPU that will run it, e.g. 90.")
@click.option("--jobs", type=click.IntRange(min=1), default=None)
@click.option("--db", "db_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Results DB for the compile memo (default: beside the bundle).")
@click.argument("out", type=click.Path(dir_okay=False, path_type=Path))
def bundle_export(space, problem_specs, target, jobs, db_path, out):
    """Compile a sweep for --target (no GPU needed) and write it to OUT."""
    from .. import Session
    from ..tune.bundle import export_bundle
    from ..tune.sweep import Sweep

    with _reported():
        job = Sweep(_space(space), _problems(problem_specs), db=db_path or out.with_suffix(".compile.db"),
                    session=Session(target=target))
        path = export_bundle(job, out, target=target, jobs=jobs)
        click.echo(f"wrote {path}")


@bundle.command("info")
@click.argument("path", type=click.Path(exists=True, dir_okay=False))
def bundle_info(path):
    """Verify a bundle's hashes and describe it."""
    from ..tune.bundle import Bundle

    with _reported():
        opened = Bundle.open(path)
        m = opened.manifest
        click.echo(f"{path}: {len(m['kernels'])} kernels for {m['target']}, {len(m['problems'])} problems, sweep "
                   f"{m['sweep']!r}, pycutlass {m['pycutlass']}, created {m['created']}; hashes verified")


@main.group()
def db():
    """Results databases: merge, export, inspect."""


@db.command("merge")
@click.argument("dest", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("sources", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
def db_merge(dest, sources):
    """Copy the rows of SOURCES that DEST lacks (idempotent: merging twice adds nothing)."""
    from ..tune.db import ResultsDB

    with _reported(), ResultsDB(dest) as target:
        for source in sources:
            added = {k: v for k, v in target.merge(source).items() if v}
            click.echo(f"{source}: {sum(added.values())} rows added {added if added else ''}".rstrip())


@db.command("export")
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("table")
@click.argument("out", type=click.Path(dir_okay=False, path_type=Path))
def db_export(path, table, out):
    """Write one table as CSV or JSON (by OUT's suffix)."""
    from ..tune.db import ResultsDB

    with _reported(), ResultsDB(path, read_only=True) as source:
        click.echo(f"wrote {source.export(table, out)}")


@db.command("info")
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
def db_info(path):
    """Row counts per table, the sweeps recorded and, when there are several, the operation classes."""
    from ..tune.db import BASELINE_KIND, ResultsDB

    with _reported(), ResultsDB(path, read_only=True) as source:
        for table, count in source.counts().items():
            click.echo(f"{table:15} {count}")
        for row in source.query("select name, fingerprint from sweeps"):
            click.echo(f"sweep {row['name']}")
        baselines = {row["name"] for row in source.query("select name from kernels where kind = ?", [BASELINE_KIND])}
        classes: dict = {}
        for kernel, op_class in source.kernel_classes().items():
            if kernel not in baselines:
                classes[op_class] = classes.get(op_class, 0) + 1
        if len(classes) > 1:
            for op_class, count in classes.items():
                click.echo(f"class {op_class}: {count} kernels")


@db.command("correlate")
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--scatter", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also draw registers vs normalized time (.png/.svg).")
def db_correlate(path, scatter):
    """Which kernel resource predicts time (Spearman, per problem class)."""
    from ..tune.db import ResultsDB
    from ..tune.resources import correlation_report, resource_points

    with _reported(), ResultsDB(path, read_only=True) as source:
        points = resource_points(source)
    if not points:
        raise click.ClickException(f"{path} has no runs with recorded resources")
    for row in correlation_report(points):
        click.echo(f"{row['class']:8} {row['resource']:18} rho={row['spearman']:+.3f} (n={row['n']})")
    if scatter:
        from ..tune.plots import resource_scatter

        resource_scatter(points, scatter, x="registers", y="ratio")
        click.echo(f"wrote {scatter}")
