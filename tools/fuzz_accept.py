"""Fuzz what the descriptions accept: draw random GEMM / conv2d configurations as a user exploring the API would,
keep the ones whose construction succeeds, and compile a sample of them. An accepted description that does not
compile is a defect (it must be rejected at construction with a DescriptionError, or emitted so that it compiles).

    PYCUTLASS_CACHE_DIR=/tmp/fuzzcache PYTHONPATH=. python tools/fuzz_accept.py draw --count 4000 --seed 1
    PYCUTLASS_CACHE_DIR=/tmp/fuzzcache PYTHONPATH=. python tools/fuzz_accept.py compile --sm80 30 --sm90 6 \
        --seed 1 --out /tmp/fuzz_results.jsonl

``draw`` prints rejection counts by message class; ``compile`` draws the same way, picks accepted configurations
(Sm80-family GEMM and conv, SM90 GEMM and conv) and compiles them in small batches (a failing batch is recompiled
one operation at a time), writing one JSON line per operation. ``--config JSON`` rebuilds one configuration.
"""
from __future__ import annotations

import argparse
import collections
import json
import random
import re
import sys
import time
import traceback
import zlib

import pycutlass as cutlass
from pycutlass import DescriptionError
from pycutlass.conv import IteratorAlgorithm, Operator, StrideSupport
from pycutlass.description.math_instruction import VALID_MATH_INSTRUCTIONS, WARPGROUP_MATH_INSTRUCTIONS
from pycutlass.kinds.gemm_sm90.operation import TILE_N as SM90_TILE_N

D = cutlass.DataType
L = cutlass.LayoutType
T = cutlass.description.types if hasattr(cutlass, "description") else None
from pycutlass.description import types as _types  # noqa: E402

SWIZZLES = {s.name: s for s in (_types.IdentitySwizzle1, _types.IdentitySwizzle2, _types.IdentitySwizzle4,
                                _types.IdentitySwizzle8, _types.HorizontalSwizzle, _types.BatchedIdentitySwizzle,
                                _types.StridedDgradIdentitySwizzle1, _types.StridedDgradIdentitySwizzle4,
                                _types.StridedDgradHorizontalSwizzle)}
ACTIVATIONS = ("identity", "relu", "leaky_relu", "tanh", "sigmoid", "silu", "hardswish", "gelu", "gelu_taylor")
EPILOGUES = ("LinearCombination", "LinearCombinationGeneric", "LinearCombinationClamp", "FastLinearCombinationClamp")


# --- drawing -----------------------------------------------------------------------------------------------------
def _outputs(element, acc):
    if element is D.int8:
        return [D.int8, D.int32, D.float32, D.float16]
    if element.is_fp8:
        return [D.float16, D.bfloat16, D.float32, D.float8_e4m3, D.float8_e5m2]
    if element is D.float64:
        return [D.float64]
    return [element if element is not D.tfloat32 else D.float32, D.float32, D.float16, D.bfloat16]


def _align(rng, element, wide=False):
    bits = element.bits
    top = 1 if element is D.float64 else (256 if wide else 128) // bits
    return rng.choice([a for a in (1, 2, 4, 8, 16) if a <= top])


def draw_sm80_math(rng, conv=False):
    keys = [k for k in VALID_MATH_INSTRUCTIONS if not k[2].is_fp8]
    opclass, shape, element, acc = rng.choice(keys)
    op = rng.choice(VALID_MATH_INSTRUCTIONS[(opclass, shape, element, acc)])
    return dict(inst=list(shape), element=element.name, acc=acc.name, opclass=opclass.name, math_op=op.name)


def draw_common(rng, math, wide_c):
    element = D[math["element"]]
    acc = D[math["acc"]]
    mem = D.float32 if element is D.tfloat32 else element
    out = rng.choice(_outputs(element, acc))
    epi = rng.choices(EPILOGUES, weights=(5, 4, 2, 1))[0]
    if epi == "FastLinearCombinationClamp" or (epi == "LinearCombinationClamp" and rng.random() < 0.5):
        out = D.int8 if element is D.int8 else out
    cfg = dict(math, a_elem=mem.name, b_elem=mem.name, c_elem=out.name,
               a_align=_align(rng, mem), b_align=_align(rng, mem), c_align=_align(rng, out, wide_c),
               epilogue=epi, activation=rng.choice(ACTIVATIONS),
               element_epilogue=rng.choice([None, None, None, "float32", "float16", "bfloat16", "float64"]))
    if acc is D.int32 and rng.random() < 0.3:  # PyCUTLASS's s8 tests: LinearCombination(Clamp) computing in int32
        cfg["epilogue"] = rng.choice(["LinearCombination", "LinearCombinationClamp"])
        cfg.update(element_epilogue="int32", c_elem="int32" if cfg["epilogue"] == "LinearCombination" else
                   rng.choice(["int8", "int32"]))
        cfg["c_align"] = _align(rng, D[cfg["c_elem"]], wide_c)
    if rng.random() < 0.5:  # users often use one alignment for A and B
        cfg["b_align"] = cfg["a_align"]
    return cfg


