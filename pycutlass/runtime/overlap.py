"""Outputs that share memory with what the kernel reads.

Tiles run in no fixed order, so a kernel that writes an output while other tiles still read an overlapping input
(D over A in ``A = A @ B``, a conv output over its activations, one group's D over another group's A) computes a
result that depends on scheduling: a silent wrong answer. Such calls are refused before anything launches.

One overlap is exact and allowed where a kind says so: an output that is the very same view as its epilogue source
(D is C, same address, shape and strides). Every element of C is read by the thread that then writes that element
of D, so updating in place is well defined.

Only device tensors are compared: host tensors are copied to the device one by one, so the kernel never sees two of
them in one allocation. Bounding byte ranges settle nearly every call; views whose ranges interleave (two column
blocks of one matrix) are decided exactly by ``numpy.shares_memory`` on stand-in arrays that carry the addresses and
strides (nothing is dereferenced).
"""
from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from ..errors import ArgumentError
from .tensors import TensorInfo

# Bounded search for interleaved views; past it the views are treated as overlapping (never seen for 2-4 dims).
_EXACT_WORK = 1 << 20
_TooHard = getattr(getattr(np, "exceptions", np), "TooHardError")


def byte_range(info: TensorInfo) -> tuple[int, int]:
    """[first, last + 1) bytes addressed by a device tensor (negative strides reach below its address)."""
    low = high = info.device_address
    for extent, stride in zip(info.shape, info.strides):
        reach = (extent - 1) * stride * info.itemsize
        if reach < 0:
            low += reach
        else:
            high += reach
    return low, high + info.itemsize


def same_geometry(a: TensorInfo, b: TensorInfo) -> bool:
    """Same element size, shape and strides, up to unit dimensions."""
    return a.itemsize == b.itemsize and _squeezed(a) == _squeezed(b)


def _same_view(a: TensorInfo, b: TensorInfo) -> bool:
    return a.device_address == b.device_address and same_geometry(a, b)


def _squeezed(info: TensorInfo) -> tuple:
    """Shape and strides without unit dimensions: (1, M, N) and (M, N) views of one matrix are the same view."""
    return tuple((n, s) for n, s in zip(info.shape, info.strides) if n != 1)


class _StandIn:
    """An ndarray's interface for a device tensor's address and strides, so numpy can reason about its bytes."""

    def __init__(self, info: TensorInfo):
        self.__array_interface__ = {
            "version": 3, "shape": tuple(info.shape), "typestr": f"|V{info.itemsize}",
            "strides": tuple(s * info.itemsize for s in info.strides), "data": (info.device_address, True)}


def share_memory(a: TensorInfo, b: TensorInfo) -> bool:
    """Whether two device tensors address a common byte (exact for views whose byte ranges interleave)."""
    (a_low, a_high), (b_low, b_high) = byte_range(a), byte_range(b)
    if a.numel == 0 or b.numel == 0 or a_high <= b_low or b_high <= a_low:
        return False
    try:
        return bool(np.shares_memory(np.asarray(_StandIn(a)), np.asarray(_StandIn(b)), max_work=_EXACT_WORK))
    except _TooHard:
        return True


def check_outputs_apart(written: Sequence[TensorInfo], read: Iterable[TensorInfo],
                        in_place: Iterable[tuple[TensorInfo, TensorInfo]] = ()) -> None:
    """Raise ArgumentError when a tensor the kernel writes shares memory with another operand it reads or writes.

    ``in_place`` pairs (output, source) may be the same view: the kind reads each element of the source before the
    same thread writes that element of the output."""
    outputs = [info for info in written if info.kind == "device" and info.numel]
    if not outputs:
        return
    allowed = {(id(output), id(source)) for output, source in in_place}
    sources = {source for _, source in allowed}
    output_ids = {id(info) for info in outputs}
    inputs, seen = [], set()
    for info in read:  # one of each repeated input (a weight shared by every group), every in-place source
        if info.kind != "device" or not info.numel or id(info) in output_ids:
            continue
        if id(info) not in sources:
            key = (info.device_address, info.itemsize, _squeezed(info))
            if key in seen:
                continue
            seen.add(key)
        inputs.append(info)
    for output, other, written_too in _pairs_in_range(outputs, inputs):
        if not written_too and (id(output), id(other)) in allowed and _same_view(output, other):
            continue
        _refuse_if_shared(output, other, written_too, in_place_hint=any(id(output) == o for o, _ in allowed))


