"""Outputs that share memory with what the kernel reads are refused before anything launches; an output that is the
very same view as its epilogue source (D is C) is accepted, and views that interleave without sharing a byte are
told apart exactly. Device tensors here are ``__cuda_array_interface__`` stand-ins: nothing is dereferenced, and
the first GPU step raises NoGpuError, which marks a call that passed validation."""
from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

import pycutlass as cutlass
from pycutlass import ArgumentError, GemmArguments, GemmGroupedArguments, NoGpuError
from pycutlass.conv import Conv2dProblemSize, IteratorAlgorithm, Mode as ConvMode, Operator, StrideSupport
from pycutlass.description.types import DataType
from pycutlass.gemm import Mode
from pycutlass.kinds.conv2d.arguments import Conv2dArguments
from pycutlass.kinds.conv2d.operation import Conv2dOperation
from pycutlass.kinds.families.matrix import elements_distinct
from pycutlass.runtime.arguments import Footprint
from pycutlass.runtime.overlap import check_outputs_apart, ranges_apart, share_memory
from pycutlass.runtime.tensors import TensorInfo

from .test_gemm_arguments import f16_gemm, gpu_calls  # noqa: F401  (autouse: the first GPU step raises NoGpuError)
from .test_gemm_grouped_arguments import f16_op as grouped_op
from .test_gemm_sm90 import sm90
from .. import evt_trees as trees

BASE = 0x7F0000000000
M, N, K = 64, 32, 128
OVERLAP = "shares memory with"


class Dev:
    """A float16 device tensor at ``BASE + 2 * offset`` bytes with these shape and strides (in elements)."""

    def __init__(self, shape, strides=None, offset=0, typestr="<f2", itemsize=2):
        shape = tuple(shape)
        if strides is None:
            strides = tuple(int(np.prod(shape[i + 1:])) for i in range(len(shape)))
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "data": (BASE + itemsize * offset, False),
                                         "strides": tuple(s * itemsize for s in strides), "version": 3}


def info(name, shape, strides, offset=0, element=DataType.float16):
    return TensorInfo(name, "device", element, tuple(shape), tuple(strides), device_address=BASE + 2 * offset)


def accepted(call):
    with pytest.raises(NoGpuError):
        call()


def refused(call, match=OVERLAP):
    with pytest.raises(ArgumentError, match=match):
        call()


# --- the rule itself ------------------------------------------------------------------------------------------------
def test_interleaved_column_blocks_of_one_matrix_do_not_share_memory():
    a = info("A", (M, 64), (128, 1))
    assert not share_memory(a, info("D", (M, 64), (128, 1), offset=64))  # the right half of each row
    assert share_memory(a, info("D", (M, 64), (128, 1), offset=63))  # one element over
    assert share_memory(a, info("D", (1, 1), (1, 1), offset=(M - 1) * 128 + 63))  # the very last element
    assert not share_memory(a, info("D", (1, 1), (1, 1), offset=(M - 1) * 128 + 64))
    evens, odds = info("E", (M, N), (2 * N, 2)), info("O", (M, N), (2 * N, 2), offset=1)
    assert not share_memory(evens, odds) and share_memory(evens, info("X", (M, N), (2 * N, 2), offset=2 * N))


def test_the_exact_answer_matches_brute_force_on_random_strided_views():
    rng = random.Random(7)
    for _ in range(300):
        def draw(name):
            shape = (rng.randint(1, 5), rng.randint(1, 5))
            strides = (rng.choice([-1, 1]) * rng.randint(0, 12), rng.choice([-1, 1]) * rng.randint(0, 3))
            return info(name, shape, strides, offset=rng.randint(40, 80))

        a, b = draw("A"), draw("B")
        elements = [{(a_.device_address - BASE) // 2 + i * a_.strides[0] + j * a_.strides[1]
                     for i, j in itertools.product(range(a_.shape[0]), range(a_.shape[1]))} for a_ in (a, b)]
        assert share_memory(a, b) == bool(elements[0] & elements[1]), (a, b)


