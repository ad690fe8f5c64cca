"""Tuning recorded torch calls: compile every candidate at once, check each against torch, time each beside torch.

An SM90 GEMM layer's candidates are the ``top_k`` configurations of the SM90 grid ranked best for its shape
(``kernels.ranked_gemm_candidates``); the union over the layers compiles once. Other classes use the fixed sets.
``max_compiles`` caps what compiles from a cold kernel cache (an SM90 candidate costs 20-50 s of one core): by
default one round of the parallel compile, shared out by work across the layers (:func:`within_budget`), while
candidates already in the kernel cache always count.

Inputs are random normal tensors with the recorded shapes and strides (so layouts and channels_last survive).
A candidate counts only if its result (into memory left NaN) is within the dtype's tolerance of torch's; timings
are medians of CUDA-event samples with L2 flushed and a device sleep before each (the sweep harness's
``GemmBench.time``), so each is the kernel's GPU time and not its launch's host latency. torch is timed as eager
code would run the same layer (``addmm`` / ``conv2d`` then the activation), so "faster than torch" means faster than
the model it replaces.
"""
from __future__ import annotations

import contextlib
import math
import statistics

import torch

from ..compiler.manager import Compiler
from ..tune.autotune import DEFAULT_TOP_K
from ..errors import ArgumentError
from ..tune.sweep import cached_operation_names, default_jobs
from . import kernels, reference
from .calls import TOLERANCE, TORCH, Choice


def _inputs(call, generator):
    tensors = []
    for spec in call.specs:
        if spec is None:
            tensors.append(None)
            continue
        shape, stride, dtype = spec
        t = torch.empty_strided(shape, stride, dtype=dtype, device=f"cuda:{call.device}")
        values = torch.randn(t.shape, generator=generator, dtype=torch.float32).to(t.device)
        t.copy_(values)
        tensors.append(t)
    return tensors


def _run(dispatch, call, tensors, kernel: str):
    if call.op == "gemm":
        a, b, bias, c = tensors
        alpha, beta, activation, arg = call.scalars
        return dispatch.gemm(a, b, bias, c, alpha, beta, activation, arg, kernel)
    first, second, bias = tensors
    activation, arg, input_size, weight_size = call.scalars
    stride, padding, dilation = call.problem[7:10]
    if call.op == "conv2d":
        return dispatch.conv2d(first, second, bias, stride, padding, dilation, activation, arg, kernel)
    if call.op == "conv2d_dgrad":
        return dispatch.conv2d_dgrad(first, second, input_size, stride, padding, dilation, kernel)
    return dispatch.conv2d_wgrad(first, second, weight_size, stride, padding, dilation, kernel)


def _eager(call, tensors):
    """What an eager model runs for this call."""
    if call.op == "gemm":
        return reference.eager_gemm(*tensors, *call.scalars)
    first, second, bias = tensors
    activation, arg, input_size, weight_size = call.scalars
    stride, padding, dilation = call.problem[7:10]
    if call.op == "conv2d":  # (each: what the dispatch runs when torch is the choice)
        return reference.eager_conv2d(first, second, bias, stride, padding, dilation, activation, arg)
    if call.op == "conv2d_dgrad":
        return reference.conv2d_dgrad(first, second, input_size, stride, padding, dilation)
    return reference.conv2d_wgrad(first, second, weight_size, stride, padding, dilation)


def _reference(call, tensors):
    if call.op == "gemm":
        a, b, bias, c = tensors
        return reference.gemm(a, b, bias, c, *call.scalars)
    if call.op == "conv2d":
        first, second, bias = tensors
        activation, arg = call.scalars[:2]
        stride, padding, dilation = call.problem[7:10]
        return reference.conv2d(first.float(), second.float(), None if bias is None else bias.float(), stride,
                                padding, dilation, activation, arg)
    wide = [None if t is None else t.float() for t in tensors]
    return _eager(call, wide)


def _close(out, expected, dtype) -> bool:
    out, expected = out.float(), expected.float()
    if not torch.isfinite(out).all():
        return False
    scale = expected.abs().max().item() or 1.0
    return (out - expected).abs().max().item() <= TOLERANCE.get(dtype, 2e-2) * scale


