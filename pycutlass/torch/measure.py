"""Measuring a rewritten model: its calls tuned (each recorded with the layer it came from), then the end-to-end check
that times whole forwards of a few placements of its layers (and, if asked, its CUDA-graph replay) and keeps the
fastest."""
from __future__ import annotations

import contextlib
import copy
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.fx as fx
import torch.nn as nn

from .calls import TORCH
from .graphs import CUDAGraphed
from .layers import CutlassConv2d, CutlassLinear
from .match import _Evaluating
from .optimize_report import OptimizeReport


def _tensors(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []


@dataclass(frozen=True, eq=False)
class _Site:
    """A tuned call of a fused module: the module, its input shape on the example inputs, and the tuning's choice."""
    module: nn.Module
    shape: tuple
    choice: Any

    @property
    def on_torch(self) -> tuple:
        """What putting this call on torch adds to a candidate: (module, shape), the module's ``eager_shapes`` key."""
        return (self.module, self.shape)


def _tune(gm: fx.GraphModule, example_inputs: tuple, dispatch, jobs, progress: bool,
          prefer_faster: bool, max_compiles, timed) -> tuple[list, list[_Site]]:
    """Runs the model once, recording each op call with the layer it came from, and tunes the recorded calls;
    returns the choices and the calls of fused modules among them. ``timed(phase)``: a context manager that
    accounts the phases' wall time (``OptimizeReport.timed``)."""
    fused = [m for m in gm.modules() if isinstance(m, (CutlassLinear, CutlassConv2d))]
    owners: dict[int, tuple] = {}  # id(call) -> (module, input shape), to give torch's layers torch's own call
    first_call: dict[int, int] = {}  # id(module) -> index of its first call in collector.calls
    with dispatch.collecting() as collector:
        def enter(module, args):
            collector.layer = module.layer
            first_call[id(module)] = len(collector.calls)

        def leave(module, args, output):  # ops the model calls itself belong to no layer
            collector.layer = ""
            for call in collector.calls[first_call.pop(id(module)):]:
                owners[id(call)] = (module, tuple(args[0].shape))

        hooks = [h for m in fused for h in (m.register_forward_pre_hook(enter), m.register_forward_hook(leave))]
        try:
            with timed("record"), _Evaluating(gm), torch.no_grad():
                gm(*example_inputs)
        finally:
            for hook in hooks:
                hook.remove()
    choices = dispatch.tune_calls(collector.calls, jobs=jobs, progress=progress, prefer_faster=prefer_faster,
                                  max_compiles=max_compiles, timed=timed)
    sites = [_Site(*owners[id(choice.call)], choice) for choice in choices if id(choice.call) in owners]
    # A host-bound model feels every microsecond: where torch won, the layer calls torch itself for that shape
    # (other shapes still go through the dispatch and its tuning table).
    for site in sites:
        if site.choice.kernel == TORCH:
            site.module.eager_shapes.add(site.shape)
    return choices, sites


def _fill_rows(report: OptimizeReport, choices: list) -> dict[int, dict]:
    """Puts each tuned call's choice on its row: calls come in execution order, which for fx is graph order.
    Returns id(call) -> its row."""
    pending: dict[str, list[dict]] = {}
    by_call: dict[int, dict] = {}
    for row in report.rows:
        pending.setdefault(row["layer"], []).append(row)
    for choice in choices:
        call = choice.call
        rows = pending.get(call.layer or "")
        if rows:
            row = rows.pop(0)
        else:  # a pycutlass op the model calls itself
            row = {"layer": call.layer or "-", "op": call.op, "pattern": call.op, "shape": call.describe()}
            report.rows.append(row)
        cutlass_us, torch_us = getattr(choice, "cutlass_us", None), getattr(choice, "torch_us", None)
        row.update(kernel=choice.kernel, cutlass_us=cutlass_us, torch_us=torch_us,
                   speedup=torch_us / cutlass_us if cutlass_us and torch_us else None)
        by_call[id(call)] = row
    return by_call


# --- the end-to-end check -------------------------------------------------------------------------------------------
# Tuning times each kernel's GPU time; a host-bound model (small inputs) is paced by the host instead, where a
# pycutlass call costs a few microseconds more than torch's. So the pass times whole forwards of a few placements
# (which layers call torch directly) and keeps the fastest.
_E2E_MIN_GAIN = 1.10  # "selective": a kernel this much faster than torch (GPU time) is worth its host cost
_E2E_TUNED, _E2E_SELECTIVE, _E2E_TORCH, _E2E_EAGER = "tuned", "selective", "torch", "eager"
# The pure-torch fallbacks: "eager" (the model itself, returned as a shallow copy) and "traced" (the model as
# torch.fx traced it: no per-layer dispatch check, nested modules' calls flattened, but fx's call wrapper costs a few
# microseconds). Each step away from eager must win by _E2E_MARGIN, the check's own timing noise on a busy host
# (traced by _E2E_TRACED_MARGIN), and a kernel placement must beat the better of the two. Ties go to torch.
_E2E_TRACED = "traced"
_E2E_MARGIN = 0.02
# An A/A control: eager timed a second time in the same rounds. Its per-round deviation from eager (the median of
# |control / eager - 1|) is what this host's noise does to one round; a kernel placement must lead by
# _E2E_NOISE_FACTOR times that too. On a host-bound model a round is one or two forwards: on the H100 host, the
# benchmark timing eager against itself read 0.91-1.16x; a 4% lead in the check became 0.88x a minute later (GPT-2
# 1x128), and with a margin of once the noise, a 2.4% lead at 2.4% noise became 0.93x (MLP 1x128). GPU-bound rows
# led by 5-65% at 0.2-4.9% noise in the same runs.
_E2E_CONTROL = "eager (control)"
_E2E_NOISE_FACTOR = 2.0
# The trace runs the same torch calls as eager: where it timed faster, that was mostly the host's noise (paired
# per-call latencies on the H100 host put it 3-8% behind eager on GPT-2 at 1x128 and 8x512), so it must win clearly.
_E2E_TRACED_MARGIN = 0.10
_E2E_MOVED = "torch (end-to-end)"
# A CUDA-graph replay changes how the result behaves (autograd calls bypass it, a new input shape captures again),
# and its own cost (input copy, replay, output copy) is host time that varies from round to round as much as a tiny
# model's: it must win clearly. Where it matters (many layers, small inputs) it wins by 2x or more.
_GRAPHS_MARGIN = 0.10


def _saves_a_launch(module: nn.Module) -> bool:
    """The fused module does in one call what its torch path does in two: an activation or a residual add."""
    return module.activation != "identity" or "residual" in module.pattern


def _end_to_end_candidates(sites: list[_Site]) -> dict[str, frozenset]:
    """Placements to time, each the set of (module, shape) calls that go to torch directly: ``tuned``, ``selective``
    where it differs from both others, ``torch`` where it differs from ``tuned``. Each contains the tuned one's: no
    candidate puts a layer torch won back on a kernel."""
    def placement(keep_kernel: Callable[[_Site], bool]) -> frozenset:
        return frozenset(site.on_torch for site in sites if not keep_kernel(site))

    def worth_it(site: _Site) -> bool:
        choice = site.choice
        if choice.kernel in (TORCH, "-"):  # ("-": no kernel serves the call, the dispatch falls back to torch)
            return False
        gain = choice.torch_us / choice.cutlass_us if choice.cutlass_us and choice.torch_us else 0.0
        return gain >= _E2E_MIN_GAIN or _saves_a_launch(site.module)

    tuned = placement(lambda site: site.choice.kernel != TORCH)
    selective, everything = placement(worth_it), placement(lambda site: False)
    found = {_E2E_TUNED: tuned}
    if selective not in (tuned, everything):
        found[_E2E_SELECTIVE] = selective
    if everything != tuned:
        found[_E2E_TORCH] = everything
    return found


def _place_calls(sites: list[_Site], on_torch: frozenset) -> None:
    """Sets every tuned module's ``eager_shapes`` for the shapes it was tuned on to ``on_torch``'s (other shapes
    keep theirs)."""
    for site in sites:
        if site.on_torch in on_torch:
            site.module.eager_shapes.add(site.shape)
        else:
            site.module.eager_shapes.discard(site.shape)


def _time_interleaved(entries: dict[str, tuple[Callable, Callable]], sync: Callable[[], None], *, rounds: int = 41,
                      round_s: float = 0.005, budget_s: float = 3.0,
                      spread: dict[str, float] | None = None) -> dict[str, float]:
    """Ms per forward of each entry (``(prepare, forward)``), paired with the first entry (the reference): the
    reference's median over rounds times the median over rounds of each entry's time over the reference's time in
    the same round. A host's speed drifts by tens of percent within a second; short interleaved rounds in
    alternating order (none always runs first) put every entry in the same moments, and the per-round ratio cancels
    the drift that a ratio of medians keeps. A round runs ``prepare`` then as many forwards as last about
    ``round_s`` (at least one), synchronized (``sync``) so the GPU's time counts too. Rounds stop early once
    ``budget_s`` is spent (after three at least). ``spread``, if given, receives each entry's median over rounds of
    |its time / the reference's - 1|: how far one round strays."""
    per_round = {}
    for name, (prepare, forward) in entries.items():
        prepare()
        forward()  # warm-up: binds kernels and launch plans
        sync()
        start = time.perf_counter()
        forward()
        sync()
        per_round[name] = max(1, min(1000, int(round_s / max(time.perf_counter() - start, 1e-6))))
    samples: dict[str, list[float]] = {name: [] for name in entries}
    deadline = time.perf_counter() + budget_s
    names = list(entries)
    for index in range(rounds):
        for name in names if index % 2 == 0 else reversed(names):  # alternating: no entry always runs first
            prepare, forward = entries[name]
            prepare()
            sync()
            start = time.perf_counter()
            for _ in range(per_round[name]):
                forward()
            sync()
            samples[name].append((time.perf_counter() - start) * 1e3 / per_round[name])
        if index >= 2 and time.perf_counter() > deadline:
            break
    reference = samples[names[0]]
    base = statistics.median(reference)
    if spread is not None:
        spread.update({name: statistics.median(abs(mine / theirs - 1) for mine, theirs in zip(values, reference))
                       for name, values in samples.items()})
    return {name: base * statistics.median(mine / theirs for mine, theirs in zip(values, reference))
            for name, values in samples.items()}


def _cuda_sync(example_inputs: tuple, gm: nn.Module) -> Callable[[], None]:
    devices = {t.device for t in _tensors(example_inputs) + list(gm.parameters()) if t.device.type == "cuda"}

    def sync():
        for device in devices:
            torch.cuda.synchronize(device)
    return sync


def _serving_grad_mode():
    """The autograd mode end-to-end choices are timed in: the caller's own when it optimizes under
    ``torch.inference_mode()`` (calls there dispatch differently and can rank placements differently), else
    ``torch.no_grad()``."""
    return torch.inference_mode() if torch.is_inference_mode_enabled() else torch.no_grad()


def _choose_end_to_end(gm: fx.GraphModule, model: nn.Module, example_inputs: tuple, sites: list[_Site], *,
                       traced: fx.GraphModule | None = None, timer: Callable | None = None) -> tuple[dict, frozenset]:
    """Times ``model`` (eager), ``traced`` (the untouched trace, if given) and ``gm`` under each candidate placement
    on ``example_inputs`` and leaves ``gm`` with the fastest placement; returns the record
    (``OptimizeReport.end_to_end``; ``chosen == "traced"`` means the caller should return ``traced``) and the calls
    the choice moved to torch (every call for "traced"). ``timer(entries, sync) -> {name: ms}`` (default
    ``_time_interleaved``) is injectable for tests."""
    candidates = _end_to_end_candidates(sites)
    tuned = candidates[_E2E_TUNED]
    entries: dict[str, tuple[Callable, Callable]] = {_E2E_EAGER: (lambda: None, lambda: model(*example_inputs))}
    for name, on_torch in candidates.items():
        entries[name] = (lambda on_torch=on_torch: _place_calls(sites, on_torch), lambda: gm(*example_inputs))
    if traced is not None:
        entries[_E2E_TRACED] = (lambda: None, lambda: traced(*example_inputs))
    entries[_E2E_CONTROL] = entries[_E2E_EAGER]
    chosen, spread, margin = _E2E_TUNED, {}, _E2E_MARGIN
    try:
        with _Evaluating(model), _Evaluating(gm), _serving_grad_mode(), \
                (_Evaluating(traced) if traced is not None else contextlib.nullcontext()):
            sync = _cuda_sync(example_inputs, gm)
            medians = timer(entries, sync) if timer else _time_interleaved(entries, sync, spread=spread)
        margin = max(_E2E_MARGIN, _E2E_NOISE_FACTOR * spread.get(_E2E_CONTROL, 0.0))
        fallback = _E2E_EAGER
        if traced is not None and medians[_E2E_TRACED] < medians[_E2E_EAGER] * (1 - max(_E2E_TRACED_MARGIN, margin)):
            fallback = _E2E_TRACED
        chosen = min(candidates, key=lambda name: medians[name])  # ties: the earlier (fewer layers moved)
        if medians[chosen] >= medians[fallback] * (1 - margin):
            chosen = fallback
    finally:  # (also on Ctrl-C: the model is left as tuned)
        _place_calls(sites, candidates.get(chosen, tuned))
    timed = list(candidates) + ([_E2E_TRACED] if traced is not None else [])
    record = {"eager_ms": medians[_E2E_EAGER], "candidates": {name: medians[name] for name in timed},
              "chosen": chosen, "margin": margin}
    if _E2E_CONTROL in spread:
        record["noise"] = spread[_E2E_CONTROL]
    if chosen in (_E2E_TRACED, _E2E_EAGER):
        return record, frozenset(site.on_torch for site in sites) - tuned
    return record, candidates[chosen] - tuned


def _choose_graphs(chosen: nn.Module, example_inputs: tuple, *, timer: Callable | None = None
                   ) -> tuple[nn.Module, dict]:
    """``chosen`` or, where replaying it from a CUDA graph (:class:`CUDAGraphed`) was ``_GRAPHS_MARGIN`` faster on
    ``example_inputs``, the graphed module; and the record (``OptimizeReport.end_to_end["graphs"]``). A module that
    cannot be captured stays as it is (the record says why)."""
    graphed = CUDAGraphed(chosen)
    entries = {"plain": (lambda: None, lambda: chosen(*example_inputs)),
               "graphed": (lambda: None, lambda: graphed(*example_inputs))}
    try:
        with _Evaluating(chosen), _serving_grad_mode():
            medians = (timer or _time_interleaved)(entries, _cuda_sync(example_inputs, chosen))
    except Exception as exc:  # not capturable (a host sync, a CPU tensor made inside, ...): keep it unreplayed
        return chosen, {"kept": False, "why": f"capture failed ({type(exc).__name__}: {str(exc)[:200]})"}
    kept = medians["graphed"] < medians["plain"] * (1 - _GRAPHS_MARGIN)
    record = {"plain_ms": medians["plain"], "graphed_ms": medians["graphed"], "kept": kept}
    if not kept:
        graphed.reset()  # frees the captured graph's memory
        return chosen, record
    return graphed, record


def _shallow_copy(model: nn.Module) -> nn.Module:
    """A new module of ``model``'s class sharing its layers, parameters and buffers (so it costs what ``model`` costs
    per call), whose own attributes (a report, added or replaced submodules, hooks) do not touch ``model``."""
    twin = copy.copy(model)
    for name, value in vars(model).items():
        if isinstance(value, (dict, set, list)):  # _modules, _parameters, _buffers, the hook tables, ...
            twin.__dict__[name] = copy.copy(value)
    return twin


def _record_end_to_end(report: OptimizeReport, rows: dict[int, dict], sites: list[_Site], record: dict,
                       moved: frozenset) -> None:
    report.end_to_end = record
    for site in sites:
        row = rows.get(id(site.choice.call))
        if row is not None and site.on_torch in moved:
            row.update(kernel=_E2E_MOVED, tuned_kernel=site.choice.kernel)
    eager, times = record["eager_ms"], record["candidates"]
    chosen = eager if record["chosen"] == _E2E_EAGER else times[record["chosen"]]
    report.notes.append("end-to-end check (ms per forward on the example inputs, paired with eager): eager " + f"{eager:.3f}, " +
                        ", ".join(f"{name} {ms:.3f}" for name, ms in times.items()) +
                        f"; kept {record['chosen']!r} ({eager / chosen:.2f}x eager" +
                        (f", {len(moved)} more call(s) on torch)" if moved else ")") +
                        (f"; control: eager against itself strays {record['noise']:.1%} a round" if "noise" in record
                         else "") +
                        (f"; no placement of the kernels beat torch by {record.get('margin', _E2E_MARGIN):.1%}, so "
                         "the result runs torch "
                         "only" + (" (the model itself)" if record["chosen"] == _E2E_EAGER else " (fx-traced)")
                         if record["chosen"] in (_E2E_TRACED, _E2E_EAGER) else ""))
