"""``pycutlass pack build | info | verify | wheel | list``: kernel packs from the command line (docs/packs.md)."""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

import click

from .tune import _bench_config, _problems, _reported, _require_gpu, _space, _with_harness

main = click.Group("pycutlass-pack", help="Kernel packs.")


@main.group()
def pack():
    """Kernel packs: selected kernels compiled once, dispatched with no compiler."""


@pack.command("build")
@click.option("--db", "db_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="A sweep's results database to select from (no GPU needed).")
@click.option("--space", default=None, help="Instead of --db: sweep this space first (GPU host).")
@click.option("--problems", "problem_specs", multiple=True,
              help="With --space: the problems, e.g. model:llama-3-8b:tp=1:batch=1,16,128 (repeatable).")
@click.option("--select", "min_efficiency", type=float, default=0.97, show_default=True,
              help="Each problem's kernel is within this fraction of the sweep's best for it.")
@click.option("--target", required=True, help="The GPU architecture the pack is for, e.g. 90.")
@click.option("--sweep", "sweep_name", default=None, help="Only this sweep's runs.")
@click.option("--device", default=None, help="The device id whose runs to use, when the DB holds several.")
@click.option("--jobs", type=click.IntRange(min=1), default=None, help="Parallel compile processes.")
@click.option("--top-k", "top_k", type=click.IntRange(min=1), default=None,
              help="With --space: compile and time only the union of each problem's K best-ranked configurations.")
@_with_harness
@click.argument("out", type=click.Path(dir_okay=False, path_type=Path))
def pack_build(db_path, space, problem_specs, min_efficiency, target, sweep_name, device, jobs, top_k, repetitions,
               cuda_graph, arg_pool, verify, max_seconds, timer, settle_ms, out):
    """Select, compile (for --target) and write a pack to OUT, from --db or by sweeping --space first."""
    from ..pack import build_pack

    with _reported():
        if (db_path is None) == (space is None):
            raise click.UsageError("give either --db (select from a sweep's results) or --space with --problems "
                                   "(sweep, then select)")
        if space is not None:
            if not problem_specs:
                raise click.UsageError("--space needs --problems")
            _require_gpu("pack build --space")
            db_path = _sweep_into(space, problem_specs, db_path, jobs, top_k,
                                  _bench_config(repetitions, cuda_graph, arg_pool, verify, max_seconds, timer,
                                                settle_ms))
        path = build_pack(db_path, out, target=target, min_efficiency=min_efficiency, sweep=sweep_name,
                          device=device, jobs=jobs)
        from ..pack import load_pack

        _print_info(load_pack(path).info(), brief=True)


def _sweep_into(space, problem_specs, db_path, jobs, top_k, config) -> Path:
    from .. import Session
    from ..tune.sweep import Sweep

    if db_path is None:
        db_path = Path(tempfile.mkdtemp(prefix="pycutlass-pack-")) / "sweep.db"
    job = Sweep(_space(space), _problems(problem_specs), db=db_path, session=Session(), top_k=top_k)
    click.echo(f"compile: {job.compile(jobs=jobs)}")
    click.echo(f"benchmark: {job.benchmark(config=config)}")
    return db_path


def _print_info(info: dict, brief: bool = False) -> None:
    source = info.get("source", {})
    device = source.get("device", {})
    click.echo(f"{info['path']}: {info['kernels']} kernels for {info['target']}, {len(info['classes'])} operation "
               f"classes; pycutlass {info['pycutlass']}, CUTLASS {info['cutlass']}, created {info['created']}")
    if device:
        click.echo(f"  measured on {device.get('name', device.get('id'))} (driver {device.get('driver')}, SM clock "
                   f"{device.get('sm_clock_mhz')} MHz); selected at >= {source.get('min_efficiency')}")
    for name, found in info["classes"].items():
        vs_torch = found.get("geomean_vs_torch")
        click.echo(f"  {name}")
        click.echo(f"    {len(found['kernels'])} kernels, {found['problems']} problems; efficiency worst "
                   f"{found.get('worst_efficiency')}, geomean {found.get('geomean_efficiency')}"
                   + (f"; geomean {vs_torch:.3f}x torch" if vs_torch else ""))
        if not brief:
            for kernel in found["kernels"]:
                click.echo(f"      {kernel}")
            click.echo(f"    shapes: {', '.join(found['shapes'])}")


@pack.command("info")
@click.argument("path")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def pack_info(path, as_json):
    """Check a pack's manifest and describe it: classes, kernels, shapes covered, efficiencies."""
    from ..pack import load_pack

    with _reported():
        info = load_pack(path).info()
        if as_json:
            click.echo(json.dumps(info, indent=1))
        else:
            _print_info(info)


@pack.command("verify")
@click.argument("path")
@click.option("--device", type=click.IntRange(min=0), default=0, show_default=True)
def pack_verify(path, device):
    """Run every kernel of a pack once on the GPU against float64 (exit 1 if one is wrong)."""
    from ..pack import load_pack

    with _reported():
        _require_gpu("pack verify")
        rows = load_pack(path).verify(device=device, progress=lambda row: click.echo(
            f"  {'ok   ' if row['ok'] else 'WRONG'} {row['kernel']} {row['problem']} rel_error {row['rel_error']:.2e} "
            f"(<= {row['tolerance']:.0e})"))
        wrong = [row for row in rows if not row["ok"]]
        click.echo(f"{len(rows) - len(wrong)}/{len(rows)} kernels correct")
        if wrong:
            raise click.ClickException(f"{len(wrong)} kernel(s) computed wrong results")


@pack.command("wheel")
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--name", required=True, help="The wheel's distribution name (also the pack's installed name).")
@click.option("--version", "version", default="0.1.0", show_default=True)
@click.option("--out-dir", type=click.Path(file_okay=False, path_type=Path), default=Path("."), show_default=True)
def pack_wheel(path, name, version, out_dir):
    """Write a pure-Python wheel holding the pack (entry point group pycutlass.packs)."""
    from ..pack import build_wheel

    with _reported():
        click.echo(f"wrote {build_wheel(path, name=name, version=version, out_dir=out_dir)}")


@pack.command("list")
def pack_list():
    """The packs installed as wheels."""
    from ..pack import installed_packs

    found = installed_packs()
    if not found:
        click.echo("no pack installed (pycutlass pack wheel writes one)")
    for name, path in found.items():
        click.echo(f"{name}: {path}")