def test_only_the_same_view_of_an_epilogue_source_may_be_updated_in_place():
    c, d = info("C", (M, N), (N, 1)), info("D", (M, N), (N, 1))
    check_outputs_apart([d], [c], [(d, c)])
    with pytest.raises(ArgumentError, match="D shares memory with C.*inputs$"):
        check_outputs_apart([d], [c])  # C is not declared an in-place source here
    shifted = info("C", (M, N), (N, 1), offset=N)
    with pytest.raises(ArgumentError, match=r"D shares memory with C.*\(an output may be the very same view"):
        check_outputs_apart([d], [shifted], [(d, shifted)])
    as_3d = info("C", (1, M, N), (M * N, N, 1))  # unit dimensions do not make another view
    check_outputs_apart([d], [as_3d], [(d, as_3d)])
    reversed_rows = info("C", (M, N), (-N, 1), offset=(M - 1) * N)
    with pytest.raises(ArgumentError, match="D shares memory with C"):
        check_outputs_apart([d], [reversed_rows], [(d, reversed_rows)])


def test_outputs_may_not_overlap_each_other_and_host_or_empty_tensors_are_not_compared():
    d, e = info("D", (M, N), (N, 1)), info("E", (M, N), (N, 1), offset=M * N - 1)
    with pytest.raises(ArgumentError, match="D and E share memory, and the kernel writes both"):
        check_outputs_apart([d, e], [])
    check_outputs_apart([d, info("E", (M, N), (N, 1), offset=M * N)], [])
    host = TensorInfo("A", "host", DataType.float16, (M, N), (N, 1))
    empty = info("B", (0, N), (N, 1))
    check_outputs_apart([d], [host, empty])


def test_a_weight_shared_by_many_groups_is_compared_once_and_a_clash_is_still_found():
    outputs = [info(f"D[{g}]", (64, 64), (64, 1), offset=10_000_000 + 4096 * g) for g in range(1000)]
    weight = info("B", (64, 64), (64, 1), offset=50_000_000)
    inputs = [info(f"A[{g}]", (64, 64), (64, 1), offset=4096 * g) for g in range(1000)]
    check_outputs_apart(outputs, inputs + [weight] * 1000)
    clash = info("A[1000]", (64, 64), (64, 1), offset=10_000_000 + 4096 * 777 + 64 * 63)
    with pytest.raises(ArgumentError, match=r"D\[777\] shares memory with A\[1000\]"):
        check_outputs_apart(outputs, inputs + [clash])


def test_a_source_of_one_group_that_is_another_groups_output_is_refused():
    ds = [info(f"D[{g}]", (M, N), (N, 1), offset=M * N * g) for g in range(2)]
    cs = [info(f"C[{g}]", (M, N), (N, 1), offset=M * N * g) for g in range(2)]
    check_outputs_apart(ds, cs, list(zip(ds, cs)))
    crossed = [cs[1], cs[0]]
    with pytest.raises(ArgumentError, match=r"D\[\d\] shares memory with C\[\d\]"):
        check_outputs_apart(ds, crossed, list(zip(ds, crossed)))
    # the same memory as an in-place source of group 0 and a plain input of group 1
    a1 = info("A[1]", (M, N), (N, 1))
    with pytest.raises(ArgumentError, match=r"D\[0\] shares memory with A\[1\]"):
        check_outputs_apart(ds, [cs[0], a1], [(ds[0], cs[0])])


def test_ranges_apart_agrees_with_pairwise_tests():
    rng = random.Random(3)
    for count in (3, 8, 9, 40):
        for _ in range(200):
            lows = [rng.randint(0, 100) for _ in range(count)]
            highs = [low + rng.randint(1, 12) for low in lows]
            outputs = [rng.random() < 0.3 for _ in range(count)]
            clash = any(lows[i] < highs[j] and lows[j] < highs[i] and (outputs[i] or outputs[j])
                        for i in range(count) for j in range(i + 1, count))
            assert ranges_apart(lows, highs, outputs) == (not clash)


def test_the_fast_paths_footprint_sends_any_possible_overlap_to_the_full_path():
    a, b = info("A", (M, K), (K, 1)), info("B", (K, N), (1, K), offset=1 << 20)
    c, d = info("C", (M, N), (N, 1), offset=2 << 20), info("D", (M, N), (N, 1), offset=3 << 20)
    footprint = Footprint([a, b, c, d], [d], [(d, c)])
    apart = [BASE, BASE + (1 << 20), BASE + (2 << 20), BASE + (3 << 20)]
    assert footprint.apart(apart)
    assert footprint.apart(apart[:2] + [apart[3], apart[3]])  # C is D: updated in place
    assert not footprint.apart([apart[3], apart[1], apart[2], apart[3]])  # D over A
    assert not footprint.apart(apart[:2] + [apart[3] + 2, apart[3]])  # C one element past D
    assert footprint.apart([apart[0], apart[0], apart[2], apart[3]])  # inputs may overlap each other
    absent_c = Footprint([a, b, None, d], [d], [])
    assert absent_c.apart(apart[:2] + [apart[3], apart[3]])