_LEAD_US = 200.0  # longer than the host needs to enqueue one call on a slow host (F.linear: ~40 us)


def call_candidates(dispatch, calls, top_k: int | None = DEFAULT_TOP_K) -> dict:
    """call key -> [(params, operation)]: a ranked draw per SM90 GEMM layer, the class's fixed set otherwise. Drawn
    operations are registered with the dispatch, so a call can name them."""
    grids, found = {}, {}
    for call in calls:
        cls = call.cls
        if isinstance(cls, kernels.GemmClass) and cls.sm90:
            if cls not in grids:
                grids[cls] = kernels.sm90_grid(cls)
            drawn = kernels.ranked_gemm_candidates(cls, call.problem, top_k, grids[cls]) if grids[cls] else []
        else:
            drawn = []
        if not drawn:
            drawn = dispatch.candidates(cls)
        for params, operation in drawn:
            dispatch.register_kernel(operation, params)
        found[call.key] = drawn
    return found


def check_max_compiles(max_compiles):
    if max_compiles is None or max_compiles == "auto":
        return max_compiles
    if isinstance(max_compiles, bool) or not isinstance(max_compiles, int) or max_compiles < 1:
        raise ArgumentError(f"max_compiles must be 'auto' (one round of the parallel compile), a positive int or "
                            f"None (every layer's top_k candidates), got {max_compiles!r}")
    return max_compiles


def within_budget(drawn: dict, weights: dict, cached: set[str], budget: int | None) -> dict:
    """Each call's candidates cut so that at most ``budget`` operations outside the kernel cache compile.

    ``drawn``: call key -> ranked [(params, operation)]; ``weights``: call key -> its share of the work (flops times
    calls). Every call keeps its best-ranked candidate, even past the budget (a call without one could not be
    tuned). The rest of the budget is shared out by work: the next candidate goes to the call with the most work
    per candidate it already has (so a classifier head of 0.01% of the flops gets no second pick while the MLP
    gets several). Candidates in the kernel cache, or already chosen for another call, cost no compile and
    always stay; each call's candidates keep their rank order."""
    if budget is None:
        return drawn
    kept = {key: [] for key in drawn}
    taken = {key: 0 for key in drawn}  # how far down its ranking each call has been read
    chosen: set[str] = set()
    compiles = 0

    def take(key, first: bool) -> None:
        nonlocal compiles
        params, operation = drawn[key][taken[key]]
        taken[key] += 1
        free = operation.name in cached or operation.name in chosen
        if free or first or compiles < budget:
            compiles += not free
            chosen.add(operation.name)
            kept[key].append((params, operation))

    for key in drawn:
        if drawn[key]:
            take(key, first=True)
    while True:
        live = [key for key in drawn if taken[key] < len(drawn[key])]
        if not live:
            return kept
        take(max(live, key=lambda k: weights.get(k, 0.0) / (len(kept[k]) + 1)), first=False)


def _work(call) -> float:
    """A call's multiply-adds up to a constant: m*n*k for a GEMM, n*h*w*c*k*r*s for a convolution."""
    sizes = call.problem[:3] if call.op == "gemm" else call.problem[:7]
    return float(math.prod(int(v) for v in sizes)) if sizes else 0.0


def tune_calls(dispatch, calls, *, jobs, progress, prefer_faster, repetitions,
               top_k: int | None = DEFAULT_TOP_K, max_compiles="auto", timed=None) -> list[Choice]:
    max_compiles = check_max_compiles(max_compiles)
    timed = timed or (lambda phase: contextlib.nullcontext())
    jobs = jobs or default_jobs()
    by_key, weights = {}, {}
    for call in calls:
        by_key.setdefault(call.key, call)
        weights[call.key] = weights.get(call.key, 0.0) + _work(call)
    todo = [call for key, call in by_key.items() if dispatch.lookup(key) is None]
    with timed("rank"):
        drawn = call_candidates(dispatch, todo, top_k)
        if max_compiles is not None:
            every = {op.name: op for ranked in drawn.values() for _, op in ranked}.values()
            cached = cached_operation_names(list(every), dispatch.session)
            drawn = within_budget(drawn, weights, cached, jobs if max_compiles == "auto" else max_compiles)
    operations = {}
    for call in todo:
        for _, operation in drawn[call.key]:
            operations.setdefault(operation.name, operation)
    with timed("compile"):
        failed = _compile(Compiler.of(dispatch.session), list(operations.values()), jobs)
    with timed("tune"):
        _check_and_time(dispatch, todo, drawn, failed, progress, prefer_faster, repetitions)
    results = []
    for call in calls:
        choice = dispatch.lookup(call.key) or {}
        results.append(Choice(call, choice.get("kernel", "-"), choice.get("us"), choice.get("torch_us")))
    return results


