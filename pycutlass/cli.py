"""The ``pycutlass`` command line. ``main`` is a click group: other modules add their commands to it."""
from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import click

from pycutlass.cache.location import default_cache_path
from pycutlass.cache.store import ArtifactCache
from pycutlass.errors import CacheError


@click.group()
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
    return (default_cache_path(), True) if db_path is None else (db_path, False)


@contextlib.contextmanager
def _reported_cache_errors() -> Iterator[None]:
    """Show a cache failure (e.g. an unsafe directory) as a one-line error, not a traceback."""
    try:
        yield
    except CacheError as exc:
        raise click.ClickException(str(exc)) from exc


def _open_existing(db_path: Path | None) -> ArtifactCache | None:
    """The cache at the path, or None if there is no file yet (inspecting must not create one)."""
    path, is_default = _resolve(db_path)
    if not path.exists():
        click.echo(f"No cache at {path} (nothing has been compiled yet).")
        return None
    return ArtifactCache(path, private_dir=is_default)


@cache.command("path")
@_path_option
def cache_path(db_path: Path | None) -> None:
    """Print where the cache database is."""
    click.echo(str(_resolve(db_path)[0]))


@cache.command("list")
@_path_option
def cache_list(db_path: Path | None) -> None:
    """List cached kernels, most recently used first."""
    store = _open_existing(db_path)
    if store is None:
        return
    with _reported_cache_errors(), store:
        entries = store.entries()
    if not entries:
        click.echo(f"Cache {store.path} is empty.")
        return
    rows = [
        (entry["name"], entry["key"][:16], _human_size(entry["size"]), entry["kind"] or "?", _when(entry["last_used"]))
        for entry in entries
    ]
    click.echo(_table(("NAME", "KEY", "SIZE", "KIND", "LAST USED"), rows))


@cache.command("size")
@_path_option
def cache_size(db_path: Path | None) -> None:
    """Print how many kernels are cached and how much space they take."""
    store = _open_existing(db_path)
    if store is None:
        return
    with _reported_cache_errors(), store:
        entries = store.entries()
        binary_bytes = store.size_bytes()
    binaries = len({entry["sha256"] for entry in entries})
    on_disk = sum(
        os.path.getsize(f"{store.path}{suffix}")
        for suffix in ("", "-wal", "-shm")
        if os.path.exists(f"{store.path}{suffix}")
    )
    click.echo(
        f"{len(entries)} kernels in {binaries} binaries: {_human_size(binary_bytes)} of binaries, "
        f"{_human_size(on_disk)} on disk ({store.path})"
    )


@cache.command("clear")
@_path_option
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
def cache_clear(db_path: Path | None, yes: bool) -> None:
    """Remove every cached kernel (they are recompiled when next needed)."""
    store = _open_existing(db_path)
    if store is None:
        return
    with _reported_cache_errors(), store:
        count = len(store.entries())
        if not yes:
            click.confirm(f"Remove all {count} cached kernels from {store.path}?", abort=True)
        store.clear()
    click.echo(f"Removed {count} cached kernels from {store.path}.")


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
