"""Explicit SM90 epilogue tiles without a GPU: what ``TileDescription(..., epilogue_tile=...)`` accepts and refuses in
each kind (with the rule), names and emission (CUTLASS's automatic tile keeps every existing name and source), the
shared-memory check of explicit stage counts, and a real NVRTC compile."""
from __future__ import annotations

import pytest

import pycutlass as cutlass
from pycutlass import DescriptionError
from pycutlass import EpilogueScheduleType as ES
from pycutlass import KernelScheduleType as KS

D = cutlass.DataType
R, CM = cutlass.RowMajor, cutlass.ColumnMajor
COOP, PP, WS = KS.TmaWarpSpecializedCooperative, KS.TmaWarpSpecializedPingpong, KS.TmaWarpSpecialized


def tile(shape=(128, 128, 64), kernel=KS.Auto, epilogue_tile=None, stages=0, element=D.float16, epilogue=ES.Auto):
    k = {16: 16, 8: 32}[element.bits]
    accumulator = D.int32 if element is D.int8 else D.float32
    math = cutlass.MathInstruction([64, shape[1], k], element, element, accumulator, cutlass.OpClass.TensorOp)
    return cutlass.TileDescription(list(shape), stages, None, math, kernel_schedule=kernel,
                                   epilogue_schedule=epilogue, epilogue_tile=epilogue_tile)


