"""The timing harness: verified once, then timed honestly.

- random-normal inputs (zeros and small integers run faster and lie), outputs poisoned with NaN before the check;
- inputs drawn on the GPU and float64 references computed there, once per problem, and kept while they fit
  (``GemmBench(cache_bytes=...)``); ``GemmBench.clock`` sums the seconds of each phase (:mod:`.breakdown`);
- each kernel verified against a float64 reference once before it is timed; a wrong kernel is never timed;
- warm-up, then every repetition timed by the GPU's own timestamps (CUPTI, :mod:`.kernel_timer`): from the end of
  the GPU-side lead to the end of the call's last kernel (``timer="launch"``, the default: the GPU's launch of the
  call counts, as ncu and graph replay count it), or from the call's first kernel (``timer="kernel"``); or by CUDA
  events around the call (``timer="events"``, which adds the GPU front end's 2-4 us per launch); L2 evicted by a read before each (or an argument pool larger than L2); at least
  ``repetitions`` samples and at most ``max_seconds``; median, minimum and inter-quartile range;
- a GPU-side lead before each timed launch (``lead_us``, on by default): the GPU sleeps while the host enqueues the
  launch, so the time is the kernel's on the GPU, not the host's launch path, at every problem size;
- optional CUDA-graph replay (``cuda_graph`` launches per graph) to take the host's launch cost out as well;
- the torch baseline (cuBLAS) is timed by the same code in the same process, with the same lead.

Needs torch and a GPU. GEMM problems (``GemmProblem``) on GEMM operations (Sm80 and SM90 families), grouped
problems (``GroupedGemmProblem``) on grouped operations (``measure_grouped``, baseline ``measure_torch_grouped``),
masked ones (``MaskedGroupedProblem``) on SM90 grouped operations (``measure_masked``, the same baseline packed) and
Conv2d problems on Conv2d operations (``measure_conv``, baseline ``measure_torch_conv``).
"""
from __future__ import annotations

import itertools
import json
import math
import statistics
import time
from dataclasses import asdict, dataclass

from collections import OrderedDict
from contextlib import nullcontext

from ..errors import ArgumentError
from .breakdown import PhaseClock
from .kernel_timer import KernelTimer
from .db import canonical_json

# Relative (Frobenius) error allowed against float64, by output type; fp8 operands add their input rounding.
TOLERANCE = {"float16": 5e-3, "bfloat16": 3e-2, "float32": 5e-3, "tfloat32": 5e-3, "float8_e4m3": 1e-1,
             "float8_e5m2": 2e-1, "int32": 0.0, "int8": 0.0}
_TORCH_DTYPE = {"float16": "float16", "bfloat16": "bfloat16", "float32": "float32", "tfloat32": "float32",
                "int8": "int8", "int32": "int32", "float8_e4m3": "float8_e4m3fn", "float8_e5m2": "float8_e5m2",
                "float64": "float64"}
_INTEGER = ("int8", "int32")
_FP8 = ("float8_e4m3", "float8_e5m2")


# The host enqueues the start event and the launch while the lead runs, so the lead must outlast that host path:
# torch.matmul measured 26.9 us for an f16 1024^3 GEMM on an H200 without a lead, a cuBLAS kernel of a few us, so
# its host path is about 24 us there; pycutlass's run() with prepared arguments is shorter. 50 us is twice the
# longest, for slower hosts, and costs 50 us of GPU idle per sample (2.5 ms per pair at 50 repetitions).
DEFAULT_LEAD_US = 50.0
TIMERS = ("kernel", "launch", "events")
# A GPU at its power limit lowers its SM clock after heavy work and takes tens of milliseconds to raise it again: on
# an H200, after 400 back-to-back 4096^3 GEMMs, torch's 4096^3 bf16 GEMM was timed at 1.23x its rested time, its
# leads running at 76% of full speed. Each sample's lead is a sleep of a known cycle count, so with a CUPTI timer
# the harness reads the clock the samples ran at; below FULL_CLOCK it rests the GPU (SETTLE_IDLE_S) and times
# again, within settle_ms, keeping the attempt at the highest clock, and says so when that is still below.
# (A lone sleep probed at idle does not tell: its reading depends on how busy the GPU was, by 5-10%.)
DEFAULT_SETTLE_MS = 300.0
SETTLE_IDLE_S = 0.1  # at idle the clock came back within 70 ms of such a burst
FULL_CLOCK = 0.97  # a lead at full speed reads 0.98-0.99 (its own launch and exit)

# Operands and float64 references a GemmBench keeps (half each): in a user's process (autotune, torch tuning) a little;
# a sweep's benchmark worker, alone on its GPU, a share of the GPU's memory (its kernels need their output and
# workspace beside it; an H200's share, 28 GB, holds the inputs of hundreds of LLM-sized problems).
DEFAULT_CACHE_BYTES = 2 * 2**30
WORKER_CACHE_FRACTION = 0.2


def worker_cache_bytes(device: int = 0) -> int:
    """The cache budget of a sweep's benchmark worker on ``device``."""
    import torch

    total = getattr(torch.cuda.get_device_properties(device), "total_memory", 0)
    return max(DEFAULT_CACHE_BYTES, int(total * WORKER_CACHE_FRACTION))


