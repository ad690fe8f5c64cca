"""What ``optimize`` did, as a table: :class:`OptimizeReport`."""
from __future__ import annotations

import contextlib
import copy
import time
from dataclasses import dataclass, field


_COLUMNS = ("layer", "op", "pattern", "shape", "kernel", "cutlass_us", "torch_us", "speedup")


@dataclass
class OptimizeReport:
    """What ``optimize`` did: one row per replaced call, the candidates it left alone and why, and notes.

    ``speedup`` is ``torch_us / cutlass_us`` (above 1: the CUTLASS kernel beat torch); ``kernel`` is the chosen
    operation's name, ``"torch"`` where torch was kept, ``"torch (end-to-end)"`` where the end-to-end check moved
    the layer to torch (``tuned_kernel`` keeps the kernel tuning chose), or ``"-"`` where nothing was tuned.
    ``end_to_end``: the end-to-end check's record (``{"eager_ms", "candidates": {name: ms}, "chosen"}``, median ms
    per forward on the example inputs), None where it did not run.
    ``seconds``: wall seconds per phase of ``optimize`` in the order they ran (``trace``, ``record`` (the example
    run that records the calls), ``rank``, ``compile``, ``tune``, ``end_to_end``, ``graphs``), so a slow first run
    says where its time went.
    """

    rows: list[dict] = field(default_factory=list)
    skipped: list[dict] = field(default_factory=list)  # {"layer", "op", "reason"}
    notes: list[str] = field(default_factory=list)
    end_to_end: dict | None = None
    seconds: dict[str, float] = field(default_factory=dict)

    @contextlib.contextmanager
    def timed(self, phase: str):
        """Adds the wall time of the ``with`` block to ``seconds[phase]``."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - start

    def table(self) -> str:
        cells = [[_cell(row.get(c)) for c in _COLUMNS] for row in self.rows]
        try:
            from tabulate import tabulate
        except ImportError:
            return _plain_table(list(_COLUMNS), cells)
        return tabulate(cells, headers=list(_COLUMNS), tablefmt="simple", disable_numparse=True)

    def __str__(self) -> str:
        lines = [self.table()] if self.rows else ["no layer was replaced"]
        lines += [f"not replaced: {s['layer']} ({s['op']}): {s['reason']}" for s in self.skipped]
        lines += [f"note: {n}" for n in self.notes]
        if self.seconds:
            lines.append("time: " + ", ".join(f"{phase} {s:.1f} s" for phase, s in self.seconds.items()))
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"rows": [dict(r) for r in self.rows], "skipped": [dict(s) for s in self.skipped],
                "notes": list(self.notes), "end_to_end": copy.deepcopy(self.end_to_end),
                "seconds": dict(self.seconds)}

    @classmethod
    def from_dict(cls, data: dict) -> "OptimizeReport":
        return cls(list(data.get("rows", [])), list(data.get("skipped", [])), list(data.get("notes", [])),
                   copy.deepcopy(data.get("end_to_end")), dict(data.get("seconds", {})))


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


def _plain_table(headers: list[str], cells: list[list[str]]) -> str:
    widths = [max([len(h)] + [len(row[i]) for row in cells]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip(),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    return "\n".join(lines)
