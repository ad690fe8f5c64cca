"""SearchSpace: a declarative grid over the description fields, pruned by the descriptions' own validation.

Every point of the grid is a flat, JSON-able ``params`` dict; :func:`build_operation` turns params into an
operation (or raises the descriptions' DescriptionError), and the space enumerates its points through it, so a GPU
host that receives only params (a bundle, a results-database row) rebuilds exactly the operation that was swept.
Nothing compiles here.

    space = SearchSpace(compute_capability=80, dtypes="f16_f32acc", threadblock_shape=[[128, 128, 32],
                        [128, 256, 32]], stages=[3, 4, 5], warp_count=[[2, 2, 1], [2, 4, 1]])
    built = space.build()          # built.operations, built.pruned_by_reason, built.summary()
    SearchSpace.from_file("examples/spaces/sm80_f16.toml")

Dimensions (a list of values each; a scalar is a one-element list; for the 3-integer fields a bare [a, b, c] is one
value) and what ``"auto"`` means are listed in ``DIMENSIONS`` and docs/search-spaces.md.
"""
from __future__ import annotations

import copy
import hashlib
import itertools
import json
import math
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Iterator, Mapping

from ..description.math_instruction import WARPGROUP_MATH_INSTRUCTIONS, MathInstruction
from ..description.rules import summary as rule_summary
from ..description.target import OPERATION_COMPUTE_CAPABILITIES, Target
from ..description.tensor_description import TensorDescription
from ..description.tile_description import SM90_WARP_COUNTS, TileDescription
from ..description import types as _types
from ..description.types import (DataType, EpilogueScheduleType, KernelScheduleType, LayoutType, MathOperation,
                                 OpClass, SwizzlingFunctor, TileSchedulerType)
from ..emit.names import SHORT
from ..epilogue.activations import ACTIVATIONS
from ..epilogue.functors import LinearCombination, LinearCombinationClamp, LinearCombinationGeneric
from ..errors import ArgumentError, DescriptionError
from ..kinds.base import Operation
from ..kinds.gemm_sm90.operation import TILE_N as SM90_TILE_N

KINDS = ("gemm", "grouped_gemm", "conv2d")
COMPUTE_CAPABILITIES = OPERATION_COMPUTE_CAPABILITIES
MAX_POINTS = 100_000  # a raw grid larger than this is almost always a typo (an extra zero, a swapped list)
AUTO = "auto"

# ---- names that files spell ---------------------------------------------------------------------------------------
DATA_TYPES = MappingProxyType({**{dt.label: dt for dt in DataType}, **{short: dt for dt, short in SHORT.items()}})
SWIZZLES = MappingProxyType({s.name: s for s in vars(_types).values() if isinstance(s, SwizzlingFunctor)})
EPILOGUES = ("linear_combination", "clamp", *ACTIVATIONS)  # activations: LinearCombinationGeneric
LAYOUT_LETTERS = MappingProxyType({"r": LayoutType.RowMajor, "c": LayoutType.ColumnMajor})
CONV_KINDS = ("fprop", "dgrad", "wgrad")
ITERATOR_ALGORITHMS = ("analytic", "optimized", "fixed_channels", "few_channels")
STRIDE_SUPPORTS = ("strided", "unity")
PRECOMPUTE_MODES = ("Device", "Host")


@dataclass(frozen=True)
class DtypeCombo:
    """Element types of one GEMM: operands A/B, accumulator, C/D, and the epilogue's compute type."""

    element_a: DataType
    element_b: DataType
    element_accumulator: DataType
    element_c: DataType
    element_epilogue: DataType = DataType.float32
    math_operation: MathOperation = MathOperation.multiply_add

    def to_params(self) -> dict:
        return {"element_a": self.element_a.label, "element_b": self.element_b.label,
                "element_accumulator": self.element_accumulator.label, "element_c": self.element_c.label,
                "element_epilogue": self.element_epilogue.label, "math_operation": self.math_operation.name}

    def memory(self, element: DataType) -> DataType:
        """tf32 operands live in memory as float32."""
        return DataType.float32 if element is DataType.tfloat32 else element


_D = DataType
DTYPE_COMBOS = MappingProxyType({
    "f16_f32acc": DtypeCombo(_D.float16, _D.float16, _D.float32, _D.float16),
    "f16": DtypeCombo(_D.float16, _D.float16, _D.float16, _D.float16),  # f16 accumulation too
    "f16_f32out": DtypeCombo(_D.float16, _D.float16, _D.float32, _D.float32),
    "bf16": DtypeCombo(_D.bfloat16, _D.bfloat16, _D.float32, _D.bfloat16),
    "tf32": DtypeCombo(_D.tfloat32, _D.tfloat32, _D.float32, _D.float32),
    "f64": DtypeCombo(_D.float64, _D.float64, _D.float64, _D.float64, _D.float64),
    "e4m3": DtypeCombo(_D.float8_e4m3, _D.float8_e4m3, _D.float32, _D.bfloat16),  # SM90 family only
    "s8": DtypeCombo(_D.int8, _D.int8, _D.int32, _D.int8),
    "s8_s32out": DtypeCombo(_D.int8, _D.int8, _D.int32, _D.int32),
})
_DTYPE_FIELDS = ("element_a", "element_b", "element_accumulator", "element_c", "element_epilogue", "math_operation")

