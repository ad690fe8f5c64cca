"""Where a sweep's benchmark time goes, per worker and per phase (cheap ``perf_counter`` sums, always on).

A benchmark worker process keeps a :class:`PhaseClock` and sends the seconds of each phase with every reply; the
parent adds them up per worker (:class:`WorkerTimes`) beside what it sees itself: the round trips, its own handling
between two tasks of a worker, and the time a worker waits (for the others to start, or at the end, for the last
pairs of the others: the tail). ``BenchSummary.breakdown`` (local sweeps) and ``DistributedSummary.breakdown``
(Dask) hold the result; ``str()`` prints it as a table.
"""
from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

# What a worker process reports (exclusive seconds: time in a nested phase counts only for that phase).
WORKER_PHASES = {
    "startup": "process start to ready: interpreter, imports (torch), CUDA context, session, harness",
    "load": "module load and argument set-up (the first pair of a kernel on a worker loads its module)",
    "inputs": "random operands generated and copied to the GPU (once per problem and layout per worker)",
    "reference": "float64 reference products (once per problem per worker)",
    "verify": "the checked launch and its comparison with the reference",
    "timing": "warm-up and timed repetitions",
    "other": "everything else inside the worker: decoding the task, kernel attributes, baselines' set-up",
    "lost": "requests that ended with the worker lost (a fault or a timeout) and the time to notice",
}


class PhaseClock:
    """Seconds per named phase, exclusive of the phases nested in it."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self._open: list[list] = []  # [start, seconds of nested phases]

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        frame = [time.perf_counter(), 0.0]
        self._open.append(frame)
        try:
            yield
        finally:
            elapsed = time.perf_counter() - frame[0]
            self._open.pop()
            self.add(name, elapsed - frame[1])
            if self._open:
                self._open[-1][1] += elapsed

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    def take(self) -> dict[str, float]:
        """The seconds gathered since the last ``take`` (what one reply carries); the clock starts again at zero."""
        taken, self.seconds = self.seconds, {}
        return taken


@dataclass
class WorkerTimes:
    """One benchmark worker's time, from the start of the benchmark phase to its end (``wall``).

    ``wall == requests + parent + idle``: every moment is a round trip to the worker (``requests``, which its own
    ``phases`` break down; the rest of a round trip is ``transport``: pickling, the socket, interpreter start), the
    parent's handling between two of its tasks (``parent``), or waiting (``idle``, of which ``tail`` at the end)."""

    label: str
    wall: float = 0.0
    requests: float = 0.0
    parent: float = 0.0
    idle: float = 0.0
    tail: float = 0.0
    tasks: int = 0
    kernels: int = 0  # distinct kernels (modules) this worker ran
    stolen: int = 0  # pairs taken from another worker's kernel at the end
    phases: dict = field(default_factory=dict)

    def add_phases(self, phases: dict | None) -> None:
        for name, seconds in (phases or {}).items():
            self.phases[name] = self.phases.get(name, 0.0) + float(seconds)

    @property
    def transport(self) -> float:
        return max(0.0, self.requests - sum(self.phases.values()))

    @property
    def startup(self) -> float:
        return self.phases.get("startup", 0.0)

    @property
    def busy(self) -> float:
        """Time the worker spent on pairs (everything in its requests except starting up)."""
        return self.requests - self.startup

    def row(self) -> dict:
        row = {"worker": self.label, "wall_s": self.wall, "busy_s": self.busy, "idle_s": self.idle,
               "tail_s": self.tail, "startup_s": self.startup}
        for name in WORKER_PHASES:
            if name != "startup":
                row[f"{name}_s"] = self.phases.get(name, 0.0)
        row.update(transport_s=self.transport, parent_s=self.parent, tasks=self.tasks, kernels=self.kernels,
                   stolen=self.stolen)
        return {k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}


@dataclass
class Breakdown:
    """The benchmark phase's time (``wall``): per worker (``workers``, until the last of them is done) and the
    parent's: ``setup`` (the DB's device rows, planning and the resume query, after the workers' facts arrived),
    ``write`` (committing rows, in a thread of its own beside the workers) and ``teardown`` (the last commit and
    stopping the workers, after the workers' part)."""

    wall: float = 0.0
    setup: float = 0.0
    teardown: float = 0.0
    write: float = 0.0
    rows_written: int = 0
    commits: int = 0
    workers: list[WorkerTimes] = field(default_factory=list)

    def rows(self) -> list[dict]:
        return [w.row() for w in self.workers]

    def to_dict(self) -> dict:
        return {"wall_s": round(self.wall, 3), "setup_s": round(self.setup, 3), "write_s": round(self.write, 3),
                "teardown_s": round(self.teardown, 3), "rows_written": self.rows_written, "commits": self.commits,
                "workers": self.rows()}

    def __str__(self) -> str:
        columns = ["worker", "wall_s", "busy_s", "idle_s", "tail_s", "startup_s", "load_s", "inputs_s",
                   "reference_s", "verify_s", "timing_s", "other_s", "transport_s", "parent_s", "tasks"]
        rows = [[str(r[c]) for c in columns] for r in self.rows()]
        widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(columns)]
        lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths))]
        lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in rows]
        lines.append(f"parent: setup {self.setup:.2f} s, writing {self.write:.2f} s ({self.rows_written} rows in "
                     f"{self.commits} commits), teardown {self.teardown:.2f} s; wall {self.wall:.2f} s")
        return "\n".join(lines)


class Timeline:
    """A worker's moments, accounted in order: ``mark(kind)`` adds the time since the previous mark to ``kind``."""

    def __init__(self, times: WorkerTimes, start: float):
        self.times = times
        self.start = self.last = start

    def mark(self, kind: str) -> float:
        now = time.perf_counter()
        elapsed = now - self.last
        setattr(self.times, kind, getattr(self.times, kind) + elapsed)
        self.last = now
        return elapsed

    def finish(self, end: float) -> None:
        """The end of the phase: what is left since the last mark was waiting (the tail, after the last task)."""
        self.times.tail = max(0.0, end - self.last)
        self.times.idle += self.times.tail
        self.times.wall = end - self.start