def _check_and_time(dispatch, todo, drawn, failed, progress, prefer_faster, repetitions) -> None:
    """Each call's compiled candidates checked against float64 and timed beside torch; the choices go to the
    dispatch."""
    from ..tune.bench import BenchConfig, GemmBench

    bar = _progress(todo, progress)
    # Kernel time on the GPU, not launch latency: a device sleep before each timed launch lets the host enqueue it
    # first (without it a small GEMM's time is mostly the host's, and the choice between kernels is noise).
    config = BenchConfig(warmup=3, repetitions=repetitions, max_seconds=0.5, lead_us=_LEAD_US)
    benches = {}
    generator = torch.Generator().manual_seed(0)
    for call in bar:
        bench = benches.get(call.device)
        if bench is None:
            bench = benches[call.device] = GemmBench(config, call.device)
        with torch.cuda.device(call.device):
            choice = _tune_one(dispatch, call, drawn[call.key], bench, generator, failed, prefer_faster)
        dispatch.set_choice(call.key, choice, len(drawn[call.key]))


def _compile(compiler, operations, jobs) -> set[str]:
    """Compile in parallel units (``jobs``, or as a sweep does, one per core that memory allows); a failed unit is
    retried one operation at a time to find the culprits."""
    failed = set()
    if not operations:
        return failed
    report = compiler.add_module(operations, jobs=jobs or default_jobs(), errors="report")
    for unit_ops, _ in report.failures:
        for operation in unit_ops:
            if compiler.add_module([operation], jobs=1, errors="report").failures:
                failed.add(operation.name)
    return failed


def _median_us(bench, fn) -> float:
    samples, _ = bench.time(lambda i: fn())
    return statistics.median(samples) * 1e6


def _poison_like(expected) -> None:
    """Leave NaN in the memory block the next allocation of ``expected``'s size gets (torch's caching allocator hands
    a freed block of that size out again), so a candidate that leaves part of its output unwritten fails the check
    instead of inheriting the previous candidate's correct values."""
    torch.empty_like(expected).fill_(float("nan"))


def _tune_one(dispatch, call, candidates, bench, generator, failed, prefer_faster) -> dict:
    tensors = _inputs(call, generator)
    expected = _reference(call, tensors)
    torch_us = _median_us(bench, lambda: _eager(call, tensors))
    timings = {}
    for params, operation in candidates:
        if operation.name in failed:
            continue
        try:
            _poison_like(expected)
            out = _run(dispatch, call, tensors, operation.name)
            if not _close(out, expected, call.specs[0][2]):
                continue
            timings[operation.name] = (_median_us(bench, lambda: _run(dispatch, call, tensors, operation.name)),
                                       params)
        except Exception:  # noqa: BLE001 - a candidate that cannot run this call is not a choice
            continue
    if not timings:
        return {"kernel": TORCH, "params": None, "us": None, "torch_us": torch_us, "candidates": 0}
    best = min(timings, key=lambda name: timings[name][0])
    us, params = timings[best]
    choice = {"kernel": best, "params": params, "us": us, "torch_us": torch_us, "candidates": len(timings)}
    if prefer_faster and torch_us < us:
        choice = {**choice, "kernel": TORCH, "best_kernel": best}
    return choice


def _progress(items, enabled: bool):
    if not enabled:
        return items
    from tqdm import tqdm

    return tqdm(items, desc="pycutlass.torch tune", unit="shape")