# Sm80 mma.sync shapes by operand type (the Sm80-style shape also means "the builder chooses" for fp8 on SM90).
_SM80_INSTRUCTIONS = {16: (16, 8, 16), 8: (16, 8, 32), 32: (16, 8, 8), 64: (8, 8, 4)}


# ---- one value of each dimension: validated, in canonical JSON form ----------------------------------------------
def _allowed(field: str, value, allowed) -> ArgumentError:
    return ArgumentError(f"{field}: {value!r} is not allowed; choose from {list(allowed)}")


def _choice(allowed: tuple, normalize: Callable[[str], str] = str) -> Callable:
    by_key = {normalize(a): a for a in allowed}

    def parse(field: str, value):
        if not isinstance(value, str) or normalize(value) not in by_key:
            raise _allowed(field, value, allowed)
        return by_key[normalize(value)]
    return parse


def _enum_choice(enum_type) -> Callable:
    # Aliases (TileSchedulerType.Persistent is Default) become the canonical member name.
    def parse(field: str, value):
        if not isinstance(value, str) or value not in enum_type.__members__:
            raise _allowed(field, value, list(enum_type.__members__))
        return enum_type[value].name
    return parse


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _triple(field: str, value, auto: bool = False, none: bool = False):
    if auto and value == AUTO:
        return AUTO
    if none and (value is None or value == "none"):
        return None
    if isinstance(value, (list, tuple)) and len(value) == 3 and all(_is_int(v) and v > 0 for v in value):
        return list(value)
    extra = (' or "auto"' if auto else "") + (' or "none"' if none else "")
    raise ArgumentError(f"{field}: {value!r} is not allowed; give 3 positive integers [m, n, k]{extra}")


_parse_kind = _choice(KINDS)


def _parse_cc(field: str, value):
    try:
        target = Target.parse(value) if not isinstance(value, bool) else None
    except DescriptionError:
        target = None
    if target is None or target.suffix or target.compute_capability not in COMPUTE_CAPABILITIES:
        raise _allowed(field, value, COMPUTE_CAPABILITIES)
    return target.compute_capability


def _data_type(field: str, value) -> DataType:
    if not isinstance(value, str) or value not in DATA_TYPES:
        raise _allowed(field, value, list(DATA_TYPES))
    return DATA_TYPES[value]


def _combo_from_mapping(field: str, value: Mapping) -> DtypeCombo:
    unknown = sorted(set(value) - set(_DTYPE_FIELDS))
    missing = [name for name in ("element_a", "element_accumulator", "element_c") if name not in value]
    if unknown or missing:
        raise ArgumentError(f"{field}: an explicit combination takes {list(_DTYPE_FIELDS)} (element_a, "
                            f"element_accumulator and element_c required); unknown {unknown}, missing {missing}")
    a = _data_type(f"{field}.element_a", value["element_a"])
    b = _data_type(f"{field}.element_b", value.get("element_b", a.label))
    acc = _data_type(f"{field}.element_accumulator", value["element_accumulator"])
    c = _data_type(f"{field}.element_c", value["element_c"])
    wide = DataType.float64 in (acc, c)  # a float64 epilogue must compute in float64 (EpilogueFunctor)
    epilogue = _data_type(f"{field}.element_epilogue", value.get("element_epilogue", "f64" if wide else "f32"))
    operation = value.get("math_operation", "multiply_add")
    if not isinstance(operation, str) or operation not in MathOperation.__members__:
        raise _allowed(f"{field}.math_operation", operation, list(MathOperation.__members__))
    return DtypeCombo(a, b, acc, c, epilogue, MathOperation[operation])


def _parse_dtypes(field: str, value):
    if isinstance(value, str):
        if value not in DTYPE_COMBOS:
            raise ArgumentError(f"{field}: {value!r} is not a known combination; choose from {list(DTYPE_COMBOS)} "
                                f"or give a dict of {list(_DTYPE_FIELDS)}")
        return value
    if isinstance(value, Mapping):
        return _combo_from_mapping(field, value).to_params()
    raise ArgumentError(f"{field}: {value!r} is not allowed; give a name from {list(DTYPE_COMBOS)} or a dict of "
                        f"{list(_DTYPE_FIELDS)}")


def _parse_layouts(field: str, value):
    if isinstance(value, str) and len(value) == 3 and all(ch in LAYOUT_LETTERS for ch in value.lower()):
        return value.lower()
    raise ArgumentError(f"{field}: {value!r} is not allowed; give three letters for A, B and C, each r (RowMajor) or "
                        f"c (ColumnMajor), e.g. 'rcr' (A row-major, B column-major, C row-major: cuBLAS's 'TN')")


def _parse_alignment(field: str, value):
    if value == "max":
        return "max"
    if _is_int(value) and value > 0:
        return [value] * 3
    if isinstance(value, (list, tuple)) and len(value) == 3 and all(_is_int(v) and v > 0 for v in value):
        return list(value)
    raise ArgumentError(f"{field}: {value!r} is not allowed; give \"max\" (16 bytes per access, as wide as the type "
                        f"allows), one integer for A, B and C, or [a, b, c] in elements")


def _parse_stages(field: str, value):
    if value == AUTO or (_is_int(value) and value >= 0):
        return value
    raise ArgumentError(f"{field}: {value!r} is not allowed; give an integer (2..10 on Sm80; 0 = CUTLASS's "
                        f"automatic count on SM90) or \"auto\"")