def draw_sm80_tile(rng):
    return dict(tb=[rng.choice([16, 32, 64, 128, 256]), rng.choice([16, 32, 64, 128, 256]),
                    rng.choice([8, 16, 32, 64, 128])],
                warps=[rng.choice([1, 2, 4]), rng.choice([1, 2, 4]), rng.choices([1, 2], weights=(9, 1))[0]],
                stages=rng.randint(2, 7))


def draw_gemm80(rng):
    math = draw_sm80_math(rng)
    cfg = dict(family="gemm80", cc=rng.choice([80, 80, 90]), **draw_sm80_tile(rng), **draw_common(rng, math, True))
    if math["element"] == "int8" and rng.random() < 0.3:
        cfg["layouts"] = ["ColumnMajorInterleaved32", "RowMajorInterleaved32", "ColumnMajorInterleaved32"]
    else:
        cfg["layouts"] = [rng.choice(["RowMajor", "ColumnMajor"]) for _ in range(3)]
    cfg["swizzle"] = rng.choice(["IdentitySwizzle1", "IdentitySwizzle2", "IdentitySwizzle4", "IdentitySwizzle8",
                                 "BatchedIdentitySwizzle", "HorizontalSwizzle"])
    if math["opclass"] == "TensorOp" and rng.random() < 0.15:
        cfg["direct_store"] = True  # PyCUTLASS 2.11's register-to-global epilogue
    return cfg


def draw_conv80(rng):
    math = draw_sm80_math(rng, conv=True)
    cfg = dict(family="conv80", cc=rng.choice([80, 80, 90]), **draw_sm80_tile(rng), **draw_common(rng, math, True))
    cfg["conv_kind"] = rng.choice(["fprop", "dgrad", "wgrad"])
    cfg["algorithm"] = rng.choices(["analytic", "optimized", "fixed_channels", "few_channels"],
                                   weights=(4, 4, 1, 1))[0]
    cfg["stride_support"] = rng.choice(["Strided", "Unity"])
    if math["element"] == "int8" and rng.random() < 0.3:
        cfg["layouts"] = ["TensorNC32HW32", "TensorC32RSK32", "TensorNC32HW32"]
    else:
        cfg["layouts"] = ["TensorNHWC"] * 3
    strided_dgrad = cfg["conv_kind"] == "dgrad" and cfg["stride_support"] == "Strided"
    cfg["swizzle"] = rng.choice(["StridedDgradIdentitySwizzle1", "StridedDgradIdentitySwizzle4"] if strided_dgrad
                                and rng.random() < 0.8 else ["IdentitySwizzle1", "IdentitySwizzle2",
                                                             "IdentitySwizzle4", "IdentitySwizzle8"])
    return cfg


def draw_sm90_math(rng, elements=None):
    keys = [k for k in WARPGROUP_MATH_INSTRUCTIONS if elements is None or k[0] in elements]
    element, acc = rng.choice(keys)
    k = WARPGROUP_MATH_INSTRUCTIONS[(element, acc)]
    if rng.random() < 0.3:  # an Sm80-style shape means "the builder chooses" at 90
        sm80 = [key for key in VALID_MATH_INSTRUCTIONS if key[2] is element and key[3] is acc and key[0].name ==
                "TensorOp"]
        shape = list(rng.choice(sm80)[1]) if sm80 else [64, rng.choice(SM90_TILE_N), k]
    else:
        shape = [64, rng.choice(SM90_TILE_N), k]
    op = "multiply_add"
    return dict(inst=shape, element=element.name, acc=acc.name, opclass="TensorOp", math_op=op)