def parts(element=D.float16, out=None, layouts=(R, CM, R)):
    out = out or element
    A = cutlass.TensorDescription(element, layouts[0], 128 // element.bits)
    B = cutlass.TensorDescription(element, layouts[1], 128 // element.bits)
    C = cutlass.TensorDescription(out, layouts[2], 128 // out.bits)
    accumulator = D.int32 if out is D.int32 else D.float32
    return A, B, C, cutlass.LinearCombination(out, C.alignment, accumulator, D.float32)


def gemm(out=None, element=D.float16, **kwargs):
    return cutlass.GemmOperationUniversal(90, tile(element=element, **kwargs), *parts(element, out))


def grouped(**kwargs):
    return cutlass.GemmOperationGrouped(90, tile(**kwargs), *parts())


def array(**kwargs):
    return cutlass.GemmOperationUniversal(90, tile(**kwargs), *parts(), array=True)


@pytest.mark.parametrize("value", [(128,), (128, 64, 1), "128x64", (128.0, 64), (0, 64), (128, -64)],
                         ids=repr)
def test_the_field_is_two_positive_integers(value):
    with pytest.raises(DescriptionError, match="epilogue_tile must be 2") as error:
        tile(epilogue_tile=value)
    assert error.value.rule == "description.field_type"


def test_none_keeps_the_repr_and_sm80_names_and_a_tile_is_sm90_only():
    plain = tile()
    assert "epilogue_tile" not in repr(plain) and not plain.sm90_only or plain.stages == 0
    explicit = tile(epilogue_tile=[128, 64])
    assert explicit.epilogue_tile == (128, 64) and "epilogue_tile=(128, 64)" in repr(explicit)
    assert explicit.sm90_only and explicit != plain
    math = cutlass.MathInstruction([16, 8, 16], D.float16, D.float16, D.float32, cutlass.OpClass.TensorOp)
    sm80 = cutlass.TileDescription([128, 128, 32], 3, [2, 2, 1], math, epilogue_tile=(128, 64))
    with pytest.raises(DescriptionError, match="an epilogue tile") as error:
        cutlass.GemmOperationUniversal(80, sm80, *parts())
    assert error.value.rule == "tile.sm90_only_values"


@pytest.mark.parametrize("build, kwargs", [
    (gemm, dict(kernel=COOP, epilogue_tile=(128, 64))),
    (gemm, dict(kernel=COOP, shape=(256, 128, 64), epilogue_tile=(128, 128))),
    (gemm, dict(kernel=PP, shape=(64, 128, 64), epilogue_tile=(64, 128))),
    (gemm, dict(kernel=PP, shape=(128, 128, 64), epilogue_tile=(64, 64))),
    (gemm, dict(kernel=WS, shape=(64, 192, 64), epilogue_tile=(64, 64))),
    (gemm, dict(kernel=COOP, epilogue_tile=(128, 32))),
    (grouped, dict(kernel=COOP, shape=(128, 256, 64), epilogue_tile=(128, 64))),
    (grouped, dict(kernel=PP, shape=(64, 128, 64), epilogue_tile=(64, 64))),
    (array, dict(kernel=COOP, epilogue_tile=(128, 128))),
], ids=lambda v: getattr(v, "__name__", None) or str(v.get("epilogue_tile")))
def test_accepted_tiles_name_and_emit_their_shape(build, kwargs):
    op = build(**kwargs)
    auto = build(**{**kwargs, "epilogue_tile": None})
    rows, columns = kwargs["epilogue_tile"]
    assert op.name != auto.name and f"_e{rows}x{columns}" in op.name and "_e" not in auto.name.split("_s0_")[1]
    assert f"epilogue_tile={rows}x{columns}" in op.describe()
    source = op.emit()
    assert f"Shape<_{rows}, _{columns}>, ElementAccumulator, ElementCompute" in source
    assert "EpilogueTileAuto" not in source and "EpilogueTileAuto" in auto.emit()


@pytest.mark.parametrize("build, kwargs, message", [
    (gemm, dict(kernel=COOP, epilogue_tile=(64, 64)), r"must be \(128, N\) for a 128x128 tile of the cooperative"),
    (gemm, dict(kernel=PP, shape=(128, 128, 64), epilogue_tile=(128, 64)), r"must be \(64, N\)"),
    (gemm, dict(kernel=COOP, epilogue_tile=(128, 256)), r"N one of \[32, 64, 128\]"),
    (gemm, dict(kernel=COOP, shape=(128, 192, 64), epilogue_tile=(128, 128)), r"N one of \[32, 64\]"),
    (gemm, dict(kernel=COOP, epilogue_tile=(128, 16)), r"N one of"),
    (gemm, dict(kernel=COOP, epilogue=ES.NoSmemWarpSpecialized, epilogue_tile=(128, 64)), "NoSmemWarpSpecialized"),
    (gemm, dict(element=D.int8, out=D.int32, shape=(128, 128, 128), epilogue_tile=(128, 64)), "int32"),
    (gemm, dict(element=D.float8_e4m3, out=D.float8_e4m3, shape=(128, 128, 128), epilogue_tile=(128, 64)),
     "float8_e4m3"),
    (grouped, dict(kernel=PP, shape=(64, 128, 64), epilogue_tile=(64, 256)), r"N one of \[32, 64, 128\]"),
    (array, dict(kernel=COOP, epilogue_tile=(64, 64)), r"must be \(128, N\)"),
    # stages=0: the buffers leave the main loop fewer than the 2 stages CUTLASS's main loops static_assert
    (gemm, dict(out=D.float32, shape=(128, 256, 64), kernel=COOP, epilogue_tile=(128, 128)), "192 KiB.*0 stage"),
    (grouped, dict(shape=(256, 256, 64), kernel=COOP, epilogue_tile=(128, 128)), "128 KiB.*1 stage"),
], ids=lambda v: getattr(v, "__name__", None) or (str(v.get("epilogue_tile")) if isinstance(v, dict) else "m"))
def test_refused_tiles_say_what_is_built(build, kwargs, message):
    with pytest.raises(DescriptionError, match=message) as error:
        build(**kwargs)
    assert error.value.rule == "sm90.epilogue_tile"


def test_convolutions_keep_the_automatic_tile():
    from pycutlass.conv import IteratorAlgorithm, Operator, StrideSupport

    A = cutlass.TensorDescription(D.float16, cutlass.TensorNHWC, 8)
    functor = cutlass.LinearCombination(D.float16, 8, D.float32, D.float32)
    with pytest.raises(DescriptionError, match="automatic epilogue tile") as error:
        cutlass.Conv2dOperation(Operator.fprop, IteratorAlgorithm.optimized, 90, tile(epilogue_tile=(128, 64)),
                                A, A, A, StrideSupport.Strided, functor)
    assert error.value.rule == "sm90.epilogue_tile"


def test_automatic_stages_beside_a_wide_epilogue_tile_are_checked_at_the_boundary():
    """f32 out of a 256x128 cooperative tile: 128x64 (4 buffers of 32 KiB) leaves two 48 KiB stages, accepted (the
    GPU suite runs it); 128x128 (3 of 64 KiB) leaves none."""
    gemm(out=D.float32, shape=(256, 128, 64), kernel=COOP, epilogue_tile=(128, 64))
    with pytest.raises(DescriptionError, match="0 stage"):
        gemm(out=D.float32, shape=(256, 128, 64), kernel=COOP, epilogue_tile=(128, 128))


def test_explicit_stages_count_the_epilogue_tile():
    """128x256x64 f16: 4 stages (192 KiB) fit beside CUTLASS's 128x32 tile (4 buffers of 8 KiB), not beside 128x64
    (4 of 16 KiB); 3 stages do."""
    gemm(kernel=COOP, shape=(128, 256, 64), stages=4)
    with pytest.raises(DescriptionError, match="64 KiB") as error:
        gemm(kernel=COOP, shape=(128, 256, 64), stages=4, epilogue_tile=(128, 64))
    assert error.value.rule == "smem.capacity"
    gemm(kernel=COOP, shape=(128, 256, 64), stages=3, epilogue_tile=(128, 64))


def test_search_spaces_carry_the_epilogue_tile_and_leave_other_spaces_as_they_were():
    from pycutlass.tune.plots import kernel_labels
    from pycutlass.tune.space import SearchSpace, build_operation

    grid = {"name": "epi", "kind": ["grouped_gemm"], "compute_capability": [90], "dtypes": ["bf16"],
            "layouts": ["crr"], "threadblock_shape": [[128, 256, 64]], "warp_count": ["auto"], "stages": [0],
            "cluster_shape": [[2, 1, 1]], "kernel_schedule": ["TmaWarpSpecializedCooperative"]}
    plain = SearchSpace.from_dict(grid)
    assert "epilogue_tile" not in plain.to_dict() and plain == SearchSpace.from_dict({**grid, "epilogue_tile": "auto"})
    space = SearchSpace.from_dict({**grid, "epilogue_tile": ["auto", [128, 64], [128, 256]]})
    assert space.size == 3 and space.fingerprint != plain.fingerprint
    points = list(space.points())
    assert "epilogue_tile" not in points[0].params and points[1].params["epilogue_tile"] == [128, 64]
    assert [p.operation.tile_description.epilogue_tile for p in points[:2]] == [None, (128, 64)]
    assert not points[2].valid and points[2].reason == "epilogue tile outside what the SM90 kind builds"
    assert build_operation(points[1].params).name == points[1].operation.name  # params rebuild the kernel
    labels = kernel_labels({p.operation.name: p.params for p in points[:2]})
    assert sorted(labels.values()) == ["etile:128x64", "etile:auto"]
    one = SearchSpace.from_dict({**grid, "epilogue_tile": [128, 64]})  # a bare pair is one value
    assert one.size == 1


def test_the_ranker_weighs_an_epilogue_tile_by_store_rounds_and_the_stages_it_leaves():
    from pycutlass.tune.problems import GemmProblem
    from pycutlass.tune.rank import config_of, rank

    def op(epilogue_tile):
        return cutlass.GemmOperationGrouped(90, tile((128, 256, 64), COOP, epilogue_tile, element=D.bfloat16),
                                            *parts(D.bfloat16))

    auto, wide, widest = op(None), op((128, 64)), op((128, 128))
    assert config_of(wide).epilogue_tile == (128, 64) and config_of(auto).epilogue_tile is None

    def order(problem):
        return [r.point.tile_description.epilogue_tile for r in rank([auto, wide, widest], problem, device="H200")]

    # a weight gradient (K of one to two k-blocks) is store-bound: fewer sub-tile rounds win (measured: 128x64 11%
    # faster than the automatic 128x32 on H200)
    assert order(GemmProblem(2048, 7168, 128)).index(None) == 2
    # a forward GEMM's long K needs the main loop's stages: 128x128 buffers leave two, and it ranks last (measured
    # 35-55% slower), while 128x64 (three stages) ranks with the automatic tile
    forward = rank([auto, wide, widest], GemmProblem(4096, 14336, 4096), device="H200")
    assert forward[-1].point is widest and "epilogue tile 128x128" in forward[-1].reason
    assert forward[-1].score < 0.8 * forward[0].score
    assert abs(forward[0].score - forward[1].score) < 0.02 * forward[0].score


@pytest.mark.slow
def test_nvrtc_compiles_a_grouped_operation_with_an_epilogue_tile(tmp_path):
    session = cutlass.Session(backend="nvrtc", target=90, cache_path=tmp_path / "c.db", progress=False)
    compiler = cutlass.compiler.manager.Compiler.of(session)
    op = cutlass.GemmOperationGrouped(90, tile(shape=(128, 256, 64), kernel=COOP, epilogue_tile=(128, 64),
                                               element=D.bfloat16), *parts(D.bfloat16, layouts=(CM, R, R)))
    kernel = compiler.add_module([op])[0]
    assert op.kernel_symbol.encode() in kernel.binary and len(kernel.binary) > 100_000