def _parse_epilogue_tile(field: str, value):
    if value == AUTO or value is None:
        return AUTO
    if isinstance(value, (list, tuple)) and len(value) == 2 and all(_is_int(v) and v > 0 for v in value):
        return list(value)
    raise ArgumentError(f"{field}: {value!r} is not allowed; give [rows, columns] (the SM90 TMA epilogue's sub-tile) "
                        f"or \"auto\" (CUTLASS's choice)")


@dataclass(frozen=True)
class Dimension:
    name: str
    kinds: tuple[str, ...]  # the kinds whose points have this field
    default: tuple
    parse: Callable[[str, Any], Any]
    triple: bool = False  # values are [a, b, c]: a bare list of three integers is one value
    pair: bool = False  # values are [a, b]: a bare list of two integers is one value
    # Left out of spaces and params while at its default, so that adding the dimension changed no existing space's
    # fingerprint, point or results row.
    omit_default: bool = False

    def values(self, raw) -> tuple:
        """A dimension's value list, each value checked and canonical."""
        if isinstance(raw, (list, tuple)):
            one_triple = (self.triple and len(raw) == 3 or self.pair and len(raw) == 2) and \
                all(_is_int(v) for v in raw)
            items = [raw] if one_triple else list(raw)
        else:
            items = [raw]
        if not items:
            raise ArgumentError(f"{self.name}: give at least one value")
        canonical = [self.parse(self.name, item) for item in items]
        unique = []
        for value in canonical:  # a value listed twice would only duplicate points
            if value not in unique:
                unique.append(value)
        return tuple(unique)


_ALL, _GEMMS, _GEMM, _CONV = KINDS, ("gemm", "grouped_gemm"), ("gemm",), ("conv2d",)
# The enumeration order (outermost first); a point's params keep it.
DIMENSIONS = tuple(Dimension(*spec) for spec in (
    ("kind", _ALL, ("gemm",), _parse_kind),
    ("compute_capability", _ALL, (80,), _parse_cc),
    ("dtypes", _ALL, ("f16_f32acc",), _parse_dtypes),
    ("layouts", _GEMMS, ("rcr",), _parse_layouts),
    ("alignment", _ALL, ("max",), _parse_alignment),
    ("epilogue", _ALL, ("linear_combination",), _choice(EPILOGUES)),
    ("conv_kind", _CONV, ("fprop",), _choice(CONV_KINDS, str.lower)),
    ("iterator_algorithm", _CONV, ("optimized",), _choice(ITERATOR_ALGORITHMS, str.lower)),
    ("stride_support", _CONV, ("strided",), _choice(STRIDE_SUPPORTS, str.lower)),
    ("precompute_mode", ("grouped_gemm",), ("Device",), _choice(PRECOMPUTE_MODES, str.lower)),
    ("threadblock_shape", _ALL, (AUTO,), lambda f, v: _triple(f, v, auto=True), True),
    ("warp_count", _ALL, (AUTO,), lambda f, v: _triple(f, v, auto=True, none=True), True),
    ("stages", _ALL, (AUTO,), _parse_stages),
    ("instruction_shape", _ALL, (AUTO,), lambda f, v: _triple(f, v, auto=True), True),
    ("cluster_shape", _ALL, ((1, 1, 1),), _triple, True),  # SM90 kernels of every kind take a cluster
    ("kernel_schedule", _ALL, ("Auto",), _enum_choice(KernelScheduleType)),  # SM90 conv: cooperative or not
    ("epilogue_schedule", _GEMM, ("Auto",), _enum_choice(EpilogueScheduleType)),
    ("tile_scheduler", _GEMM, ("Default",), _enum_choice(TileSchedulerType)),
    ("swizzle", _ALL, ("IdentitySwizzle1",), _choice(tuple(SWIZZLES))),
)) + (Dimension("epilogue_tile", _GEMMS, (AUTO,), _parse_epilogue_tile, pair=True, omit_default=True),)  # SM90
DIMENSIONS_BY_NAME = MappingProxyType({d.name: d for d in DIMENSIONS})


def dimensions_of(kind: str) -> tuple[Dimension, ...]:
    return tuple(d for d in DIMENSIONS if kind in d.kinds)


# ---- params: resolve "auto", then build --------------------------------------------------------------------------
def _combo_of(params: Mapping) -> tuple[str, DtypeCombo]:
    """The point's types: its element_* fields when present (what points carry), else its dtypes name/dict."""
    label = params.get("dtypes", DIMENSIONS_BY_NAME["dtypes"].default[0])
    if any(name in params for name in _DTYPE_FIELDS):
        combo = _combo_from_mapping("params", {k: params[k] for k in _DTYPE_FIELDS if k in params})
        if isinstance(label, str) and label in DTYPE_COMBOS and DTYPE_COMBOS[label] != combo:
            raise ArgumentError(f"params: dtypes {label!r} disagrees with the element fields {combo.to_params()}")
        return (label if isinstance(label, str) else "custom"), combo
    value = _parse_dtypes("dtypes", label)
    if isinstance(value, str):
        return value, DTYPE_COMBOS[value]
    return "custom", _combo_from_mapping("dtypes", value)


def _is_sm90(cc: int, warp_count) -> bool:
    """Compute capability 90 picks CUTLASS 3.x for operations whose warps are left to it (as the kinds do: see
    GemmOperationUniversal); a stated Sm80 warp arrangement keeps the CUTLASS 2.x kernel."""
    return cc == 90 and (warp_count in (AUTO, None) or tuple(warp_count) in SM90_WARP_COUNTS)