# --- every kind -----------------------------------------------------------------------------------------------------
def gemm_operands():
    return dict(A=Dev((M, K)), B=Dev((K, N), (1, K), offset=1 << 20), C=Dev((M, N), offset=2 << 20),
                D=Dev((M, N), offset=3 << 20))


@pytest.mark.parametrize("family", ["sm80", "sm90"])
def test_gemm(family):
    op = f16_gemm() if family == "sm80" else sm90()
    t = gemm_operands()

    def run(beta=0.5, **kw):
        return GemmArguments(op, [M, N, K], **{**t, **kw}, output_op=op.epilogue_type(1.0, beta))

    accepted(run)
    accepted(lambda: run(C=Dev((M, N), offset=3 << 20)))  # D is C
    accepted(lambda: run(C=None, beta=0.0))
    refused(lambda: run(D=Dev((M, N), (K, 1))))  # D over A's first N columns: A = A[:, :N] @ B
    refused(lambda: run(D=Dev((M, N), offset=(1 << 20) + 64)))  # D over B
    refused(lambda: run(C=Dev((M, N), offset=(3 << 20) + N)))  # C one row further on than D
    accepted(lambda: run(C=Dev((M, N), offset=(3 << 20) + N), beta=0.0))  # beta = 0: C is not read
    # a column block beside A in one buffer: no byte in common
    accepted(lambda: run(A=Dev((M, K), (K + N, 1)), D=Dev((M, N), (K + N, 1), offset=K)))
    refused(lambda: run(A=Dev((M, K), (K + N, 1)), D=Dev((M, N), (K + N, 1), offset=K - 8)))


def test_batched_gemm_output_over_the_next_batchs_input():
    op = f16_gemm()
    batch = 3
    a = Dev((batch, M, K), offset=0)
    b = Dev((batch, K, N), (K * N, 1, K), offset=1 << 20)
    run = lambda d: GemmArguments(op, [M, N, K], a, b, None, d, output_op=op.epilogue_type(1.0, 0.0),  # noqa: E731
                                  gemm_mode=Mode.Batched, batch=batch)
    accepted(lambda: run(Dev((batch, M, N), offset=2 << 20)))
    refused(lambda: run(Dev((batch, M, N), offset=M * K)))  # batch 0's D is batch 1's A


@pytest.mark.parametrize("family", ["sm80", "sm90"])
def test_batches_that_interleave_row_by_row_are_apart_and_batches_that_share_rows_are_not(family):
    """A (B, M, N) view of (M, B, N) memory (attention heads) gives every element its own address, so it may be
    written; a batch stride that lands one batch's rows on the next one's may not."""
    op = f16_gemm() if family == "sm80" else sm90()
    batch = 3
    a = Dev((batch, M, K), offset=0)
    b = Dev((batch, K, N), (K * N, 1, K), offset=1 << 20)
    run = lambda d: GemmArguments(op, [M, N, K], a, b, None, d, output_op=op.epilogue_type(1.0, 0.0),  # noqa: E731
                                  gemm_mode=Mode.Batched, batch=batch)
    accepted(lambda: run(Dev((batch, M, N), (N, batch * N, 1), offset=2 << 20)))
    refused(lambda: run(Dev((batch, M, N), (N, N, 1), offset=2 << 20)), "makes output matrices overlap")
    refused(lambda: run(Dev((batch, M, N), (N, (batch - 1) * N, 1), offset=2 << 20)), "makes output matrices overlap")