def draw_sm90_tile(rng, element_bits):
    kk = 128 * 8 // element_bits
    return dict(tb=[rng.choice([64, 128, 256]), rng.choice(SM90_TILE_N), rng.choice([kk, kk, kk // 2, kk * 2])],
                warps=rng.choice([None, None, None, [4, 1, 1], [8, 1, 1]]),
                stages=rng.choice([0, 0, 2, 3, 4, 5, 6, 7]),
                cluster=rng.choice([[1, 1, 1], [2, 1, 1], [1, 2, 1], [2, 2, 1]]),
                kernel_schedule=rng.choice([s.name for s in _types.KernelScheduleType]),
                epilogue_schedule=rng.choice([s.name for s in _types.EpilogueScheduleType]),
                tile_scheduler=rng.choice(["Default", "StreamK"]))


def draw_gemm90(rng):
    math = draw_sm90_math(rng)
    element = D[math["element"]]
    cfg = dict(family="gemm90", cc=90, **draw_sm90_tile(rng, element.bits), **draw_common(rng, math, False))
    for key in ("a_align", "b_align", "c_align"):  # TMA: mostly 16-byte vectors
        elem = D[cfg[key[0] + "_elem"]]
        if rng.random() < 0.85:
            cfg[key] = 128 // elem.bits
    cfg["layouts"] = [rng.choice(["RowMajor", "ColumnMajor"]) for _ in range(3)]
    if element.bits == 8 and rng.random() < 0.7:
        cfg["layouts"][:2] = ["RowMajor", "ColumnMajor"]
    cfg["swizzle"] = rng.choice(["IdentitySwizzle1", "IdentitySwizzle2", "IdentitySwizzle4", "IdentitySwizzle8"])
    cfg["bias"] = rng.choice([None, None, "row", "column"])
    if cfg["element_epilogue"] not in (None, "float32"):
        cfg["element_epilogue"] = None if rng.random() < 0.8 else cfg["element_epilogue"]
    return draw_epilogue_tile(cfg)


def draw_epilogue_tile(cfg, chance=0.4):
    """An explicit SM90 epilogue tile now and then (None otherwise), drawn from the configuration itself rather than
    the family's stream, so that every seed still draws the configurations it drew before the field existed."""
    sub = random.Random(json.dumps(cfg, sort_keys=True))
    cfg["epilogue_tile"] = [sub.choice([64, 128, 128]), sub.choice([32, 64, 64, 128, 128, 256])] \
        if sub.random() < chance else None
    return cfg


def draw_conv90(rng):
    math = draw_sm90_math(rng, elements=(D.float16, D.bfloat16))
    cfg = dict(family="conv90", cc=90, **draw_sm90_tile(rng, 16), **draw_common(rng, math, False))
    cfg.update(a_align=8, b_align=8)
    if rng.random() < 0.8:
        cfg["c_elem"] = cfg["a_elem"]
        cfg["c_align"] = 8
    cfg["conv_kind"] = rng.choice(["fprop", "dgrad", "wgrad"])
    cfg["algorithm"] = rng.choice(["analytic", "optimized"])
    cfg["stride_support"] = rng.choice(["Strided", "Unity"])
    cfg["layouts"] = ["TensorNHWC"] * 3
    cfg["swizzle"] = "IdentitySwizzle1"
    cfg["bias"] = rng.random() < 0.3
    for key in ("kernel_schedule", "epilogue_schedule", "tile_scheduler"):
        if rng.random() < 0.6:
            cfg[key] = {"tile_scheduler": "Default"}.get(key, "Auto")
    if rng.random() < 0.3:  # pycutlass's persistent cooperative kernel, often enough to be drawn in every run
        cfg["kernel_schedule"] = "TmaWarpSpecializedCooperative"
        cfg["tb"][0] = rng.choice([128, 256])
    if cfg["conv_kind"] == "wgrad" and rng.random() < 0.35:  # pycutlass's filter-tap-reuse wgrad (tile N 9*64)
        cfg["tb"] = [rng.choice([64, 64, 64, 128]), 576, rng.choice([64, 64, 128, 128, 32])]
        cfg["inst"] = [64, rng.choice([64, 64, 64, 128]), 16]
        cfg["cluster"] = [1, 1, rng.choice([1, 2, 4, 4, 3])]
        cfg["kernel_schedule"] = rng.choice(["Auto", "Auto", "TmaWarpSpecialized", "TmaWarpSpecializedCooperative"])
        cfg["warps"] = rng.choice([None, None, None, [12, 1, 1], [4, 1, 1]])
        cfg["bias"] = False
    return cfg


def draw_grouped80(rng):
    """A GemmOperationGrouped at 80 (or 90 with an Sm80 tile): the GEMM drawing plus a scheduler mode."""
    cfg = draw_gemm80(rng)
    cfg["family"] = "grouped80"
    cfg.pop("direct_store", None)  # GemmOperationUniversal's only
    if "Interleaved" in cfg["layouts"][0] and rng.random() < 0.8:
        cfg["layouts"] = [rng.choice(["RowMajor", "ColumnMajor"]) for _ in range(3)]
    cfg["precompute_mode"] = rng.choice(["Host", "Device"])
    return cfg


def draw_grouped90(rng):
    """A GemmOperationGrouped(90) with an SM90 tile (the pointer-array kernel): the SM90 GEMM drawing, a per-group
    bias now and then."""
    cfg = draw_gemm90(rng)
    cfg["family"] = "grouped90"
    if rng.random() < 0.5:  # the grouped kernel's own schedules and scheduler
        cfg["tile_scheduler"] = "Default"
        cfg["kernel_schedule"] = rng.choice(["Auto", "TmaWarpSpecializedCooperative", "TmaWarpSpecializedPingpong",
                                             "TmaWarpSpecializedCooperativeFP8FastAccum",
                                             "TmaWarpSpecializedPingpongFP8FastAccum"])
        cfg["epilogue_schedule"] = "Auto"
    cfg["precompute_mode"] = "Device"
    cfg["bias"] = rng.choice([None, None, "column", "row"])
    return draw_epilogue_tile(cfg)


def draw_gemmarray90(rng):
    """A GemmOperationUniversal(90, ..., array=True) (the pointer-array kernel for Mode.Array's lists of matrices):
    the grouped drawing (the two kernels share their rules), without a bias."""
    cfg = draw_grouped90(rng)
    cfg.update(family="gemmarray90", array=True, bias=None)
    del cfg["precompute_mode"]
    return cfg


FLOAT_OUTPUTS = ("float16", "bfloat16", "float32")


def draw_moe90(rng):
    """A GemmOperationGrouped(90) for the MoE layouts (group sizes in a device tensor: packed tokens or the masked
    slabs): 16-bit operands, A and C row-major, a 16- or 32-bit float D, the grouped kernel's schedules, a per-group
    bias now and then."""
    math = draw_sm90_math(rng, elements=(D.float16, D.bfloat16))
    cfg = dict(family="moe90", cc=90, **draw_sm90_tile(rng, 16), **draw_common(rng, math, False))
    for key in ("a_align", "b_align"):
        if rng.random() < 0.9:
            cfg[key] = 8
    if cfg["c_elem"] not in FLOAT_OUTPUTS or rng.random() < 0.8:
        cfg["c_elem"] = rng.choice(FLOAT_OUTPUTS)
        cfg["c_align"] = 128 // D[cfg["c_elem"]].bits
    if cfg["epilogue"] == "FastLinearCombinationClamp" or cfg.get("element_epilogue") == "int32":
        cfg.update(epilogue="LinearCombination", element_epilogue=None)
    cfg["layouts"] = ["RowMajor", rng.choice(["RowMajor", "ColumnMajor"]), "RowMajor"]
    if rng.random() < 0.6:  # the grouped kernel's own schedules and scheduler
        cfg["tile_scheduler"] = "Default"
        cfg["kernel_schedule"] = rng.choice(["Auto", "TmaWarpSpecializedCooperative", "TmaWarpSpecializedPingpong"])
        cfg["epilogue_schedule"] = "Auto"
    cfg["swizzle"] = rng.choice(["IdentitySwizzle1", "IdentitySwizzle2", "IdentitySwizzle4", "IdentitySwizzle8"])
    cfg["precompute_mode"] = "Device"
    cfg["bias"] = rng.choice([None, None, "column", "row"])
    return draw_epilogue_tile(cfg)


SCALED_FORMS = ("blockwise", "grouped_blockwise", "grouped_rowwise")


def draw_scaled90(rng):
    """An SM90 GEMM with scales: fp8 with block-wise scales (dense, or grouped with device-side sizes), or a grouped
    GEMM with row-wise scales (fp8 or 16-bit operands, host-side sizes). Mostly drawn inside what the scaled main
    loops take (tile N and K 128 for block-wise, float outputs, no bias), now and then outside it."""
    form = rng.choice(SCALED_FORMS)
    fp8 = form != "grouped_rowwise" or rng.random() < 0.6
    element = D[rng.choice(("float8_e4m3", "float8_e5m2") if fp8 else ("float16", "bfloat16"))]
    math = draw_sm90_math(rng, elements=(element,))
    cfg = dict(family="scaled90", cc=90, form=form, scales=form.split("_")[-1], **draw_sm90_tile(rng, element.bits),
               **draw_common(rng, math, False))
    if fp8 and rng.random() < 0.5:
        cfg["b_elem"] = rng.choice(("float8_e4m3", "float8_e5m2"))
    for key in ("a_align", "b_align"):
        if rng.random() < 0.9:
            cfg[key] = 128 // element.bits
    if rng.random() < 0.85:
        cfg["c_elem"] = rng.choice(FLOAT_OUTPUTS)
        cfg["c_align"] = 128 // D[cfg["c_elem"]].bits
    if rng.random() < 0.85:
        cfg["epilogue"] = rng.choice(("LinearCombination", "LinearCombinationGeneric"))
        cfg["element_epilogue"] = rng.choice((None, "float32"))
    if form != "grouped_rowwise" and rng.random() < 0.8:
        cfg["tb"][1:] = [128, 128]
        cfg["kernel_schedule"] = rng.choice(("Auto", "TmaWarpSpecializedCooperative", "TmaWarpSpecializedPingpong"))
    if rng.random() < 0.8:
        cfg["tile_scheduler"] = "Default"
    if rng.random() < 0.7:
        cfg["epilogue_schedule"] = "Auto"
    cfg["layouts"] = ["RowMajor", "ColumnMajor", rng.choice(["RowMajor", "ColumnMajor"])] if fp8 else \
        [rng.choice(["RowMajor", "ColumnMajor"]) for _ in range(3)]
    if form == "grouped_blockwise":  # device-side sizes only: packed A and D
        cfg["layouts"][2] = "RowMajor"
    if form.startswith("grouped"):
        cfg["precompute_mode"] = "Device"
    cfg["swizzle"] = rng.choice(["IdentitySwizzle1", "IdentitySwizzle2", "IdentitySwizzle4", "IdentitySwizzle8"])
    cfg["bias"] = None
    return draw_epilogue_tile(cfg, chance=0.2)


EVT_ACTIVATIONS = ("relu", "sigmoid", "tanh", "silu", "hardswish", "gelu", "gelu_taylor", "leaky_relu")


def draw_evt_tree(rng, tile) -> str:
    """The source of a random ``EpilogueVisitTree.__call__``: the accumulator with C, a row and a column vector,
    alpha and beta now and then; 1 to 4 statements of + and - (any operand), * (by a scalar, a constant or a
    vector: products of two tensors would overflow float16), negation and the activations; returns the last
    tensor, now and then an intermediate one (an aux store) and a row or column sum of the last."""
    params = {"accum": "tensor"}
    for name, kind, chance in (("c", "tensor", 0.6), ("v_row", "row", 0.35), ("v_col", "column", 0.35),
                               ("alpha", "scalar", 0.6), ("beta", "scalar", 0.4)):
        if rng.random() < chance:
            params[name] = kind
    small = [name for name, kind in params.items() if kind in ("row", "column", "scalar")] + ["0.5", "2.0", "1.25"]
    tensors, lines = ["accum"], []
    for i in range(rng.randint(1, 4)):
        x, roll = rng.choice(tensors), rng.random()
        if roll < 0.3:
            act = rng.choice(EVT_ACTIVATIONS)
            expr = f"leaky_relu.numpy({x}, 0.2)" if act == "leaky_relu" else f"{act}.numpy({x})"
        elif roll < 0.35:
            expr = f"-{x}"
        elif roll < 0.6:
            y = rng.choice(small)
            expr = f"{y} * {x}" if rng.random() < 0.5 else f"{x} * {y}"
        else:
            y = rng.choice(small + tensors + (["c"] if "c" in params else []))
            expr = f"{x} {rng.choice('+-')} {y}"
        lines.append(f"t{i} = {expr}")
        tensors.append(f"t{i}")
    outputs = [tensors[-1]]
    if len(tensors) > 2 and rng.random() < 0.3:
        outputs.append(rng.choice(tensors[1:-1]))
    if rng.random() < 0.3:
        axis = rng.choice(["row", "column"])
        lines.append(f'r = reduction_op({tensors[-1]}, "{axis}", "Add", {tile[1] if axis == "row" else tile[0]})')
        outputs.append("r")
    body = "\n".join(lines)
    used = [name for name in params if name == "accum" or re.search(rf"\b{name}\b", body)]
    signature = ", ".join(f"{name}: '{params[name]}'" for name in used)
    return (f"def __call__(self, {signature}):\n" + "".join(f"    {line}\n" for line in lines) +
            f"    return {', '.join(outputs)}\n")


def draw_evt80(rng):
    """An Sm80-family GEMM whose epilogue is a random visitor tree (``visitor=True``): f16 operands with f32
    accumulation, A RowMajor and B ColumnMajor (what the runner builds), a RowMajor f16 or f32 C."""
    for _ in range(200):
        cfg = draw_gemm80(rng)
        if (cfg["element"], cfg["acc"], cfg["opclass"]) == ("float16", "float32", "TensorOp"):
            break
    cfg.pop("direct_store", None)  # the visitor tree is the epilogue
    out = rng.choice(["float16", "float32"])
    cfg.update(family="evt80", layouts=["RowMajor", "ColumnMajor", "RowMajor"], c_elem=out,
               c_align=rng.choice([2, 4, 8] if out == "float16" else [1, 2, 4]), epilogue="LinearCombination",
               activation="identity", element_epilogue=None,
               swizzle=rng.choice(["IdentitySwizzle1", "IdentitySwizzle2", "IdentitySwizzle4", "IdentitySwizzle8"]))
    cfg["tree"] = draw_evt_tree(rng, cfg["tb"])
    return cfg


def evt_class(source: str):
    """The EpilogueVisitTree subclass of a drawn ``__call__`` source (its name from the source's hash)."""
    from pycutlass import EpilogueVisitTree, reduction_op
    from pycutlass.epilogue import ACTIVATIONS as activations

    namespace = dict(activations, reduction_op=reduction_op)
    exec(compile(source, "<evt tree>", "exec"), namespace)  # noqa: S102  (our own drawn source)
    return type(f"FuzzTree{zlib.crc32(source.encode()):08x}_", (EpilogueVisitTree,),
                {"__call__": namespace["__call__"]})


def _splitk_producer(rng):
    """The operation whose parallel split-K writes the partial sums: mostly an Sm80-family GEMM with plain layouts,
    now and then an NHWC conv2d (dgrad with StrideSupport.Unity: the strided-dgrad kernel has no parallel mode)."""
    if rng.random() < 0.25:
        cfg = draw_conv80(rng)
        cfg.update(producer="conv80", layouts=["TensorNHWC"] * 3)
        if cfg["conv_kind"] == "dgrad" and cfg["stride_support"] == "Strided":
            cfg.update(stride_support="Unity", swizzle=rng.choice(["IdentitySwizzle1", "IdentitySwizzle2",
                                                                   "IdentitySwizzle4", "IdentitySwizzle8"]))
        return cfg
    int8 = rng.random() < 0.2  # int32 partials reduced into int8 (draw_gemm80 alone rarely builds an int8 GEMM)
    for _ in range(200 if int8 else 1):
        cfg = draw_gemm80(rng)
        if cfg["element"] == "int8" or not int8:
            break
    cfg["producer"] = "gemm80"
    if "Interleaved" in cfg["layouts"][0]:
        cfg["layouts"] = [rng.choice(["RowMajor", "ColumnMajor"]) for _ in range(3)]
    return cfg


def _splitk_workspace(rng, acc):
    """The type the partial sums are written in (the producer's C): mostly the accumulator's (exact partials), now
    and then a 16-bit output type (a partial rounding the reduction must be built for); never int8 (refused)."""
    if acc is D.int32:
        return D.int32 if rng.random() < 0.9 else D.float32
    if acc is not D.float32 or rng.random() < 0.7:
        return acc  # float64, or a float16 accumulator
    return rng.choice([D.float16, D.bfloat16])


def _partials_compute(workspace, compute):
    """The producer's epilogue compute type: not 16 bits for integer partials (it would round them, a lossy choice
    rather than a defect)."""
    return None if workspace.is_integer and compute in ("float16", "bfloat16") else compute


def _reduction_outputs(workspace):
    if workspace is D.float64:
        return [D.float64]
    if workspace is D.int32:
        return [D.int8, D.int8, D.int32, D.float32, D.float16]
    if workspace is D.float32:
        return [D.float16, D.bfloat16, D.float32]
    return [workspace, workspace, D.float32]


def draw_reduction(rng, workspace, layout):
    """A ReductionOperation for ``workspace`` partials in ``layout``: output type, accumulator, epilogue, count (a
    power of two within one 128-bit access of the output) and a block shape of mostly at most 1024 threads."""
    out = rng.choice(_reduction_outputs(workspace))
    acc = {D.float64: D.float64, D.int32: D.int32}.get(workspace, D.float32)
    if workspace.bits == 16 and rng.random() < 0.15:
        acc = workspace  # summing 16-bit partials in their own type
    epilogue = rng.choices(EPILOGUES[:3], weights=(5, 4, 2))[0]
    if epilogue == "LinearCombinationClamp" and out not in (D.int8, D.int32, D.float16, D.bfloat16):
        epilogue = "LinearCombination"  # CUTLASS's clamp needs numeric_limits of the output
    compute = None if out is D.float64 else rng.choice([None, None, None, "float32", "float16", "bfloat16",
                                                         "float64"])
    widest = 1 if out is D.float64 else 128 // out.bits  # (float64 tensors are accessed one element at a time)
    count = widest if rng.random() < 0.5 else rng.choice([c for c in (1, 2, 4, 8, 16) if c <= widest])
    threads, rows = rng.choice([1, 2, 3, 8, 16, 24, 32, 32, 64, 128]), rng.choice([1, 2, 3, 4, 4, 8, 16])
    return dict(c_elem=out.name, layout=layout, acc=acc.name, epilogue=epilogue, activation=rng.choice(ACTIVATIONS),
                element_epilogue=compute, c_align=count, shape=[rows, threads * count],
                partitions_per_stage=rng.choice([4, 4, 4, 1, 2, 8]))


def draw_splitk80(rng):
    """Parallel split-K: a producer (GEMM or conv2d) with a plain LinearCombination writing partial sums in
    ``c_elem``, and under "reduction" the ReductionOperation that sums them into D (``build_all``)."""
    cfg = _splitk_producer(rng)
    workspace = _splitk_workspace(rng, D[cfg["acc"]])
    compute = _partials_compute(workspace, cfg["element_epilogue"])
    cfg.update(family="splitk80", c_elem=workspace.name, c_align=_align(rng, workspace, cfg["producer"] == "gemm80"),
               epilogue="LinearCombination", activation="identity", element_epilogue=compute)
    layout = cfg["layouts"][2] if cfg["producer"] == "gemm80" else rng.choice(["RowMajor", "TensorNHWC"])
    cfg["reduction"] = draw_reduction(rng, workspace, layout)
    return cfg


def draw_splitk90(rng):
    """Parallel split-K on an SM90 GEMM (PyCUTLASS's GemmSplitKParallel: the L mode over equal K slices, partial sums
    in ``c_elem`` with 16-byte rows for TMA) and the ReductionOperation that sums them. The producer takes the
    Default tile scheduler and no bias, which parallel split-K needs; every schedule, cluster and layout else."""
    cfg = draw_gemm90(rng)
    workspace = _splitk_workspace(rng, D[cfg["acc"]])
    compute = _partials_compute(workspace, cfg["element_epilogue"])
    cfg.update(family="splitk90", producer="gemm90", tile_scheduler="Default", bias=None, c_elem=workspace.name,
               c_align=128 // workspace.bits, epilogue="LinearCombination", activation="identity",
               element_epilogue=compute)
    cfg["reduction"] = draw_reduction(rng, workspace, cfg["layouts"][2])
    return cfg


DRAWERS = {"gemm80": draw_gemm80, "conv80": draw_conv80, "gemm90": draw_gemm90, "conv90": draw_conv90,
           "grouped80": draw_grouped80, "grouped90": draw_grouped90, "gemmarray90": draw_gemmarray90,
           "evt80": draw_evt80, "splitk80": draw_splitk80, "splitk90": draw_splitk90, "moe90": draw_moe90,
           "scaled90": draw_scaled90}


# --- building ------------------------------------------------------------------------------------------------------
GROUPED_FAMILIES = ("grouped80", "grouped90", "moe90", "scaled90")  # scaled90: its grouped forms (blockwise: above)


def _epilogue(cfg):
    out, acc = D[cfg["c_elem"]], D[cfg["acc"]]
    ee = D[cfg["element_epilogue"]] if cfg.get("element_epilogue") else None
    kind = cfg["epilogue"]
    if kind == "LinearCombination":
        return cutlass.LinearCombination(out, cfg["c_align"], acc, ee)
    if kind == "LinearCombinationClamp":
        return cutlass.LinearCombinationClamp(out, cfg["c_align"], acc, ee)
    if kind == "FastLinearCombinationClamp":
        return cutlass.FastLinearCombinationClamp(out, cfg["c_align"])
    activation = getattr(cutlass, cfg["activation"])(ee or (D.float64 if out is D.float64 else D.float32))
    return cutlass.LinearCombinationGeneric(activation, out, cfg["c_align"], acc, ee)


def build(cfg):
    """The configuration's main operation (for "splitk80" / "splitk90": the producer of the partial sums)."""
    if cfg.get("producer"):
        return build(dict(cfg, family=cfg["producer"], producer=None))
    element_b = D[cfg["b_elem"]] if cfg["b_elem"] != cfg["a_elem"] else D[cfg["element"]]  # mixed fp8 pairs
    math = cutlass.MathInstruction(cfg["inst"], D[cfg["element"]], element_b, D[cfg["acc"]],
                                   cutlass.OpClass[cfg["opclass"]], cutlass.MathOperation[cfg["math_op"]])
    extra = {}
    if "cluster" in cfg:
        extra = dict(cluster_shape=cfg["cluster"],
                     kernel_schedule=_types.KernelScheduleType[cfg["kernel_schedule"]],
                     epilogue_schedule=_types.EpilogueScheduleType[cfg["epilogue_schedule"]],
                     tile_scheduler=_types.TileSchedulerType[cfg["tile_scheduler"]],
                     epilogue_tile=tuple(cfg["epilogue_tile"]) if cfg.get("epilogue_tile") else None)
    tile = cutlass.TileDescription(cfg["tb"], cfg["stages"], cfg["warps"], math, **extra)
    la, lb, lc = (L[x] for x in cfg["layouts"])
    A = cutlass.TensorDescription(D[cfg["a_elem"]], la, cfg["a_align"])
    B = cutlass.TensorDescription(D[cfg["b_elem"]], lb, cfg["b_align"])
    C = cutlass.TensorDescription(D[cfg["c_elem"]], lc, cfg["c_align"])
    epilogue = _epilogue(cfg)
    swizzle = SWIZZLES[cfg["swizzle"]]
    if cfg["family"] == "evt80":
        tree = evt_class(cfg["tree"])(epilogue, tile, D[cfg["acc"]], C.alignment, D.float32, C.element)
        tree.initialize()
        op = cutlass.GemmOperationUniversal(cfg["cc"], tile, A, B, C, tree, swizzle, visitor=True)
    elif cfg["family"].startswith("gemm") or cfg.get("form") == "blockwise":
        kwargs = {"bias": cfg["bias"]} if cfg.get("bias") else {}
        if cfg.get("scales"):
            kwargs["scales"] = cfg["scales"]
        if cfg.get("array"):
            kwargs["array"] = True
        if cfg.get("direct_store"):
            kwargs["direct_store"] = True
        op = cutlass.GemmOperationUniversal(cfg["cc"], tile, A, B, C, epilogue, swizzle, **kwargs)
    elif cfg["family"] in GROUPED_FAMILIES:
        kwargs = {"bias": cfg["bias"]} if cfg.get("bias") else {}
        if cfg.get("scales"):
            kwargs["scales"] = cfg["scales"]
        op = cutlass.GemmOperationGrouped(cfg["cc"], tile, A, B, C, epilogue, swizzle,
                                          cutlass.SchedulerMode[cfg["precompute_mode"]], **kwargs)
    else:
        kwargs = {"bias": True} if cfg.get("bias") else {}
        op = cutlass.Conv2dOperation(Operator[cfg["conv_kind"]], IteratorAlgorithm[cfg["algorithm"]], cfg["cc"],
                                     tile, A, B, C, StrideSupport[cfg["stride_support"]], epilogue, swizzle,
                                     **kwargs)
    return op


def companions(cfg):
    """The operations that run after the main one: the split-K reduction of a "splitk80" / "splitk90"
    configuration, else []."""
    spec = cfg.get("reduction")  # its output's element, alignment (= count) and epilogue as _epilogue reads them
    if spec is None:
        return []
    count = spec["c_align"]
    C = cutlass.TensorDescription(D[spec["c_elem"]], L[spec["layout"]], count)
    compute = D[spec["element_epilogue"]] if spec["element_epilogue"] else None
    return [cutlass.ReductionOperation(
        shape=cutlass.MatrixCoord(*spec["shape"]), C=C, element_accumulator=D[spec["acc"]],
        element_workspace=D[cfg["c_elem"]], element_compute=compute, epilogue_functor=_epilogue(spec), count=count,
        partitions_per_stage=spec["partitions_per_stage"], arch=cfg["cc"])]


def build_all(cfg):
    """Every operation of a configuration, the main one first (what the fuzz compiles and loads)."""
    return [build(cfg)] + companions(cfg)


def message_class(error: BaseException) -> str:
    text = str(error).split("\n")[0]
    text = re.sub(r"\[[^\]]*\]", "[..]", text)
    text = re.sub(r"\b\d+\b", "N", text)
    text = re.sub(r"'[^']*'|\"[^\"]*\"", "'..'", text)
    return f"{type(error).__name__}: {text[:110]}"


def draw(rng, family):
    """(cfg, operation or None, error class or None)."""
    cfg = DRAWERS[family](rng)
    try:
        return cfg, build_all(cfg)[0], None
    except DescriptionError as error:
        return cfg, None, message_class(error)
    except TypeError as error:  # e.g. an unexpected keyword: also a finding (not a DescriptionError)
        return cfg, None, "TypeError!: " + str(error)[:120]
    except Exception as error:  # noqa: BLE001  anything but DescriptionError at construction is a finding
        return cfg, None, f"UNEXPECTED {type(error).__name__}: {str(error)[:120]}"


def cmd_draw(args):
    rng = random.Random(args.seed)
    for family in args.families.split(","):
        rejected = collections.Counter()
        accepted = []
        for _ in range(args.count):
            cfg, op, error = draw(rng, family)
            if op is None:
                rejected[error] += 1
            else:
                accepted.append(cfg)
        print(f"== {family}: drawn {args.count}, accepted {len(accepted)}, rejected {sum(rejected.values())}")
        for msg, n in rejected.most_common(args.top):
            print(f"  {n:6d}  {msg}")
        if args.save:
            with open(f"{args.save}.{family}.jsonl", "w") as f:
                for cfg in accepted:
                    f.write(json.dumps(cfg) + "\n")


def _compile(ops, nvrtc):
    from pycutlass.compiler.manager import Compiler
    compiler = Compiler.of()
    backend = compiler.backend
    if nvrtc:
        cutlass.compiler.nvrtc()
    try:
        return compiler.add_module(ops, errors="report", jobs=1)
    finally:
        cutlass.compiler.use(backend)


def cmd_compile(args):
    rng = random.Random(args.seed)
    picked = []
    want = {"gemm80": args.sm80 - args.sm80 // 2, "conv80": args.sm80 // 2,
            "gemm90": args.sm90 - args.sm90 // 3, "conv90": args.sm90 // 3,
            "evt80": args.evt80, "grouped80": args.grouped80}
    for family, n in want.items():
        seen = set()
        tries = 0
        while n and tries < 20000:
            tries += 1
            cfg, op, error = draw(rng, family)
            if op is None or op.name in seen:
                continue
            seen.add(op.name)
            picked.append((cfg, op))
            n -= 1
    out = open(args.out, "a")
    evt = [(c, o) for c, o in picked if c["family"] == "evt80"]
    sm80 = [(c, o) for c, o in picked if o.family == "sm80" and c["family"] != "evt80"]
    sm90 = [(c, o) for c, o in picked if o.family != "sm80"]
    batches = []
    for i in range(0, len(sm80), args.batch):
        chunk = sm80[i:i + args.batch]
        batches.append((chunk, 80, i // args.batch % 3 == 2))  # every third batch with NVRTC
    for i in range(0, len(evt), args.batch):  # visitor trees: NVRTC, the EVT suites' backend
        batches.append((evt[i:i + args.batch], 80, True))
    for item in sm90:
        batches.append(([item], 90, False))
    for chunk, arch, nvrtc in batches:
        cutlass.compiler.set_target_arch(arch)
        start = time.time()
        ops = [o for _, o in chunk]
        report = _compile(ops, nvrtc)
        failed = {o.name: err for unit, err in report.failures for o in unit}
        if failed and len(ops) > 1:  # find the culprit(s) one at a time
            failed = {}
            for op in ops:
                single = _compile([op], nvrtc)
                for unit, err in single.failures:
                    failed[op.name] = err
        for cfg, op in chunk:
            err = failed.get(op.name)
            record = dict(cfg=cfg, name=op.name, describe=op.describe(), nvrtc=nvrtc or op.family != "sm80",
                          ok=err is None, error=None if err is None else _error_summary(err))
            out.write(json.dumps(record) + "\n")
            out.flush()
            print(("OK  " if err is None else "FAIL") + f" {op.describe()}", flush=True)
            if err is not None:
                print("     " + record["error"][:1500].replace("\n", "\n     "), flush=True)
        print(f"   batch of {len(ops)} ({'nvrtc' if nvrtc else 'default'}, sm{arch}) {time.time() - start:.0f} s",
              flush=True)


def _error_summary(err) -> str:
    log = getattr(err, "log", "") or str(err)
    lines = [ln for ln in log.splitlines() if "error" in ln.lower() or "static assert" in ln.lower()
             or "static_assert" in ln.lower()]
    return "\n".join(lines[:12]) or log[-1500:]


def cmd_config(args):
    cfg = json.loads(args.json)
    op = build(cfg)
    print(op.describe())
    if args.compile:
        cutlass.compiler.set_target_arch(90 if op.family != "sm80" else 80)
        report = _compile([op], args.nvrtc)
        for unit, err in report.failures:
            print(getattr(err, "log", str(err))[-6000:])
        print("OK" if not report.failures else "FAIL")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("draw")
    p.add_argument("--count", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--families", default="gemm80,conv80,gemm90,conv90")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--save", default=None, help="prefix of .<family>.jsonl files of accepted configurations")
    p = sub.add_parser("compile")
    p.add_argument("--sm80", type=int, default=30)
    p.add_argument("--sm90", type=int, default=6)
    p.add_argument("--evt80", type=int, default=0, help="visitor-tree GEMMs (compiled with NVRTC)")
    p.add_argument("--grouped80", type=int, default=0, help="Sm80-family grouped GEMMs")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--out", default="/tmp/fuzz_results.jsonl")
    p = sub.add_parser("config")
    p.add_argument("json")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--nvrtc", action="store_true")
    args = parser.parse_args(argv)
    {"draw": cmd_draw, "compile": cmd_compile, "config": cmd_config}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