def _auto_tile(sm90: bool, element: DataType) -> list[int]:
    # K of 128 bytes is the SM90 TMA swizzle atom; 64 bytes is CUTLASS's usual Sm80 choice (f64: 16 elements).
    return [128, 128, 1024 // element.bits] if sm90 else [128, 128, max(16, 512 // element.bits)]


def _auto_warps(tile) -> list[int]:
    """CUTLASS's generator's arrangement: 64x64 warp tiles on large tiles, else 2x2 warps."""
    m, n, _ = tile
    if m * n >= 128 * 128 and m % 64 == 0 and n % 64 == 0:
        return [m // 64, n // 64, 1]
    return [2, 2, 1]


def _auto_instruction(sm90: bool, combo: DtypeCombo, tile) -> list[int]:
    k = WARPGROUP_MATH_INSTRUCTIONS.get((combo.element_a, combo.element_accumulator))
    if sm90 and k is not None:
        from ..kinds.conv2d_sm90.operation import FILTER_TAPS_TILE_N
        # one wgmma spans the tile's N; the filter-tap-reuse wgrad's N is one 64-wide wgmma per filter tap
        return [64, 64 if tile[1] == FILTER_TAPS_TILE_N else tile[1], k]
    return list(_SM80_INSTRUCTIONS[combo.element_a.bits])


def _max_alignment(element: DataType) -> int:
    # 16 bytes per access; CUTLASS's double-precision kernels access one element at a time.
    return 1 if element is DataType.float64 else 128 // element.bits


def resolve_params(params: Mapping) -> dict:
    """Complete params: missing fields take their dimension's default, "auto" values are resolved, types spelled
    out. Idempotent; raises ArgumentError for an unknown field or value."""
    if not isinstance(params, Mapping):
        raise ArgumentError(f"params must be a dict, got {type(params).__name__}")
    kind = _parse_kind("kind", params.get("kind", "gemm"))
    dims = dimensions_of(kind)
    allowed = {d.name for d in dims} | set(_DTYPE_FIELDS)
    unknown = sorted(set(params) - allowed)
    if unknown:
        raise ArgumentError(f"params: unknown field(s) {unknown} for kind {kind}; allowed: "
                            f"{[d.name for d in dims] + list(_DTYPE_FIELDS)}")
    label, combo = _combo_of(params)  # "dtypes" may be the label "custom" here: the element fields tell
    value = {d.name: d.parse(d.name, params[d.name] if d.name in params else d.default[0])
             for d in dims if d.name != "dtypes"}
    for d in dims:
        if d.omit_default and value[d.name] == d.default[0]:
            del value[d.name]
    cc = value["compute_capability"]
    sm90 = _is_sm90(cc, value["warp_count"])
    if value["threadblock_shape"] == AUTO:
        value["threadblock_shape"] = _auto_tile(sm90, combo.element_a)
    if value["warp_count"] == AUTO:
        value["warp_count"] = None if sm90 else _auto_warps(value["threadblock_shape"])
    if value["stages"] == AUTO:
        value["stages"] = 0 if sm90 else 3
    if value["instruction_shape"] == AUTO:
        value["instruction_shape"] = _auto_instruction(sm90, combo, value["threadblock_shape"])
    if value["alignment"] == "max":
        value["alignment"] = [_max_alignment(combo.memory(e)) for e in (combo.element_a, combo.element_b,
                                                                          combo.element_c)]
    resolved = {}
    for d in dims:
        if d.name == "dtypes":
            resolved["dtypes"] = label
            resolved.update(combo.to_params())
        elif d.name in value:
            resolved[d.name] = value[d.name]
    return resolved


def _epilogue_functor(name: str, combo: DtypeCombo, alignment: int):
    args = (combo.element_c, alignment, combo.element_accumulator, combo.element_epilogue)
    if name == "linear_combination":
        return LinearCombination(*args)
    if name == "clamp":
        return LinearCombinationClamp(*args)
    return LinearCombinationGeneric(ACTIVATIONS[name](combo.element_epilogue), *args)


def build_operation(params: Mapping):
    """The operation a point's params describe; raises DescriptionError when the descriptions reject it (and
    ArgumentError for params that name no valid value). The inverse of ``SpacePoint.params``. A GEMM's params may
    also carry ``bias`` ("row" or "column": the SM90 bias vector, beside the space's fields)."""
    bias = None
    if isinstance(params, Mapping) and params.get("bias") is not None:
        params = dict(params)
        bias = params.pop("bias")
    p = resolve_params(params)
    _, combo = _combo_of(p)
    kind, cc = p["kind"], p["compute_capability"]
    inst = p["instruction_shape"]
    opclass = OpClass.Simt if inst == [1, 1, 1] else OpClass.TensorOp
    math_instruction = MathInstruction(inst, combo.element_a, combo.element_b, combo.element_accumulator, opclass,
                                       combo.math_operation)
    extras = {"cluster_shape": p["cluster_shape"], "kernel_schedule": KernelScheduleType[p["kernel_schedule"]]}
    if p.get("epilogue_tile", AUTO) != AUTO:
        extras["epilogue_tile"] = tuple(p["epilogue_tile"])
    if kind == "gemm":
        extras.update(epilogue_schedule=EpilogueScheduleType[p["epilogue_schedule"]],
                      tile_scheduler=TileSchedulerType[p["tile_scheduler"]])
    tile = TileDescription(p["threadblock_shape"], p["stages"], p["warp_count"], math_instruction, **extras)
    if kind == "conv2d":
        layouts = (LayoutType.TensorNHWC,) * 3
    else:
        layouts = tuple(LAYOUT_LETTERS[ch] for ch in p["layouts"])
    elements = (combo.memory(combo.element_a), combo.memory(combo.element_b), combo.element_c)
    A, B, C = (TensorDescription(e, layout, align) for e, layout, align in zip(elements, layouts, p["alignment"]))
    epilogue = _epilogue_functor(p["epilogue"], combo, p["alignment"][2])
    swizzle = SWIZZLES[p["swizzle"]]
    from ..kinds import Conv2dOperation, GemmOperationGrouped, GemmOperationUniversal, SchedulerMode
    if kind == "gemm":
        return GemmOperationUniversal(cc, tile, A, B, C, epilogue, swizzle, **({"bias": bias} if bias else {}))
    if bias is not None:
        raise ArgumentError(f"params: bias={bias!r} is for GEMM operations, not {kind}")
    if kind == "grouped_gemm":
        return GemmOperationGrouped(cc, tile, A, B, C, epilogue, swizzle, SchedulerMode[p["precompute_mode"]])
    from ..kinds.conv2d.problem import IteratorAlgorithm, Operator, StrideSupport
    return Conv2dOperation(Operator[p["conv_kind"]], IteratorAlgorithm[p["iterator_algorithm"]], cc, tile, A, B, C,
                           StrideSupport(p["stride_support"]), epilogue, swizzle)


# ---- why a point was pruned ---------------------------------------------------------------------------------------
# Phrases of the descriptions' rules -> one short reason each, so a report counts rules, not messages.
_PREFIX = re.compile(r"^[A-Za-z_][\w.]*(\(\w+\))?( \(\w+\))?: ")
_NOISE = re.compile(r"\[[^\]]*\]|\([^)]*\)|(?<!\w)'[^']*'(?!\w)|\"[^\"]*\"")
_NUMBER = re.compile(r"\b\d+(\.\d+)?\b")


def reason_of(error: BaseException) -> str:
    """A short key shared by every rejection by the same rule: the summary of the error's rule code
    (``description.rules.RULES``), else the message's first line without its operation prefix, the value it got,
    advice, bracketed and quoted values ("#" for numbers)."""
    known = rule_summary(getattr(error, "rule", None))
    if known:
        return known
    text = str(error)
    line = _PREFIX.sub("", text.splitlines()[0] if text else type(error).__name__)
    line = re.split(r",? got |; |\. ", line)[0]  # the rule comes first; the value it got and advice follow
    line = _NUMBER.sub("#", _NOISE.sub("", line))
    line = re.sub(r"\s+", " ", line).strip(" ,;:.")
    if len(line) > 100:
        line = line[:100].rsplit(" ", 1)[0]
    return line or type(error).__name__


# ---- named filters (usable from files) ----------------------------------------------------------------------------
def _warp_m_at_most_64(params: Mapping):
    """Warp tiles taller than 64 rows are valid but spill registers (far slower): not worth compiling."""
    warps = params.get("warp_count")
    if warps and params["threadblock_shape"][0] // warps[0] > 64:
        return "warp tile taller than 64 rows"
    return True


def _no_clusters(params: Mapping):
    """Keep only points without a thread-block cluster (when clusters are not what is being tuned)."""
    return True if params.get("cluster_shape", [1, 1, 1]) == [1, 1, 1] else "cluster larger than 1x1"


# CUTLASS's setmaxnreg budget for an SM90 consumer thread (ping-pong 240, cooperative 232); the mainloop also needs
# registers for addresses, barriers and the epilogue, so accumulators beyond this many spill to local memory.
ACCUMULATOR_REGISTER_LIMIT = 208
# A cooperative consumer with a fused epilogue has less to spare: 256x192 (192 per thread) with bias + GELU ran
# 2.0-2.9x the time of 128x256 (128 per thread) on H200 (bf16 6304x3072x768), where ping-pong 128x192 (also 192) was
# the fastest tile. With a plain linear combination the same 192 fit: 256x192 with a 1x2 cluster was the fastest of
# nine grouped tiles on 5 of 24 MoE problems (benchmarks/moe.py, H200).
COOPERATIVE_ACCUMULATOR_REGISTER_LIMIT = 160


def accumulator_register_limit(schedule: str, fused_epilogue: bool = True) -> int:
    """Accumulator registers per consumer thread beyond which an SM90 schedule's tile cannot win (``fused_epilogue``:
    a bias or an activation, whose epilogue needs registers of its own)."""
    if schedule == "cooperative" and fused_epilogue:
        return COOPERATIVE_ACCUMULATOR_REGISTER_LIMIT
    return ACCUMULATOR_REGISTER_LIMIT


def sm90_schedule(name: str, tile_m: int, kind: str = "gemm") -> str:
    """The SM90 kernel a kernel_schedule name builds for a kind: "cooperative", "pingpong" or "warpspecialized"
    (``Auto`` as the operations resolve it)."""
    auto = name in ("Auto", "ScheduleAuto")
    if kind == "conv2d":  # CUTLASS's single-consumer kernel, or pycutlass's persistent cooperative one (asked for,
        # or Auto on a 256-row tile, which only it runs)
        return "cooperative" if "Cooperative" in name or (auto and tile_m == 256) else "warpspecialized"
    if "Cooperative" in name:
        return "cooperative"
    if "Pingpong" in name:
        return "pingpong"
    if auto:  # what the builder picks: cooperative when tile M splits in two
        if tile_m % 128 == 0:
            return "cooperative"
        return "pingpong" if kind == "grouped_gemm" else "warpspecialized"  # pointer-array: no plain kernel
    return "warpspecialized"


def _no_register_spills(params: Mapping):
    """SM90 kernels whose consumer threads cannot hold the tile's accumulators (ping-pong or warp-specialized with
    a 128x256 float32 tile, cooperative with 256x256: 256 registers per thread) spill and run an order of magnitude
    slower; cooperative 256x192 (192) with a bias or an activation runs two to three times slower: they cannot
    win."""
    if params.get("kind") not in _ALL or params.get("compute_capability") != 90 or params.get("warp_count"):
        return True
    p = resolve_params({k: v for k, v in params.items() if k != "bias"})
    tile_m, tile_n = p["threadblock_shape"][:2]
    schedule = sm90_schedule(str(p.get("kernel_schedule", "Auto")), tile_m, p["kind"])
    cooperative = schedule == "cooperative"
    if cooperative and tile_m % 128 or not cooperative and (tile_m not in (64, 128) or
                                                             p.get("tile_scheduler") == "StreamK"):
        return True  # the descriptions reject it, with their own reason
    from ..kinds.conv2d_sm90.operation import FILTER_TAPS_TILE_N
    # cooperative splits the tile over two consumer warpgroups; the filter-tap-reuse wgrad over three
    consumers = 3 if p["kind"] == "conv2d" and tile_n == FILTER_TAPS_TILE_N else 2 if cooperative else 1
    registers = tile_m * tile_n * DataType[str(p["element_accumulator"])].bits // 32 // (128 * consumers)
    fused = bool(params.get("bias")) or p["epilogue"] != "linear_combination"
    limit = accumulator_register_limit(schedule, fused) if consumers == 2 else ACCUMULATOR_REGISTER_LIMIT
    if registers > limit:
        return (f"cannot win: accumulators spill registers ({schedule} {tile_m}x{tile_n} tile, {registers} per "
                f"consumer thread)")
    return True


BUILTIN_FILTERS = MappingProxyType({"warp_m_at_most_64": _warp_m_at_most_64,
                                    "no_clusters": _no_clusters,
                                    "no_register_spills": _no_register_spills})


def _filter_name(function) -> str:
    return getattr(function, "__qualname__", None) or repr(function)


# ---- points and the built space -----------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class SpacePoint:
    """One point: its params and either the operation or why it was pruned (``reason`` groups, ``message`` tells)."""

    params: dict
    operation: Any = None
    reason: str | None = None
    message: str | None = None

    @property
    def valid(self) -> bool:
        return self.operation is not None


class BuiltSpace:
    """A space's points split into unique operations (first point wins), duplicates and pruned points."""

    def __init__(self, space: "SearchSpace", points):
        self.space = space
        operations: dict[str, Any] = {}
        self._params: dict[str, dict] = {}
        duplicates, pruned = [], []
        for point in points:
            if not point.valid:
                pruned.append(point)
            elif point.operation.name in operations:
                duplicates.append(point)  # e.g. "Auto" and the schedule it resolves to: one kernel
            else:
                operations[point.operation.name] = point.operation
                self._params[point.operation.name] = point.params
        self.operations = tuple(operations.values())
        self.duplicates = tuple(duplicates)
        self.pruned = tuple(pruned)
        self.pruned_by_reason = Counter(point.reason for point in pruned)

    def params_of(self, operation) -> dict:
        """The params of ``operation`` (or of an operation name)."""
        name = operation if isinstance(operation, str) else operation.name if isinstance(operation, Operation) else None
        if name not in self._params:
            raise ArgumentError(f"{name or operation!r} is not an operation of this space")
        return copy.deepcopy(self._params[name])

    def __len__(self) -> int:
        return len(self.operations)

    def __iter__(self):
        return iter(self.operations)

    def summary(self) -> str:
        text = f"{len(self.operations)} valid"
        if self.duplicates:
            text += f" ({len(self.duplicates)} duplicate{'s' if len(self.duplicates) != 1 else ''} dropped)"
        text += f", {len(self.pruned)} pruned"
        if self.pruned:
            text += ": " + ", ".join(f"{count} {reason}" for reason, count in self.pruned_by_reason.most_common())
        return text

    def __repr__(self) -> str:
        return f"<BuiltSpace {self.summary()}>"


def _load_yaml(text: str, path: Path):
    try:
        import yaml
    except ImportError:
        raise ArgumentError(f"search space file {path}: reading YAML needs PyYAML (pip install pyyaml); "
                            f"or write the same keys as .toml") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ValueError(str(error)) from None


class SearchSpace:
    """An immutable grid: each dimension is a list of values (see ``DIMENSIONS``); ``filters`` are predicates
    ``filter(params) -> True | False | "reason"`` or names from ``BUILTIN_FILTERS`` (only names go to files)."""

    __slots__ = ("_dims", "_name", "_filters", "_max_points")

    def __init__(self, *, name: str | None = None, filters=(), max_points: int = MAX_POINTS, **dimensions):
        unknown = sorted(set(dimensions) - set(DIMENSIONS_BY_NAME))
        if unknown:
            raise ArgumentError(f"SearchSpace: unknown field(s) {unknown}; allowed: "
                                f"{[d.name for d in DIMENSIONS] + ['name', 'filters']}")
        if name is not None and not isinstance(name, str):
            raise ArgumentError(f"SearchSpace name must be a string, got {name!r}")
        kinds = DIMENSIONS_BY_NAME["kind"].values(dimensions.get("kind", "gemm"))
        dims = {}
        for d in DIMENSIONS:
            if not any(kind in d.kinds for kind in kinds):
                if d.name in dimensions:
                    raise ArgumentError(f"SearchSpace: {d.name} applies to kind {list(d.kinds)} only; this space's "
                                        f"kinds are {list(kinds)}")
                continue
            values = d.values(dimensions[d.name] if d.name in dimensions else d.default)
            if not (d.omit_default and values == d.values(d.default)):
                dims[d.name] = values
        object.__setattr__(self, "_dims", dims)
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_filters", self._check_filters(filters))
        object.__setattr__(self, "_max_points", max_points)
        if self.size > max_points:
            sizes = ", ".join(f"{n} {len(v)}" for n, v in dims.items() if len(v) > 1)
            raise ArgumentError(f"SearchSpace has {self.size:,} raw points, more than max_points={max_points:,} "
                                f"(values per dimension: {sizes}); trim a dimension or pass a larger max_points")

    @staticmethod
    def _check_filters(filters) -> tuple:
        if callable(filters) or isinstance(filters, str):
            filters = [filters]
        checked = []
        for f in filters:
            if isinstance(f, str):
                if f not in BUILTIN_FILTERS:
                    raise _allowed("filters", f, BUILTIN_FILTERS)
            elif not callable(f):
                raise ArgumentError(f"filters: {f!r} is neither a callable nor a name from {list(BUILTIN_FILTERS)}")
            if f not in checked:
                checked.append(f)
        return tuple(checked)

    def __setattr__(self, key, value):
        raise AttributeError("SearchSpace is immutable; build a new one (e.g. from a modified to_dict())")

    # --- construction from data --------------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, d: Mapping, **options) -> "SearchSpace":
        if not isinstance(d, Mapping):
            raise ArgumentError(f"a search space is a dict of dimensions, got {type(d).__name__}")
        return cls(**{**d, **options})

    @classmethod
    def from_file(cls, path) -> "SearchSpace":
        """A ``.toml``, ``.json`` or ``.yaml`` file holding what ``to_dict()`` returns (top-level keys). YAML needs
        PyYAML (``pip install pyyaml``); TOML and JSON need nothing beyond Python."""
        path = Path(path)
        suffix = path.suffix.lower()
        if suffix not in (".toml", ".json", ".yaml", ".yml"):
            raise ArgumentError(f"search space file {path}: unsupported suffix {suffix!r}; use .toml, .json or .yaml")
        try:
            text = path.read_text()
        except OSError as error:
            raise ArgumentError(f"cannot read search space file {path}: {error.strerror or error}") from None
        try:
            if suffix == ".toml":
                import tomllib

                data = tomllib.loads(text)
            elif suffix == ".json":
                data = json.loads(text)
            else:
                data = _load_yaml(text, path)
        except ValueError as error:  # tomllib.TOMLDecodeError and json.JSONDecodeError both are
            raise ArgumentError(f"search space file {path} cannot be parsed: {error}") from None
        if not isinstance(data, dict):
            raise ArgumentError(f"search space file {path} must hold a table of dimensions, got {type(data).__name__}")
        if not data:  # an empty file would silently become the default space
            raise ArgumentError(f"search space file {path} is empty: set at least one of "
                                f"{[d.name for d in DIMENSIONS] + ['name', 'filters']}, or pass a preset name "
                                f"{list(PRESETS)}")
        return cls.from_dict(data)

    @classmethod
    def preset(cls, name: str) -> "SearchSpace":
        if name not in PRESETS:
            raise _allowed("preset", name, PRESETS)
        return cls.from_dict(PRESETS[name])

    @staticmethod
    def presets() -> tuple[str, ...]:
        return tuple(PRESETS)

    # --- what it is --------------------------------------------------------------------------------------------
    @property
    def name(self) -> str | None:
        return self._name

    @property
    def filters(self) -> tuple:
        return self._filters

    @property
    def kinds(self) -> tuple[str, ...]:
        return self._dims["kind"]

    @property
    def dimensions(self) -> Mapping[str, tuple]:
        return MappingProxyType(copy.deepcopy(self._dims))

    @property
    def size(self) -> int:
        """Raw points before pruning: per kind, the product of its dimensions' lengths."""
        return sum(math.prod(len(self._dims[d.name]) for d in dimensions_of(kind)
                             if d.name != "kind" and d.name in self._dims) for kind in self.kinds)

    def to_dict(self) -> dict:
        """Every dimension (defaults included, but not those left out at their default) with canonical values, the
        name, and the named filters (custom callables cannot be written down; ``fingerprint`` still tells them
        apart)."""
        d = {"name": self._name} if self._name else {}
        d.update({name: list(copy.deepcopy(values)) for name, values in self._dims.items()})
        named = [f for f in self._filters if isinstance(f, str)]
        if named:
            d["filters"] = named
        return d

    @property
    def fingerprint(self) -> str:
        """sha256 of the canonical JSON of the grid (the name left out; custom filters by qualified name)."""
        d = self.to_dict()
        d.pop("name", None)
        custom = [_filter_name(f) for f in self._filters if not isinstance(f, str)]
        if custom:
            d["custom_filters"] = custom
        return hashlib.sha256(json.dumps(d, sort_keys=True, separators=(",", ":")).encode()).hexdigest()

    def __eq__(self, other) -> bool:
        return isinstance(other, SearchSpace) and self.fingerprint == other.fingerprint \
            and self._filters == other._filters

    def __hash__(self) -> int:
        return hash(self.fingerprint)

    def __repr__(self) -> str:
        label = f" {self._name!r}" if self._name else ""
        return f"<SearchSpace{label} {self.size} raw points, {self.fingerprint[:12]}>"

    # --- enumeration -------------------------------------------------------------------------------------------
    def raw_points(self) -> Iterator[dict]:
        """The grid's combinations before resolution, in enumeration order."""
        for kind in self.kinds:
            dims = [d for d in dimensions_of(kind) if d.name != "kind" and d.name in self._dims]
            for combination in itertools.product(*(self._dims[d.name] for d in dims)):
                raw = {"kind": kind}
                raw.update({d.name: copy.deepcopy(v) for d, v in zip(dims, combination)})
                yield raw

    def _filtered(self, params: dict) -> str | None:
        for f in self._filters:
            function = BUILTIN_FILTERS[f] if isinstance(f, str) else f
            verdict = function(params)
            if verdict is False:
                return f"filtered by {f if isinstance(f, str) else _filter_name(f)}"
            if isinstance(verdict, str):
                return verdict
        return None

    def points(self) -> Iterator[SpacePoint]:
        """Every point, in a deterministic order: built by :func:`build_operation`, or pruned with a reason."""
        for raw in self.raw_points():
            params = resolve_params(raw)
            rejected = self._filtered(copy.deepcopy(params))
            if rejected:
                yield SpacePoint(params, None, rejected, rejected)
                continue
            try:
                operation = build_operation(params)
            except DescriptionError as error:
                yield SpacePoint(params, None, reason_of(error), str(error))
                continue
            yield SpacePoint(params, operation)

    def build(self) -> BuiltSpace:
        return BuiltSpace(self, self.points())


# ---- presets ------------------------------------------------------------------------------------------------------
def _frozen(value):
    """Module constants stay immutable: lists become tuples, dicts read-only mappings."""
    if isinstance(value, Mapping):
        return MappingProxyType({key: _frozen(v) for key, v in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    return value


PRESETS = _frozen({
    # examples/gemm_tile_grid.py's full grid (and its filter) with three swizzles: 204 configurations.
    "sm80-f16": {
        "name": "sm80-f16", "kind": ["gemm"], "compute_capability": [80], "dtypes": ["f16_f32acc"],
        "layouts": ["rcr"],
        "threadblock_shape": [[64, 128, 32], [128, 64, 32], [128, 128, 32], [128, 256, 32], [256, 128, 32],
                              [64, 256, 32], [256, 64, 32], [64, 64, 64], [64, 128, 64], [128, 64, 64],
                              [128, 128, 64], [128, 256, 64], [256, 128, 64]],
        "warp_count": [[2, 2, 1], [4, 2, 1], [2, 4, 1]], "stages": [3, 4, 5],
        "swizzle": ["IdentitySwizzle1", "IdentitySwizzle2", "IdentitySwizzle4"],
        "filters": ["warp_m_at_most_64"],
    },
    "sm80-f16-small": {
        "name": "sm80-f16-small", "kind": ["gemm"], "compute_capability": [80], "dtypes": ["f16_f32acc"],
        "threadblock_shape": [[128, 128, 32], [128, 256, 32], [64, 128, 32], [128, 256, 64]],
        "warp_count": ["auto"], "stages": [3, 4],
    },
    # What the SM90 kind accepts: tiles M 64/128/256 x N 32/64/128/192/256 x K 64, clusters, every schedule.
    "sm90-f16": {
        "name": "sm90-f16", "kind": ["gemm"], "compute_capability": [90], "dtypes": ["f16_f32acc"],
        "threadblock_shape": [[m, n, 64] for m in (64, 128, 256) for n in SM90_TILE_N],
        "warp_count": ["auto"], "stages": [0],
        "cluster_shape": [[1, 1, 1], [2, 1, 1], [1, 2, 1]],
        "kernel_schedule": ["TmaWarpSpecialized", "TmaWarpSpecializedCooperative", "TmaWarpSpecializedPingpong"],
        "epilogue_schedule": ["Auto", "NoSmemWarpSpecialized"],
        "tile_scheduler": ["Default", "StreamK"],
        "filters": ["no_register_spills"],
    },
    "sm90-f16-small": {
        "name": "sm90-f16-small", "kind": ["gemm"], "compute_capability": [90], "dtypes": ["f16_f32acc"],
        "threadblock_shape": [[128, 128, 64], [128, 256, 64], [64, 128, 64]],
        "warp_count": ["auto"], "stages": [0], "cluster_shape": [[1, 1, 1], [2, 1, 1]],
        "kernel_schedule": ["Auto"],
        "filters": ["no_register_spills"],
    },
})