def test_elements_distinct_agrees_with_brute_force_where_it_accepts():
    rng = random.Random(3)
    decided = 0
    for _ in range(400):
        dims = [(rng.randint(1, 4), rng.randint(0, 20)) for _ in range(3)]
        addresses = [sum(i * s for i, (_, s) in zip(index, dims))
                     for index in itertools.product(*(range(e) for e, _ in dims))]
        distinct = len(set(addresses)) == len(addresses)
        if elements_distinct(dims):
            assert distinct, dims  # never accepts a view whose elements collide
        decided += elements_distinct(dims) == distinct
    assert decided > 260  # random strides: mostly decided; the undecided are counted as overlapping (safe)
    # every permuted slice of a contiguous (4, 5, 6) tensor is decided exactly
    for order in itertools.permutations(range(3)):
        for steps in itertools.product((1, 2), repeat=3):
            shape, strides = (4, 5, 6), (30, 6, 1)
            view = [(-(-shape[d] // steps[d]), strides[d] * steps[d]) for d in order]
            assert elements_distinct(view)


def test_parallel_split_k_leaves_c_and_d_to_the_reduction():
    op = f16_gemm()
    t = gemm_operands()
    over_a = Dev((M, N))  # where A starts
    accepted(lambda: GemmArguments(op, [M, N, K], t["A"], t["B"], over_a, over_a, gemm_mode=Mode.GemmSplitKParallel,
                                   split_k_slices=2))


def test_reduction_destination_over_the_partials_or_a_shifted_source():
    reduction = cutlass.ReductionOperation(shape=cutlass.MatrixCoord(4, 32), C=cutlass.TensorDescription(
        cutlass.float16, cutlass.RowMajor, 8), element_accumulator=cutlass.float32, count=8)
    workspace = BASE + (8 << 20)
    run = lambda dest, source=None, beta=0.0: cutlass.ReductionArguments(  # noqa: E731
        reduction, [M, N], 2, workspace, dest, source, output_op=reduction.epilogue_type(1.0, beta))
    accepted(lambda: run(Dev((M, N))))
    accepted(lambda: run(Dev((M, N)), Dev((M, N)), beta=1.0))
    refused(lambda: run(Dev((M, N), offset=(8 << 19) + M * N)), "destination shares memory with workspace")
    refused(lambda: run(Dev((M, N)), Dev((M, N), offset=8), beta=1.0), "destination shares memory with source")


def test_grouped_gemm():
    op = grouped_op()
    problems = [(M, N, K), (M, N, K)]
    size = {"A": M * K, "B": K * N, "C": M * N, "D": M * N}

    def group(label, g, offset=None):
        base = {"A": 0, "B": 1 << 20, "C": 2 << 20, "D": 3 << 20}[label] + g * size[label]
        shape, strides = {"A": ((M, K), (K, 1)), "B": ((K, N), (1, K)), "C": ((M, N), (N, 1)),
                          "D": ((M, N), (N, 1))}[label]
        return Dev(shape, strides, base if offset is None else offset)

    t = {label: [group(label, g) for g in range(2)] for label in "ABCD"}
    run = lambda **kw: GemmGroupedArguments(op, problems, *({**t, **kw}[x] for x in "ABCD"),  # noqa: E731
                                            output_op=op.epilogue_type(1.0, 1.0))
    accepted(run)
    accepted(lambda: run(C=[group("D", 0), group("D", 1)]))  # each D is its own C
    refused(lambda: run(C=[group("D", 1), group("D", 0)]), r"Ds\[\d\] .* shares memory with Cs\[\d\]")
    refused(lambda: run(D=[group("D", 0), group("D", 0, offset=M * K)]), r"Ds\[1\] .* shares memory with As\[1\]")
    refused(lambda: run(D=[group("D", 0), group("D", 0)]), "share memory, and the kernel writes both")


def conv_op(kind=Operator.fprop):
    mi = cutlass.MathInstruction([16, 8, 16], cutlass.float16, cutlass.float16, cutlass.float32,
                                 cutlass.OpClass.TensorOp)
    tile = cutlass.TileDescription([128, 128, 32], 3, [2, 2, 1], mi)
    desc = cutlass.TensorDescription(cutlass.float16, cutlass.TensorNHWC, 8)
    epilogue = cutlass.LinearCombination(cutlass.float16, 8, cutlass.float32, cutlass.float32)
    stride = StrideSupport.Unity if kind is Operator.dgrad else StrideSupport.Strided
    return Conv2dOperation(kind, IteratorAlgorithm.optimized, 80, tile, desc, desc, desc, stride, epilogue)


def test_conv2d_output_over_its_activations_or_filter():
    op = conv_op()
    ps = Conv2dProblemSize((2, 8, 8, 16), (16, 3, 3, 16), (1, 1, 1, 1), (1, 1), (1, 1), ConvMode.cross_correlation,
                           1, 1)
    x, w = Dev((2, 8, 8, 16)), Dev((16, 3, 3, 16), offset=1 << 20)
    out = lambda offset: Dev((2, 8, 8, 16), offset=offset)  # noqa: E731 (same extent as x: 3x3, pad 1)
    run = lambda c, d, beta=1.0: Conv2dArguments(op, ps, x, w, c, d,  # noqa: E731
                                                 output_op=op.epilogue_type(1.0, beta))
    accepted(lambda: run(out(2 << 20), out(3 << 20)))
    accepted(lambda: run(out(3 << 20), out(3 << 20)))  # D is C
    refused(lambda: run(out(2 << 20), out(0)), r"D \(output\) shares memory with A \(activation\)")
    refused(lambda: run(out(2 << 20), out((1 << 20) + 16)), r"shares memory with B \(filter\)")
    refused(lambda: run(out((3 << 20) + 16), out(3 << 20)), r"shares memory with C \(output\)")


def test_visitor_tree_outputs():
    op = trees.operation(trees.RowBroadcast_)
    a, b = Dev((M, K)), Dev((K, N), (1, K), offset=1 << 20)
    c, vector = Dev((M, N), offset=2 << 20), Dev((N,), offset=4 << 20)

    def run(D, T, c=c):
        values = dict(c=c, vector=vector, alpha=1.0, beta=0.5, Z=D, T=T)
        return GemmArguments(op, [M, N, K], a, b, None, None,
                             output_op=op.epilogue_type(**values, problem_size=[M, N]))

    names = op.epilogue_functor.description.tensors
    assert set(names) == {"c", "vector", "Z", "T"}, names
    accepted(lambda: run(Dev((M, N), offset=3 << 20), Dev((M, N), offset=5 << 20)))
    accepted(lambda: run(Dev((M, N), offset=2 << 20), Dev((M, N), offset=5 << 20)))  # D is c: in place
    refused(lambda: run(Dev((M, N), offset=3 << 20), Dev((M, N), offset=3 << 20)), "Z and T share memory")
    refused(lambda: run(Dev((M, N), offset=3 << 20), Dev((M, N), offset=(4 << 20) - 8)), "T shares memory with vector")
    refused(lambda: run(Dev((M, N), offset=0), Dev((M, N), offset=5 << 20)), "Z shares memory with A")


def test_a_visitor_tree_output_whose_rows_or_batches_overlap_is_refused():
    op = trees.operation(trees.RowBroadcast_)
    a, b = Dev((M, K)), Dev((K, N), (1, K), offset=1 << 20)
    c, vector = Dev((M, N), offset=2 << 20), Dev((N,), offset=4 << 20)

    def run(Z, batch=1, a=a, b=b, c=c):
        values = dict(c=c, vector=vector, alpha=1.0, beta=0.5, Z=Z, T=Dev((batch, M, N), offset=6 << 20))
        return GemmArguments(op, [M, N, K], a, b, None, None, gemm_mode=Mode.Batched if batch > 1 else Mode.Gemm,
                             batch=batch, output_op=op.epilogue_type(**values, problem_size=[M, N]))

    refused(lambda: run(Dev((M, N), (N - 8, 1), offset=3 << 20)), "Z: leading stride 24 is smaller than the 32")
    batch = 2
    a3, b3 = Dev((batch, M, K)), Dev((batch, K, N), (K * N, 1, K), offset=1 << 20)
    c3 = Dev((batch, M, N), offset=2 << 20)
    accepted(lambda: run(Dev((batch, M, N), offset=3 << 20), batch, a3, b3, c3))
    refused(lambda: run(Dev((batch, M, N), (M * N - 8 * N, N, 1), offset=3 << 20), batch, a3, b3, c3),
            "Z: batch stride 1792 with leading dimension 32 makes output matrices overlap")


def test_a_packs_seen_call_checks_its_out_against_the_inputs_before_launching():
    from pycutlass.pack.launch import _footprint

    a, b = Dev((M, K)), Dev((K, N), (1, K), offset=1 << 20)
    c, out = Dev((M, N), offset=2 << 20), Dev((M, N), offset=3 << 20)
    footprint = _footprint((a, b, c, None, out))
    a_, b_, c_, out_ = (BASE + 2 * offset for offset in (0, 1 << 20, 2 << 20, 3 << 20))
    assert footprint.apart((a_, b_, c_, 0, out_))
    assert footprint.apart((a_, b_, out_, 0, out_))  # c is out: in place
    assert not footprint.apart((a_, b_, c_, 0, a_ + 64))  # out over a: the full path decides (and refuses)
    assert not footprint.apart((a_, b_, out_ + 2, 0, out_))