def _pairs_in_range(outputs: list, inputs: list):
    """(output, other, other is an output) for every pair whose byte ranges intersect, each pair once."""
    output_ranges = [byte_range(info) for info in outputs]
    input_ranges = [byte_range(info) for info in inputs]
    if len(outputs) * (len(outputs) + len(inputs)) <= 256:  # the usual call: a few operands, plain Python
        for o, (low, high) in enumerate(output_ranges):
            for p in range(o + 1, len(outputs)):
                if output_ranges[p][0] < high and output_ranges[p][1] > low:
                    yield outputs[o], outputs[p], True
            for i, (i_low, i_high) in enumerate(input_ranges):
                if i_low < high and i_high > low:
                    yield outputs[o], inputs[i], False
        return
    # Hundreds of groups: interval tests in numpy, in blocks of bounded size.
    ranges = np.array(output_ranges, dtype=np.int64)
    for o in range(len(outputs)):
        low, high = ranges[o]
        for p in np.nonzero((ranges[o + 1:, 0] < high) & (ranges[o + 1:, 1] > low))[0]:
            yield outputs[o], outputs[o + 1 + p], True
    if not inputs:
        return
    others = np.array(input_ranges, dtype=np.int64)
    chunk = max(1, (1 << 22) // len(outputs))
    for start in range(0, len(inputs), chunk):
        block = others[start:start + chunk]
        hits = (block[:, None, 0] < ranges[None, :, 1]) & (block[:, None, 1] > ranges[None, :, 0])
        for i, o in zip(*np.nonzero(hits)):
            yield outputs[o], inputs[start + i], False


def _refuse_if_shared(output: TensorInfo, other: TensorInfo, written_too: bool, in_place_hint: bool = False) -> None:
    if not share_memory(output, other):
        return
    if written_too:
        raise ArgumentError(f"{output.name} and {other.name} share memory, and the kernel writes both; pass outputs "
                            f"that do not overlap")
    hint = (" (an output may be the very same view as its epilogue source: same address, shape and strides)"
            if in_place_hint else "")
    raise ArgumentError(f"{output.name} shares memory with {other.name}, which the kernel reads while it writes "
                        f"{output.name}; tiles run in no fixed order, so the result would be undefined. Pass an "
                        f"output that does not overlap its inputs{hint}")


def ranges_apart(lows, highs, is_output) -> bool:
    """Whether no output's byte range [low, high) intersects any other range (inputs may overlap each other).

    Sorted by low, two ranges intersect exactly when the later one starts before the earlier one ends, so one pass
    with the furthest end reached so far by outputs and by inputs finds every intersection that involves an
    output."""
    if len(lows) == 0:
        return True
    lows, highs, is_output = (np.asarray(x) for x in (lows, highs, is_output))
    order = np.argsort(lows, kind="stable")
    lows, highs, is_output = lows[order], highs[order], is_output[order]
    floor = np.iinfo(np.int64).min
    output_end = np.maximum.accumulate(np.where(is_output, highs, floor))
    input_end = np.maximum.accumulate(np.where(is_output, floor, highs))
    before_output, before_input = np.empty_like(lows), np.empty_like(lows)
    before_output[0] = before_input[0] = floor
    before_output[1:], before_input[1:] = output_end[:-1], input_end[:-1]
    return not ((lows < before_output) | (is_output & (lows < before_input))).any()
