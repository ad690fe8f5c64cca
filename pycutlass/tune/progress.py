"""Progress bars of long tuning work (compiles, benchmarks): a tqdm bar on a terminal or when asked for."""
from __future__ import annotations

import sys


class NoBar:
    """The bar shown when none is: it takes updates and shows nothing."""

    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def progress_bar(total: int, what: str, progress: bool | None):
    """A tqdm bar on a terminal (or when asked for), none otherwise."""
    if progress is False or total == 0 or (progress is None and not sys.stderr.isatty()):
        return NoBar()
    from tqdm import tqdm

    return tqdm(total=total, desc=what, unit="op")
