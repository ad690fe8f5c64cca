"""The ``pycutlass`` command line. ``main`` is a click group: other modules add their commands to it."""
from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import click

from pycutlass.cache.location import default_cache_path
from pycutlass.cache.store import (
    ArtifactCache,
    CacheCorruptError,
    identify_file,
    moved_aside_files,
    remove_moved_aside_files,
)
from pycutlass.errors import CacheError


class _EchoHandler(logging.Handler):
    """Log records as lines on the current stderr (click's, so that test runners capture them too)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            click.echo(self.format(record), err=True)
        except Exception:
            self.handleError(record)


def _show_progress_lines() -> None:
    """Where stderr is no terminal (a pipe, a log file), no progress bar shows: print the per-unit compile lines
    (logger ``pycutlass.progress``, INFO) instead, so that a long compile is not silent."""
    progress = logging.getLogger("pycutlass.progress")
    if sys.stderr.isatty() or any(isinstance(h, _EchoHandler) for h in progress.handlers):
        return
    handler = _EchoHandler()
    handler.setFormatter(logging.Formatter("pycutlass: %(message)s"))
    progress.addHandler(handler)
    if progress.getEffectiveLevel() > logging.INFO:
        progress.setLevel(logging.INFO)


class _Main(click.Group):
    def invoke(self, ctx: click.Context):
        _show_progress_lines()
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:  # the compile stopped its workers and removed their files; no traceback
            click.echo("interrupted", err=True)
            ctx.exit(130)



def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    from pycutlass.tune.db import pycutlass_version

    click.echo(f"pycutlass {pycutlass_version()}")
    ctx.exit()


@click.group(cls=_Main)
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_print_version,
              help="Print the installed pycutlass version and exit.")
def main() -> None:
    """pycutlass: emit, compile, cache and launch CUTLASS kernels."""


@main.group()
def cache() -> None:
    """Inspect or empty the cache of compiled kernels."""


_path_option = click.option(
    "--path",
    "db_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Cache database file. Default: compiled_cache.db in $PYCUTLASS_CACHE_DIR or the user cache dir.",
)


def _resolve(db_path: Path | None) -> tuple[Path, bool]:
    """The database file and whether it is the default one (whose directory must be private)."""
    if db_path is not None:
        return db_path, False
    with _reported_cache_errors():  # e.g. $PYCUTLASS_CACHE_DIR names a file
        return default_cache_path(), True


@contextlib.contextmanager
def _reported_cache_errors() -> Iterator[None]:
    """Show a cache failure (e.g. an unsafe directory) as a one-line error, not a traceback."""
    try:
        yield
    except CacheError as exc:
        raise click.ClickException(str(exc)) from exc


def _open_existing(db_path: Path | None) -> ArtifactCache | None:
    """The cache at the path opened read-only, or None if there is no file (inspecting must not create one).

    Creates, moves and changes nothing; a file that is not a pycutlass cache is a CacheError.
    """
    path, is_default = _resolve(db_path)
    with _reported_cache_errors():
        if identify_file(path) == "missing":
            click.echo(f"No cache at {path} (nothing has been compiled yet; the file does not exist).")
            return None
    return ArtifactCache(path, private_dir=is_default, read_only=True)


def _moved_aside_note(path: Path) -> str:
    files = moved_aside_files(path)
    if not files:
        return ""
    size = sum(_size_of(f) for f in files)
    mains = [f for f in files if not f.name.endswith(("-wal", "-shm"))]
    return f"; {_human_size(size)} in {len(mains)} damaged files moved aside (`pycutlass cache clear` removes them)"


def _size_of(path: Path | str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


@cache.command("path")
@_path_option
def cache_path(db_path: Path | None) -> None:
    """Print where the cache database is."""
    path = _resolve(db_path)[0]
    click.echo(str(path))
    if not path.exists():
        click.echo(f"(no file there yet: nothing has been compiled into {path})", err=True)


@cache.command("list")
@_path_option
def cache_list(db_path: Path | None) -> None:
    """List cached kernels, most recently used first. SIZE is the kernel's share of the binary it is in."""
    store = _open_existing(db_path)
    if store is None:
        return
    with _reported_cache_errors(), store:
        entries = store.entries()
    if not entries:
        click.echo(f"Cache {store.path} is empty.")
        return
    rows = [
        (
            entry["name"],
            entry["key"][:16],
            _human_size(None if entry["share"] is None else round(entry["share"]))
            + (f" (1/{entry['sharing']})" if entry["sharing"] > 1 else ""),
            entry["kind"] or "?",
            _when(entry["last_used"]),
        )
        for entry in entries
    ]
    click.echo(_table(("NAME", "KEY", "SIZE", "KIND", "LAST USED"), rows))


@cache.command("size")
@_path_option
def cache_size(db_path: Path | None) -> None:
    """Print how many kernels are cached and how much space they take."""
    store = _open_existing(db_path)
    if store is None:
        note = _moved_aside_note(_resolve(db_path)[0])
        if note:
            click.echo(note.lstrip("; ").capitalize())
        return
    with _reported_cache_errors(), store:
        entries = store.entries()
        binary_bytes = store.size_bytes()
    binaries = len({entry["sha256"] for entry in entries})
    on_disk = sum(_size_of(f"{store.path}{suffix}") for suffix in ("", "-wal", "-shm"))
    click.echo(
        f"{len(entries)} kernels in {binaries} binaries: {_human_size(binary_bytes)} of binaries, "
        f"{_human_size(on_disk)} on disk ({store.path}){_moved_aside_note(Path(store.path))}"
    )


@cache.command("clear")
@_path_option
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
def cache_clear(db_path: Path | None, yes: bool) -> None:
    """Remove every cached kernel (they are recompiled when next needed), and the damaged files moved aside."""
    path, is_default = _resolve(db_path)
    store = _open_existing(db_path)
    debris = moved_aside_files(path)
    if store is None and not debris:
        return
    count: int | None = 0
    if store is not None:
        with _reported_cache_errors(), store:
            try:
                count = len(store.entries())
            except CacheCorruptError as exc:
                click.echo(str(exc))
                count = None  # clearing moves it aside (a write), then removes it with the other debris
    what = "the damaged cache" if count is None else f"all {count} cached kernels"
    extra = f" and {len(debris)} damaged files moved aside" if debris else ""
    if not yes:
        click.confirm(f"Remove {what} from {path}{extra}?", abort=True)
    with _reported_cache_errors():
        if store is not None:
            with ArtifactCache(path, private_dir=is_default) as writable:
                writable.clear()
        removed, kept = remove_moved_aside_files(path)
    message = f"Removed {'the damaged cache' if count is None else f'{count} cached kernels'} from {path}."
    if removed:
        message += f" Removed {len(removed)} damaged files moved aside."
    if kept:
        message += f" Left {len(kept)} files that are not databases: {', '.join(map(str, kept))}."
    click.echo(message)


def _table(headers: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows, strict=True)]
    lines = [headers, tuple("-" * width for width in widths), *rows]
    return "\n".join(
        "  ".join(str(cell).ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip() for line in lines
    )


def _human_size(size: int | None) -> str:
    if size is None:
        return "?"
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _when(timestamp: float | None) -> str:
    return "?" if timestamp is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(timestamp))


def _add_tuning_commands() -> None:
    """sweep, tune, select, heatmap, bundle, db (pycutlass.cli.tune) and pack (pycutlass.cli.pack)."""
    from .pack import main as packs
    from .tune import main as tuning

    for group in (tuning, packs):
        for name, command in group.commands.items():
            main.add_command(command, name)


_add_tuning_commands()