@dataclass(frozen=True)
class BenchConfig:
    """How to time. The fingerprint goes into every run row: results of different harnesses never mix."""

    warmup: int = 5
    repetitions: int = 50
    max_seconds: float = 2.0  # per (kernel, problem): stop early (with >= 10 samples) for slow kernels
    flush_l2: bool = True
    cuda_graph: int = 0  # launches per captured graph; 0 = plain launches
    arg_pool: int = 1  # distinct argument sets cycled through (vLLM's --with-arg-pool)
    verify: bool = True
    seed: int = 0
    # GPU-side lead before each timed launch (a device sleep, microseconds): the host enqueues the launch while the
    # GPU still sleeps, so a small kernel's time is its own, not its launch's host latency. 0 = no lead (then the
    # samples of kernels shorter than their host launch path time the host). DEFAULT_LEAD_US says why 50.
    lead_us: float = DEFAULT_LEAD_US
    # "launch": the span of the call's GPU activity from CUPTI's timestamps, from the end of the lead, so the GPU
    # front end's launch of the call counts (as ncu and a CUDA graph's period per launch count it); "kernel": the
    # same from the start of the call's first kernel; "events": CUDA events around the call. None: "launch" with a
    # lead, "kernel" without one.
    timer: str | None = None
    # the most milliseconds spent resting the GPU and timing again when the leads show the samples ran below full
    # clock (DEFAULT_SETTLE_MS says why); 0 = keep the first timing
    settle_ms: float = DEFAULT_SETTLE_MS

    def __post_init__(self):
        for name in ("warmup", "repetitions", "cuda_graph", "arg_pool", "seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ArgumentError(f"BenchConfig.{name} must be a non-negative integer, got {value!r}")
        if self.repetitions < 1 or self.arg_pool < 1:
            raise ArgumentError("BenchConfig.repetitions and arg_pool must be >= 1")
        if not (isinstance(self.max_seconds, (int, float)) and self.max_seconds > 0):
            raise ArgumentError(f"BenchConfig.max_seconds must be > 0, got {self.max_seconds!r}")
        if isinstance(self.lead_us, bool) or not isinstance(self.lead_us, (int, float)) or not \
                0 <= self.lead_us <= 100_000:
            raise ArgumentError(f"BenchConfig.lead_us must be between 0 and 100000 microseconds, got {self.lead_us!r}")
        if isinstance(self.settle_ms, bool) or not isinstance(self.settle_ms, (int, float)) or not \
                0 <= self.settle_ms <= 10_000:
            raise ArgumentError(f"BenchConfig.settle_ms must be between 0 and 10000 milliseconds, got "
                                f"{self.settle_ms!r}")
        if self.timer is None:
            object.__setattr__(self, "timer", "launch" if self.lead_us else "kernel")
        if self.timer not in TIMERS:
            raise ArgumentError(f"BenchConfig.timer must be one of {TIMERS}, got {self.timer!r}")
        if self.timer == "launch" and not self.lead_us:
            raise ArgumentError("BenchConfig(timer='launch') times from the end of the GPU-side lead, so it needs "
                                "lead_us > 0; timer='kernel' times without one")

    @property
    def fingerprint(self) -> str:
        fields = asdict(self)
        if not fields["lead_us"]:
            # lead_us=0 times what harnesses without the field timed, so it keeps their fingerprint (and rows); the
            # default lead is in every other fingerprint, so its rows never mix with lead-less ones
            del fields["lead_us"]
        if fields["timer"] == "events":
            del fields["timer"]  # what harnesses before the field timed: their rows stay comparable
        if not fields["settle_ms"]:
            del fields["settle_ms"]  # likewise: harnesses before the field kept the first timing
        return canonical_json(fields)

    @classmethod
    def from_json(cls, text: str) -> BenchConfig:
        fields = json.loads(text)
        # a fingerprint leaves out the fields at their old values (see fingerprint)
        fields.setdefault("lead_us", 0.0)
        fields.setdefault("timer", "events")
        fields.setdefault("settle_ms", 0.0)
        return cls(**fields)


@dataclass
class Measurement:
    status: str  # ok | wrong | failed
    seconds: float | None = None
    seconds_min: float | None = None
    seconds_iqr: float | None = None
    repetitions: int = 0
    rel_error: float | None = None
    message: str = ""


def summarize(samples: list[float]) -> tuple[float, float, float]:
    """Median, minimum and inter-quartile range of timing samples (seconds)."""
    ordered = sorted(samples)
    if len(ordered) >= 4:
        q1, _, q3 = statistics.quantiles(ordered, n=4)
    else:
        q1 = q3 = ordered[len(ordered) // 2]
    return statistics.median(ordered), ordered[0], q3 - q1


def _join(note: str, more: str) -> str:
    return f"{note}; {more}" if note else more


def element_label(element) -> str:
    return getattr(element, "label", str(element))


class GemmBench:
    """Inputs, references and timing for GEMM problems on one GPU (the current torch device)."""

    def __init__(self, config: BenchConfig, device: int | None = None, *, clock: PhaseClock | None = None,
                 cache_bytes: int | None = None):
        import torch

        self.torch = torch
        self.config = config
        self.device = torch.device("cuda", torch.cuda.current_device() if device is None else device)
        self.clock = clock or PhaseClock()  # seconds per phase (inputs, reference, verify, timing, ...)
        props = torch.cuda.get_device_properties(self.device)
        l2 = getattr(props, "L2_cache_size", 0) or 50 * 2**20
        self.l2_bytes = l2
        self._flush = torch.ones(2 * l2 // 4, dtype=torch.int32, device=self.device) if config.flush_l2 else None
        # Operands and float64 references stay on the GPU while they fit (least recently used go first): a sweep's
        # worker measures whole kernels across the problems, so each problem comes back once per kernel, and passes
        # a share of the GPU (worker_cache_bytes); in a user's process the default stays small.
        self.cache_bytes = DEFAULT_CACHE_BYTES if cache_bytes is None else cache_bytes
        self._inputs = ByteBoundedCache(self.cache_bytes // 2)
        self._references = ByteBoundedCache(self.cache_bytes // 2)
        self._sleep_cycles_per_us: float | None = None

    # --- inputs -----------------------------------------------------------------------------------------------
    def _random(self, shape, label, generator):
        # Drawn on the GPU: an LLM-sized operand drawn on the host costs a tenth of a second per problem and worker,
        # and workers on one host would compete for its cores. Philox with the same seed draws the same values on
        # every GPU, so every GPU of a sweep sees the same operands.
        torch = self.torch
        if label == "int8":
            return torch.randint(-4, 5, shape, generator=generator, dtype=torch.int8, device=self.device)
        values = torch.randn(shape, generator=generator, dtype=torch.float32, device=self.device)
        if label in _FP8:
            values = values.clamp(-6, 6)
        return values.to(getattr(torch, _TORCH_DTYPE[label]))

    def _matrix(self, rows, cols, row_major: bool, label, generator, batch):
        """A logical (batch,) rows x cols matrix; a column-major one is a transposed view of its storage."""
        shape = (batch, rows, cols) if row_major else (batch, cols, rows)
        stored = self._random(shape, label, generator)
        logical = stored if row_major else stored.transpose(1, 2)
        return logical if batch > 1 else logical[0]

    def poisoned(self, rows, cols, row_major: bool, label, batch):
        torch = self.torch
        shape = (batch, rows, cols) if row_major else (batch, cols, rows)
        fill = float("nan") if label not in _INTEGER else -77
        tensor = torch.full(shape, fill, dtype=torch.float32, device=self.device).to(getattr(torch, _TORCH_DTYPE[label]))
        tensor = tensor if row_major else tensor.transpose(1, 2)
        return tensor if batch > 1 else tensor[0]

    def operands(self, problem, a_label, b_label, a_row: bool, b_row: bool, index: int = 0):
        """A and B for a problem (cached: kernels of one sweep share them; ``index`` > 0 for argument pools)."""
        key = (problem.key, a_label, b_label, a_row, b_row, index)
        found = self._inputs.get(key)
        if found is None:
            with self.clock.phase("inputs"):
                generator = self.torch.Generator(device=self.device).manual_seed(self.config.seed * 1_000_003 + index)
                a = self._matrix(problem.m, problem.k, a_row, a_label, generator, problem.batch)
                b = self._matrix(problem.k, problem.n, b_row, b_label, generator, problem.batch)
                self.torch.cuda.synchronize(self.device)
            found = (a, b)
            self._inputs.put(key, found, _nbytes(a) + _nbytes(b))
        return found

    def reference(self, problem, a, b, activation=None):
        """A @ B in float64 for the problem's first argument set (kernels of a sweep share it), with ``activation``
        (an epilogue's) applied when given. Held with its operands, so their memory is never reused under the key."""
        key = (problem.key, a.data_ptr(), b.data_ptr(), tuple(a.stride()), tuple(b.stride()), str(a.dtype),
               str(b.dtype), getattr(activation, "name", None))
        found = self._references.get(key)
        if found is None:
            with self.clock.phase("reference"):
                if activation is None:
                    product = self.torch.matmul(a.double(), b.double())
                else:
                    product = activated(self.torch, self.reference(problem, a, b), activation)
                self.torch.cuda.synchronize(self.device)
            self._references.put(key, (product, a, b), _nbytes(product))
            return product
        return found[0]

    # --- timing -----------------------------------------------------------------------------------------------
    def _cycles_per_us(self) -> float:
        """Clock cycles of ``torch.cuda._sleep`` per microsecond on this device (measured once). At least the SM's
        maximum clock: a sleep measured while the clock was still ramping up would otherwise end early later."""
        if self._sleep_cycles_per_us is None:
            torch, cycles = self.torch, 2_000_000
            torch.cuda._sleep(cycles)  # warm up
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.cuda._sleep(cycles)
            end.record()
            end.synchronize()
            measured = cycles / max(start.elapsed_time(end) * 1e3, 1.0)
            self._sleep_cycles_per_us = max(measured, self._max_clock_mhz())
        return self._sleep_cycles_per_us

    def _max_clock_mhz(self) -> float:
        try:
            from cuda.bindings import driver as cu

            _, dev = cu.cuDeviceGet(self.device.index or 0)
            err, khz = cu.cuDeviceGetAttribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_CLOCK_RATE, dev)
            return int(khz) / 1000.0 if err == cu.CUresult.CUDA_SUCCESS else 0.0
        except Exception:  # no driver bindings: the measured rate alone
            return 0.0

    def time(self, launch, *, pool: int = 1, capture=None) -> tuple[list[float], str]:
        """Seconds per launch, one sample per repetition. ``launch(i)`` runs with argument set ``i % pool``;
        ``capture`` (a stream) is needed for CUDA graphs. Returns the samples and a note."""
        with self.clock.phase("timing"):
            return self._time(launch, pool, capture)

    def _time(self, launch, pool: int, capture) -> tuple[list[float], str]:
        torch, config = self.torch, self.config
        self._warm_up(launch)
        note = ""
        graph, per_sample = None, 1
        if config.cuda_graph:
            try:
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, stream=capture):
                    for i in range(config.cuda_graph):
                        launch(i)
                graph.replay()
                per_sample = config.cuda_graph
            except Exception as exc:  # some launches cannot be captured: time them plainly and say so
                graph, note = None, f"CUDA graph capture failed ({type(exc).__name__}: {exc}); plain launches timed"
        torch.cuda.synchronize(self.device)
        flush = self._flush is not None and pool <= 1
        # graph replays get the lead too: the replay's own host call would otherwise be timed once per sample
        lead = int(config.lead_us * self._cycles_per_us()) if config.lead_us else 0
        deadline = time.perf_counter() + config.settle_ms / 1e3
        best = None
        while True:
            samples, clock = self._timed_samples(launch, graph, flush, lead, per_sample)
            if best is None or clock > best[1]:
                best = (samples, clock)
            if clock >= FULL_CLOCK or time.perf_counter() + SETTLE_IDLE_S > deadline:
                break
            time.sleep(SETTLE_IDLE_S)  # an idle GPU raises its clock sooner than a busy one
            self._warm_up(launch, graph)
            torch.cuda.synchronize(self.device)
        samples, clock = best
        if clock < FULL_CLOCK:
            note = _join(note, f"timed with the SM clock at {clock:.0%} of full speed (power or thermal limit)")
        return samples, note

    def _warm_up(self, launch, graph=None) -> None:
        for i in range(self.config.warmup):
            if graph is not None:
                graph.replay()
            else:
                launch(i)

    def _timed_samples(self, launch, graph, flush: bool, lead: int, per_sample: int) -> tuple[list[float], float]:
        """One timed loop: the samples, and the SM clock they ran at as a share of full speed (from the leads'
        length; 1.0 where it is not known: CUDA events, no lead)."""
        torch, config = self.torch, self.config
        with (self.open_kernel_timer() if config.timer != "events" else nullcontext()) as timer:
            events = self._timed_loop(launch, graph, flush, lead, timer)
            torch.cuda.synchronize(self.device)
            if timer is None:
                return [s.elapsed_time(e) / 1e3 / per_sample for s, e in events], 1.0
            spans = timer.spans(len(events), from_lead=config.timer == "launch")
            leads = timer.lead_spans(len(events)) if lead else {}
        # the lead is a sleep of known cycles: its length gives the clock of each sample
        clock = min(1.0, config.lead_us * 1e-6 / statistics.median(leads.values())) if leads else 1.0
        return [spans[i] / per_sample for i in range(len(events))], clock

    def flush_l2(self) -> None:
        """Evict L2 before a timed call by reading twice its size. Reading leaves clean lines behind; a write
        (``zero_``) would leave L2 full of dirty ones, whose write-back then competes with the kernel's own loads
        (7.4 us on an H200 for torch on 64x14336x4096, which streams 117 MB), as no profiler's flush does."""
        self._flush.sum(dtype=self.torch.int64)

    def open_kernel_timer(self):
        return KernelTimer.open()

    def _timed_loop(self, launch, graph, flush: bool, lead: int, timer) -> list:
        """Issue the timed calls; events bracket each (they also give the early estimate for slow kernels). With the
        kernel timer the start event goes before the flush and the lead, so nothing sits between the lead and the
        call, and the lead is tagged (the "launch" timer starts where it ends)."""
        torch, config = self.torch, self.config
        events = []
        i = 0
        while len(events) < config.repetitions:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            if timer is not None:
                start.record()
            if flush:
                self.flush_l2()
            if lead:
                with (timer.lead(len(events)) if timer is not None else nullcontext()):
                    torch.cuda._sleep(lead)
            if timer is None:
                start.record()
            with (timer.sample(len(events)) if timer is not None else nullcontext()):
                if graph is not None:
                    graph.replay()
                else:
                    launch(i)
            end.record()
            events.append((start, end))
            i += 1
            if len(events) == 10:  # estimate: stop at the time budget for slow kernels
                end.synchronize()
                elapsed_estimate = sum(s.elapsed_time(e) for s, e in events) / 1e3
                if elapsed_estimate * config.repetitions / 10 > config.max_seconds:
                    break
        return events

    def l2_pool_size(self, bytes_per_set: int) -> int:
        """Argument sets needed for the pool to exceed L2 twice (each launch then reads from memory)."""
        return max(1, min(self.config.arg_pool, math.ceil(2 * self.l2_bytes / max(1, bytes_per_set)) or 1))


class ByteBoundedCache:
    """Least recently used entries, at most ``budget`` bytes (an entry larger than the budget is not kept)."""

    def __init__(self, budget: int):
        self.budget = budget
        self.bytes = 0
        self._entries: OrderedDict = OrderedDict()

    def get(self, key):
        found = self._entries.get(key)
        if found is None:
            return None
        self._entries.move_to_end(key)
        return found[0]

    def put(self, key, value, nbytes: int) -> None:
        if key in self._entries:
            self.bytes -= self._entries.pop(key)[1]
        if nbytes > self.budget:
            return
        while self._entries and self.bytes + nbytes > self.budget:
            self.bytes -= self._entries.popitem(last=False)[1][1]
        self._entries[key] = (value, nbytes)
        self.bytes += nbytes

    def __len__(self) -> int:
        return len(self._entries)


def _nbytes(tensor) -> int:
    return tensor.numel() * tensor.element_size()


def activated(torch, reference, activation):
    """``activation`` (an epilogue's) applied to a float64 reference by its float64 definition, on its device."""
    if activation is None:
        return reference
    from ..epilogue.activations import reference as activation_reference

    return torch.from_numpy(activation_reference(activation.name, reference.cpu().numpy())).to(reference.device)


def relative_error(got, reference) -> float:
    """Frobenius-norm relative error in float64; NaN anywhere gives inf."""
    got = got.double()
    diff = (got - reference).norm().item()
    if math.isnan(diff):
        return math.inf
    scale = reference.norm().item()
    return diff / scale if scale else diff


def operand_labels(operation) -> tuple[str, str, str, bool, bool, bool]:
    """A, B and C element labels of a GEMM-like operation, and whether A, B and C are row-major."""
    from ..description.types import LayoutType

    math_inst = operation.tile_description.math_instruction
    return (element_label(math_inst.element_a), element_label(math_inst.element_b), element_label(operation.C.element),
            operation.A.layout is LayoutType.RowMajor, operation.B.layout is LayoutType.RowMajor,
            operation.C.layout is LayoutType.RowMajor)


def measure_gemm(bench: GemmBench, operation, problem, session=None) -> tuple[Measurement, dict | None]:
    """Verify ``operation`` on ``problem`` once, then time it. Returns the measurement and kernel resources."""
    from ..kinds import GemmArguments
    from ..kinds.gemm.modes import GemmCoord, Mode

    torch, config = bench.torch, bench.config
    math_inst = operation.tile_description.math_instruction
    a_label, b_label, c_label, a_row, b_row, c_row = operand_labels(operation)
    mode = Mode.Batched if problem.batch > 1 else Mode.Gemm
    activation = getattr(operation.epilogue_functor, "activation", None)
    if operation.bias:
        return Measurement("failed", message="sweeps time operations without a bias vector"), None

    def arguments(index: int, stream=None):
        a, b = bench.operands(problem, a_label, b_label, a_row, b_row, index)
        d = bench.poisoned(problem.m, problem.n, c_row, c_label, problem.batch)
        args = GemmArguments(operation, GemmCoord(problem.m, problem.n, problem.k), a, b, None, d,
                             output_op=operation.epilogue_type(1.0, 0.0), gemm_mode=mode, batch=problem.batch,
                             stream=stream, session=session)
        return args, a, b, d

    clock = bench.clock
    with clock.phase("load"):  # the first pair of a kernel loads its module here
        args, a, b, d = arguments(0)
        resources = kernel_resources(args)
    rel_error = None
    if config.verify:
        with clock.phase("verify"):
            operation.run(args)
            args.sync()
            reference = bench.reference(problem, a, b, activation)
            if c_label in _INTEGER:
                expected = reference.round()
                if c_label == "int8":
                    expected = expected.clamp(-128, 127)
                rel_error = float((d.double() - expected).abs().max().item())
            else:
                rel_error = relative_error(d, reference)
        tolerance = max(TOLERANCE.get(c_label, 5e-3), TOLERANCE.get(a_label, 0.0) if a_label in _FP8 else 0.0)
        if element_label(math_inst.element_accumulator) == "float16":
            tolerance = max(tolerance, 1e-2)
        if not rel_error <= tolerance:
            return Measurement("wrong", rel_error=rel_error,
                               message=f"relative error {rel_error:.3g} > tolerance {tolerance:g}"), resources
    capture = torch.cuda.Stream(bench.device) if config.cuda_graph else None
    set_bytes = _nbytes(a) + _nbytes(b) + _nbytes(d)
    pool_size = bench.l2_pool_size(set_bytes) if config.arg_pool > 1 else 1
    with clock.phase("load"):
        if capture is not None:  # captured launches must be issued on the capture stream
            pool = [arguments(i, capture)[0] for i in range(pool_size)]
        else:
            pool = [args] + [arguments(i)[0] for i in range(1, pool_size)]
    samples, note = bench.time(lambda i: operation.run(pool[i % len(pool)]), pool=len(pool), capture=capture)
    median, minimum, iqr = summarize(samples)
    return Measurement("ok", median, minimum, iqr, len(samples), rel_error, note), resources


def measure_torch(bench: GemmBench, problem, a_label: str, a_row: bool = True, b_row: bool = False,
                  c_label: str | None = None) -> Measurement:
    """The baseline: torch (cuBLAS) on the same problem and operand layouts, timed by the same harness."""
    torch = bench.torch
    a, b = bench.operands(problem, a_label, a_label, a_row, b_row, 0)
    if a_label in ("float16", "bfloat16", "float32", "tfloat32"):
        torch.backends.cuda.matmul.allow_tf32 = a_label == "tfloat32"
        out = torch.empty(*((problem.batch,) if problem.batch > 1 else ()), problem.m, problem.n,
                          dtype=getattr(torch, _TORCH_DTYPE[c_label or a_label]), device=bench.device)
        if out.dtype == a.dtype:
            def run(_):
                torch.matmul(a, b, out=out)
        else:
            def run(_):
                torch.matmul(a, b).to(out.dtype)
    elif a_label == "int8" and problem.batch == 1:
        def run(_):
            torch._int_mm(a, b)
    elif a_label in _FP8 and problem.batch == 1:
        one = torch.ones((), device=bench.device)
        out_dtype = getattr(torch, _TORCH_DTYPE.get(c_label or "bfloat16", "bfloat16"))

        def run(_):
            torch._scaled_mm(a, b, one, one, out_dtype=out_dtype)
    else:
        return Measurement("failed", message=f"no torch baseline for {a_label} (batch {problem.batch})")
    try:
        samples, note = bench.time(run)
    except Exception as exc:  # e.g. _scaled_mm's layout rules: the row says why
        return Measurement("failed", message=f"{type(exc).__name__}: {exc}")
    finally:
        torch.backends.cuda.matmul.allow_tf32 = False
    median, minimum, iqr = summarize(samples)
    return Measurement("ok", median, minimum, iqr, len(samples), None, note)


# --- grouped GEMMs -----------------------------------------------------------------------------------------------
GROUPED_SAMPLED_ROWS = 64  # rows of every group checked against float64 (the whole product can take minutes)


def _grouped_operands(bench: GemmBench, problem, a_label, b_label, a_row: bool, b_row: bool):
    """One A (M x K) and B (K x N) per group, drawn on the GPU with the harness's seed; cached like GEMM inputs."""
    key = ("grouped", problem.key, a_label, b_label, a_row, b_row)
    found = bench._inputs.get(key)
    if found is None:
        with bench.clock.phase("inputs"):
            generator = bench.torch.Generator(device=bench.device).manual_seed(bench.config.seed * 1_000_003)
            As = [bench._matrix(m, k, a_row, a_label, generator, 1) for m, _, k in problem.shapes]
            Bs = [bench._matrix(k, n, b_row, b_label, generator, 1) for _, n, k in problem.shapes]
            bench.torch.cuda.synchronize(bench.device)
        found = (As, Bs)
        bench._inputs.put(key, found, sum(map(_nbytes, As)) + sum(map(_nbytes, Bs)))
    return found


def sampled_grouped_error(bench: GemmBench, As, Bs, Ds, activation=None) -> float:
    """Relative Frobenius error of ``Ds`` against float64 on up to GROUPED_SAMPLED_ROWS rows of every group."""
    torch = bench.torch
    generator = torch.Generator(device=bench.device).manual_seed(7)
    got, expected = [], []
    for a, b, d in zip(As, Bs, Ds):
        if a.shape[0] == 0 or b.shape[1] == 0:
            continue
        rows = torch.randperm(a.shape[0], generator=generator, device=bench.device)[:GROUPED_SAMPLED_ROWS]
        expected.append(activated(torch, a[rows].double() @ b.double(), activation).flatten())
        got.append(d[rows].double().flatten())
    if not got:
        return 0.0
    got, expected = torch.cat(got), torch.cat(expected)
    if not torch.isfinite(got).all():
        return math.inf
    scale = expected.norm().item()
    return (got - expected).norm().item() / scale if scale else (got - expected).norm().item()


def measure_grouped(bench: GemmBench, operation, problem, session=None) -> tuple[Measurement, dict | None]:
    """Verify a grouped operation (Sm80 family or SM90) on a GroupedGemmProblem once (float64 on sampled rows of every
    group, outputs poisoned with NaN first), then time one launch over all groups (host sizes)."""
    from ..kinds import GemmGroupedArguments
    from ..kinds.gemm.modes import GemmCoord

    a_label, b_label, c_label, a_row, b_row, c_row = operand_labels(operation)
    if operation.bias or operation.scales:
        return Measurement("failed", message="sweeps time grouped operations without a bias vector or row-wise "
                                             "scales"), None
    As, Bs = _grouped_operands(bench, problem, a_label, b_label, a_row, b_row)
    Ds = [bench.poisoned(m, n, c_row, c_label, 1) for m, n, _ in problem.shapes]
    with bench.clock.phase("load"):
        args = GemmGroupedArguments(operation, [GemmCoord(m, n, k) for m, n, k in problem.shapes], As, Bs, None, Ds,
                                    output_op=operation.epilogue_type(1.0, 0.0), session=session)
    rel_error = None
    if bench.config.verify:
        with bench.clock.phase("verify"):
            operation.run(args)
            args.sync()
            activation = getattr(operation.epilogue_functor, "activation", None)
            rel_error = sampled_grouped_error(bench, As, Bs, Ds, activation)
    return _verified_then_timed(bench, operation, args, rel_error, a_label, c_label)


def _verified_then_timed(bench: GemmBench, operation, args, rel_error, a_label, c_label, wrong: str | None = None):
    """A grouped measurement: "wrong" when the sampled check failed (or ``wrong`` says why), else one launch timed."""
    if rel_error is not None:
        tolerance = max(TOLERANCE.get(c_label, 5e-3), TOLERANCE.get(a_label, 0.0) if a_label in _FP8 else 0.0)
        if wrong or not rel_error <= tolerance:
            return Measurement("wrong", rel_error=rel_error, message=wrong or
                               f"relative error {rel_error:.3g} > tolerance {tolerance:g} (sampled rows)"), None
    samples, note = bench.time(lambda i: operation.run(args))
    median, minimum, iqr = summarize(samples)
    return Measurement("ok", median, minimum, iqr, len(samples), rel_error, note), None


def measure_masked(bench: GemmBench, operation, problem, session=None) -> tuple[Measurement, dict | None]:
    """Verify an SM90 grouped operation on a MaskedGroupedProblem once (A and D as (experts, capacity, columns), the
    counts on the device; float64 on sampled rows of every expert, every row past a count still NaN), then time one
    launch (the device-sizes kernel and the grouped kernel)."""
    from ..kinds import GemmGroupedArguments

    a_label, b_label, c_label, a_row, b_row, c_row = operand_labels(operation)
    if operation.family != "sm90" or not (a_row and c_row):
        return Measurement("failed", message="the masked layout runs on SM90 grouped operations with row-major A "
                                             "and C"), None
    if operation.bias or operation.scales:
        return Measurement("failed", message="sweeps time grouped operations without a bias vector or row-wise "
                                             "scales"), None
    torch = bench.torch
    experts, capacity, n, k = problem.experts, problem.capacity, problem.n, problem.k
    key = ("masked", problem.key, a_label, b_label, b_row)
    found = bench._inputs.get(key)
    if found is None:
        with bench.clock.phase("inputs"):
            generator = torch.Generator(device=bench.device).manual_seed(bench.config.seed * 1_000_003)
            A = bench._matrix(capacity, k, True, a_label, generator, experts).reshape(experts, capacity, k)
            B = bench._matrix(k, n, b_row, b_label, generator, experts)
            B = B if experts > 1 else B[None]
            counts = torch.tensor(problem.counts, dtype=torch.int32, device=bench.device)
            torch.cuda.synchronize(bench.device)
        found = (A, B, counts)
        bench._inputs.put(key, found, _nbytes(A) + _nbytes(B))
    A, B, counts = found
    D = bench.poisoned(capacity, n, True, c_label, experts).reshape(experts, capacity, n)
    with bench.clock.phase("load"):
        args = GemmGroupedArguments(operation, counts, A, B, None, D, output_op=operation.epilogue_type(1.0, 0.0),
                                    session=session)
    rel_error = None
    if bench.config.verify:
        with bench.clock.phase("verify"):
            operation.run(args)
            args.sync()
            busy = [e for e, count in enumerate(problem.counts) if count]
            activation = getattr(operation.epilogue_functor, "activation", None)
            rel_error = sampled_grouped_error(bench, [A[e, :problem.counts[e]] for e in busy], [B[e] for e in busy],
                                              [D[e, :problem.counts[e]] for e in busy], activation)
            written_past = c_label not in _INTEGER and any(
                not bool(D[e, count:].isnan().all()) for e, count in enumerate(problem.counts))
            args.check_sizes()
    wrong = "rows past an expert's count were written" if rel_error is not None and written_past else None
    return _verified_then_timed(bench, operation, args, rel_error, a_label, c_label, wrong)


def packed_problem(problem):
    """The contiguous grouped problem of a masked one: the experts that received tokens, each with M = its count
    (what torch's grouped GEMM computes for the same routing)."""
    from .problems import GroupedGemmProblem

    return GroupedGemmProblem(tuple((count, problem.n, problem.k) for count in problem.counts if count) or
                              ((0, problem.n, problem.k),))


def measure_torch_grouped(bench: GemmBench, problem, a_label: str, c_label: str | None = None) -> Measurement:
    """The grouped baseline, timed by the same harness: ``torch._grouped_mm`` (one packed A, a (groups, K, N) B,
    offsets) where it serves the problem with its CUTLASS kernel (bfloat16, every group of one N and K; for other
    types torch loops over the groups on the host after reading the offsets back, measured at 117-129 us for four
    small f16 groups that take 12.6 us on one grouped kernel), else a loop of torch.matmul over the groups
    replayed from a CUDA graph (its kernels back to back, without the host's gaps)."""
    torch = bench.torch
    if a_label not in ("float16", "bfloat16", "float32", "tfloat32"):
        return Measurement("failed", message=f"no torch grouped baseline for {a_label}")
    c_label = c_label or a_label
    As, Bs = _grouped_operands(bench, problem, a_label, a_label, True, False)
    shapes = problem.shapes
    same_nk = len({(n, k) for _, n, k in shapes}) == 1
    grouped_mm = getattr(torch, "_grouped_mm", None)
    allowed = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = a_label == "tfloat32"
    try:
        if grouped_mm is not None and same_nk and a_label == c_label == "bfloat16":
            A = torch.cat(As)
            B3 = torch.stack([b.t() for b in Bs]).transpose(1, 2)  # (groups, K, N), each column-major
            offsets = torch.tensor(list(itertools.accumulate(m for m, _, _ in shapes)), dtype=torch.int32,
                                   device=bench.device)
            try:
                grouped_mm(A, B3, offs=offsets)
                samples, note = bench.time(lambda i: grouped_mm(A, B3, offs=offsets))
                median, minimum, iqr = summarize(samples)
                return Measurement("ok", median, minimum, iqr, len(samples), None, "torch._grouped_mm")
            except Exception:  # noqa: BLE001 - a GPU or torch without this form: the loop below
                pass
        outs = [torch.empty(m, n, dtype=getattr(torch, _TORCH_DTYPE[c_label]), device=bench.device)
                for m, n, _ in shapes]
        stream = torch.cuda.Stream(bench.device)
        stream.wait_stream(torch.cuda.current_stream(bench.device))

        def loop():
            for a, b, out in zip(As, Bs, outs):
                if out.dtype == a.dtype:
                    torch.matmul(a, b, out=out)
                else:
                    out.copy_(torch.matmul(a, b))

        with torch.cuda.stream(stream):
            loop()  # warm-up outside the capture (cuBLAS picks its kernels and workspace here)
        stream.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            loop()
        samples, note = bench.time(lambda i: graph.replay())
    except Exception as exc:  # the row says why
        return Measurement("failed", message=f"{type(exc).__name__}: {exc}")
    finally:
        torch.backends.cuda.matmul.allow_tf32 = allowed
    median, minimum, iqr = summarize(samples)
    return Measurement("ok", median, minimum, iqr, len(samples), None, "loop of torch.matmul (CUDA graph)")


# --- convolutions ---------------------------------------------------------------------------------------------------
def _conv_operands(bench: GemmBench, problem, conv_kind: str, a_label: str, b_label: str):
    """A and B of ``conv_kind`` on ``problem`` as NHWC / KRSC tensors (fprop x, w; dgrad dy, w; wgrad dy, x)."""
    key = ("conv2d", problem.key, conv_kind, a_label, b_label)
    found = bench._inputs.get(key)
    if found is None:
        from ..kinds.families.conv import Operator

        kind = Operator[conv_kind]
        size = problem.to_problem_size()
        with bench.clock.phase("inputs"):
            generator = bench.torch.Generator(device=bench.device).manual_seed(bench.config.seed * 1_000_003)
            a = bench._random(tuple(size.tensor_a_extent(kind)), a_label, generator)
            b = bench._random(tuple(size.tensor_b_extent(kind)), b_label, generator)
            bench.torch.cuda.synchronize(bench.device)
        found = (a, b)
        bench._inputs.put(key, found, _nbytes(a) + _nbytes(b))
    return found


def _conv_call(torch, problem, conv_kind: str, a, b, dtype=None):
    """torch's own convolution for ``conv_kind`` on NHWC/KRSC ``a`` and ``b`` (viewed channels-last, no copies), in
    ``dtype`` (the operands' when None); returns the result as NHWC / KRSC."""
    import torch.nn.functional as F

    def nchw(t):
        return t.permute(0, 3, 1, 2) if dtype is None else t.permute(0, 3, 1, 2).to(dtype)

    options = {"stride": problem.stride, "padding": problem.pad, "dilation": problem.dilation}
    if conv_kind == "fprop":
        out = F.conv2d(nchw(a), nchw(b), **options)
    elif conv_kind == "dgrad":
        out = torch.nn.grad.conv2d_input((problem.n, problem.c, problem.h, problem.w), nchw(b), nchw(a), **options)
    else:
        out = torch.nn.grad.conv2d_weight(nchw(b), (problem.k, problem.c, problem.r, problem.s), nchw(a), **options)
    return out.permute(0, 2, 3, 1)


def measure_conv(bench: GemmBench, operation, problem, session=None) -> tuple[Measurement, dict | None]:
    """Verify a Conv2d operation (Sm80 family or SM90; its own fprop, dgrad or wgrad) on a Conv2dProblem once
    against torch's convolution in float64 (outputs poisoned with NaN first), then time it (serial, no split-K)."""
    from ..kinds import Conv2dArguments

    conv_kind = operation.conv_kind.name
    a_label, b_label, c_label, *_ = operand_labels(operation)
    if a_label not in ("float16", "bfloat16", "float32", "tfloat32", "float64"):
        return Measurement("failed", message=f"sweeps time {a_label} convolutions with benchmarks/conv2d.py"), None
    if operation.bias:
        return Measurement("failed", message="sweeps time convolutions without a bias vector"), None
    a, b = _conv_operands(bench, problem, conv_kind, a_label, b_label)
    size = problem.to_problem_size()
    d = bench.torch.full(tuple(size.tensor_c_extent(operation.conv_kind)), float("nan"),
                         dtype=getattr(bench.torch, _TORCH_DTYPE[c_label]), device=bench.device)
    with bench.clock.phase("load"):
        args = Conv2dArguments(operation, size, a, b, None, d, operation.epilogue_type(1.0, 0.0), session=session)
    rel_error = None
    if bench.config.verify:
        with bench.clock.phase("verify"):
            operation.run(args)
            args.sync()
            # held with its operands (as GemmBench.reference does), so their memory is never reused under the key
            key = ("conv2d", problem.key, conv_kind, a.data_ptr(), b.data_ptr())
            found = bench._references.get(key)
            if found is None:
                with bench.clock.phase("reference"):
                    reference = _conv_call(bench.torch, problem, conv_kind, a, b, bench.torch.float64).contiguous()
                bench._references.put(key, (reference, a, b), _nbytes(reference))
            else:
                reference = found[0]
            reference = activated(bench.torch, reference, getattr(operation.epilogue_functor, "activation", None))
            rel_error = relative_error(d, reference)
        tolerance = TOLERANCE.get(c_label, 5e-3)
        if not rel_error <= tolerance:
            return Measurement("wrong", rel_error=rel_error,
                               message=f"relative error {rel_error:.3g} > tolerance {tolerance:g}"), None
    samples, note = bench.time(lambda i: operation.run(args))
    median, minimum, iqr = summarize(samples)
    return Measurement("ok", median, minimum, iqr, len(samples), rel_error, note), kernel_resources(args)


def measure_torch_conv(bench: GemmBench, problem, conv_kind: str, a_label: str) -> Measurement:
    """The convolution baseline: torch's conv2d / its input and weight gradients (cuDNN) on the same NHWC operands,
    channels-last, in the operands' type, timed by the same harness."""
    if conv_kind not in ("fprop", "dgrad", "wgrad"):
        return Measurement("failed", message=f"unknown convolution kind {conv_kind!r}")
    if a_label not in ("float16", "bfloat16", "float32", "tfloat32"):
        return Measurement("failed", message=f"no torch convolution baseline for {a_label}")
    torch = bench.torch
    a, b = _conv_operands(bench, problem, conv_kind, a_label, a_label)
    allowed = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = a_label == "tfloat32"
    try:
        samples, note = bench.time(lambda i: _conv_call(torch, problem, conv_kind, a, b))
    except Exception as exc:  # the row says why
        return Measurement("failed", message=f"{type(exc).__name__}: {exc}")
    finally:
        torch.backends.cudnn.allow_tf32 = allowed
    median, minimum, iqr = summarize(samples)
    return Measurement("ok", median, minimum, iqr, len(samples), None, note)


def measure_kernel(bench: GemmBench, operation, problem, session=None) -> tuple[Measurement, dict | None]:
    """``measure_gemm``, ``measure_grouped`` or ``measure_conv``, by the problem's kind."""
    measure = {"grouped_gemm": measure_grouped, "masked_grouped_gemm": measure_masked,
               "conv2d": measure_conv}.get(problem.kind, measure_gemm)
    return measure(bench, operation, problem, session)


def measure_baseline(bench: GemmBench, problem, a_label: str, c_label: str, conv_kind: str | None = None
                     ) -> Measurement:
    """torch's own computation of the problem (``measure_torch``, ``measure_torch_grouped`` or
    ``measure_torch_conv``, by its kind), timed by the same harness."""
    if problem.kind == "conv2d":
        return measure_torch_conv(bench, problem, conv_kind, a_label)
    if problem.kind == "grouped_gemm":
        return measure_torch_grouped(bench, problem, a_label, c_label=c_label)
    if problem.kind == "masked_grouped_gemm":  # torch has no masked form: the same counts packed
        return measure_torch_grouped(bench, packed_problem(problem), a_label, c_label=c_label)
    return measure_torch(bench, problem, a_label, c_label=c_label)


def kernel_resources(args) -> dict | None:
    """Registers, spills, shared memory and occupancy of the kernel an Arguments object launches."""
    try:
        from cuda.bindings import driver as cu

        launch = args.prepared()
        loaded_op = args._loaded_op
        attr = cu.CUfunction_attribute

        def get(name):
            err, value = cu.cuFuncGetAttribute(getattr(attr, name), loaded_op.kernel)
            return int(value) if err == cu.CUresult.CUDA_SUCCESS else None

        threads = launch.block[0] * launch.block[1] * launch.block[2]
        facts = {"registers": get("CU_FUNC_ATTRIBUTE_NUM_REGS"), "local_bytes": get("CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES"),
                 "static_smem": get("CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES"), "dynamic_smem": launch.shared_memory_bytes,
                 "threads": threads}
        try:
            blocks = loaded_op.occupancy(threads, launch.shared_memory_bytes)
            facts["max_active_blocks"] = blocks
            props = args.device
            max_threads = getattr(props, "max_threads_per_sm", 2048)
            facts["occupancy"] = blocks * threads / max_threads
        except Exception:  # cluster kernels: the occupancy API needs the cluster launch config
            pass
        return facts
    except Exception:
        return None
