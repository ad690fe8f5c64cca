"""Problem sets: the shapes a sweep times its kernels on.

A problem is a frozen value with a ``kind`` ("gemm", "conv2d", "grouped_gemm", "masked_grouped_gemm"), a readable
unique ``key``, its
``flops`` and a JSON form (``to_dict()`` / :func:`problem_from_dict`). A :class:`ProblemSet` is a named, ordered,
de-duplicated, immutable sequence of them; the generators below build the usual ones:

- :func:`square_problems`, :func:`gemm_range`, :func:`explicit_problems`: GEMM grids and lists
- :func:`model_problems`: the layer GEMMs of common LLMs (shapes from the models' published configs)
- :func:`resnet50_conv_problems`: the distinct convolutions of ResNet-50
- :func:`grouped_problems`: MoE-style groups with random M per expert
- :func:`moe_problems`, :func:`moe_sets`: the expert GEMMs of Mixtral-8x7B, Qwen3-30B-A3B and DeepSeek-V3 (forward
  in the contiguous and masked layouts, weight gradients as K-grouped GEMMs) over a seeded, skewed routing draw
- :func:`parse_problems`: the command line's one-string form of all of the above
"""
from __future__ import annotations

import hashlib
import json
import numbers
import random
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import ClassVar, Iterable, Iterator, Mapping, Sequence

from ..errors import ArgumentError

CONV_KINDS = ("fprop", "dgrad", "wgrad")


def _positive_int(what: str, value) -> int:
    # bool is an Integral too, and True as a size is always a mistake; numpy integers are welcome.
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ArgumentError(f"{what} must be a positive integer, got {value!r}")
    return int(value)


def _int_pair(what: str, value, minimum: int) -> tuple[int, int]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or len(value) != 2:
        raise ArgumentError(f"{what} must be two integers (h, w), got {value!r}")
    pair = []
    for v in value:
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < minimum:
            raise ArgumentError(f"{what} must be two integers >= {minimum} (h, w), got {value!r}")
        pair.append(int(v))
    return tuple(pair)


class _Problem:
    """Ordering across kinds: by kind, then by each kind's own fields (so mixed sets sort too)."""

    kind: ClassVar[str]

    def _order(self) -> tuple:
        raise NotImplementedError

    def _sort_key(self) -> tuple:
        return (self.kind, self._order())

    def __lt__(self, other):
        return self._sort_key() < other._sort_key() if isinstance(other, _Problem) else NotImplemented

    def __le__(self, other):
        return self._sort_key() <= other._sort_key() if isinstance(other, _Problem) else NotImplemented

    def __gt__(self, other):
        return self._sort_key() > other._sort_key() if isinstance(other, _Problem) else NotImplemented

    def __ge__(self, other):
        return self._sort_key() >= other._sort_key() if isinstance(other, _Problem) else NotImplemented

    def __str__(self) -> str:
        return self.key


@dataclass(frozen=True)
class GemmProblem(_Problem):
    """D (m x n) = A (m x k) @ B (k x n), ``batch`` times."""

    m: int
    n: int
    k: int
    batch: int = 1
    kind: ClassVar[str] = "gemm"

    def __post_init__(self):
        for name in ("m", "n", "k", "batch"):
            object.__setattr__(self, name, _positive_int(f"GemmProblem.{name}", getattr(self, name)))

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.m, self.n, self.k)

    @property
    def key(self) -> str:
        return f"gemm {self.m}x{self.n}x{self.k}" + (f" b{self.batch}" if self.batch != 1 else "")

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k * self.batch

    def _order(self) -> tuple:
        return (self.m, self.n, self.k, self.batch)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "m": self.m, "n": self.n, "k": self.k, "batch": self.batch}


@dataclass(frozen=True)
class Conv2dProblem(_Problem):
    """A 2-D convolution, NHWC activation and KRSC filter; ``pad`` is symmetric (h, w), as in PyTorch's Conv2d."""

    n: int
    h: int
    w: int
    c: int
    k: int
    r: int
    s: int
    pad: tuple[int, int] = (0, 0)
    stride: tuple[int, int] = (1, 1)
    dilation: tuple[int, int] = (1, 1)
    kind: ClassVar[str] = "conv2d"

    def __post_init__(self):
        for name in ("n", "h", "w", "c", "k", "r", "s"):
            object.__setattr__(self, name, _positive_int(f"Conv2dProblem.{name}", getattr(self, name)))
        object.__setattr__(self, "pad", _int_pair("Conv2dProblem.pad", self.pad, 0))
        object.__setattr__(self, "stride", _int_pair("Conv2dProblem.stride", self.stride, 1))
        object.__setattr__(self, "dilation", _int_pair("Conv2dProblem.dilation", self.dilation, 1))
        p, q = self.output_size
        if p < 1 or q < 1:
            raise ArgumentError(f"Conv2dProblem: the {self.r}x{self.s} filter (dilation {list(self.dilation)}) "
                                f"does not fit the {self.h}x{self.w} input padded by {list(self.pad)}: the output "
                                f"would be {p}x{q}")

    @property
    def output_size(self) -> tuple[int, int]:
        """(P, Q), PyTorch's formula."""
        (ph, pw), (sh, sw), (dh, dw) = self.pad, self.stride, self.dilation
        return ((self.h + 2 * ph - dh * (self.r - 1) - 1) // sh + 1,
                (self.w + 2 * pw - dw * (self.s - 1) - 1) // sw + 1)

    def gemm_shape(self, conv_kind="fprop") -> tuple[int, int, int]:
        """The implicit GEMM's (M, N, K): fprop NPQ x K x RSC, dgrad NHW x C x RSK, wgrad K x RSC x NPQ."""
        name = getattr(conv_kind, "name", conv_kind)  # pycutlass.conv.Operator members too
        p, q = self.output_size
        if name == "fprop":
            return (self.n * p * q, self.k, self.r * self.s * self.c)
        if name == "dgrad":
            return (self.n * self.h * self.w, self.c, self.r * self.s * self.k)
        if name == "wgrad":
            return (self.k, self.r * self.s * self.c, self.n * p * q)
        raise ArgumentError(f"conv_kind must be one of {list(CONV_KINDS)}, got {conv_kind!r}")

    def to_problem_size(self):
        """The runtime's ``pycutlass.conv.Conv2dProblemSize`` for this problem."""
        from ..kinds.conv2d.problem import Conv2dProblemSize

        (ph, pw) = self.pad
        return Conv2dProblemSize((self.n, self.h, self.w, self.c), (self.k, self.r, self.s, self.c),
                                 (ph, ph, pw, pw), self.stride, self.dilation)

    @property
    def key(self) -> str:
        key = f"conv2d {self.n}x{self.h}x{self.w}x{self.c} k{self.k} {self.r}x{self.s}"
        for label, value, default in (("pad", self.pad, (0, 0)), ("stride", self.stride, (1, 1)),
                                      ("dil", self.dilation, (1, 1))):
            if value != default:
                key += f" {label}{value[0]},{value[1]}"
        return key

    @property
    def flops(self) -> int:
        m, n, k = self.gemm_shape("fprop")
        return 2 * m * n * k

    def _order(self) -> tuple:
        return (self.n, self.h, self.w, self.c, self.k, self.r, self.s, self.pad, self.stride, self.dilation)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "n": self.n, "h": self.h, "w": self.w, "c": self.c, "k": self.k, "r": self.r,
                "s": self.s, "pad": list(self.pad), "stride": list(self.stride), "dilation": list(self.dilation)}


@dataclass(frozen=True)
class GroupedGemmProblem(_Problem):
    """One launch of a grouped GEMM: ``shapes`` is the (m, n, k) of each group, in order."""

    shapes: tuple[tuple[int, int, int], ...]
    kind: ClassVar[str] = "grouped_gemm"

    def __post_init__(self):
        if isinstance(self.shapes, (str, bytes)) or not isinstance(self.shapes, Iterable):
            raise ArgumentError(f"GroupedGemmProblem.shapes must be a sequence of (m, n, k), got {self.shapes!r}")
        shapes = []
        for i, shape in enumerate(self.shapes):
            if isinstance(shape, (str, bytes)) or not isinstance(shape, Sequence) or len(shape) != 3:
                raise ArgumentError(f"GroupedGemmProblem.shapes[{i}] must be (m, n, k), got {shape!r}")
            shapes.append(tuple(_positive_int(f"GroupedGemmProblem.shapes[{i}].{d}", v) for d, v in zip("mnk", shape)))
        if not shapes:
            raise ArgumentError("GroupedGemmProblem needs at least one (m, n, k) shape")
        object.__setattr__(self, "shapes", tuple(shapes))

    @property
    def count(self) -> int:
        return len(self.shapes)

    @property
    def digest(self) -> str:
        """A short hash of the shapes: the key stays short however many groups there are."""
        return hashlib.sha256(json.dumps(self.shapes).encode()).hexdigest()[:10]

    @property
    def key(self) -> str:
        return f"grouped_gemm {self.count} groups {self.digest}"

    @property
    def flops(self) -> int:
        return sum(2 * m * n * k for m, n, k in self.shapes)

    def _order(self) -> tuple:
        return (self.count, self.shapes)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "shapes": [list(shape) for shape in self.shapes]}


@dataclass(frozen=True, eq=True)
class MaskedGroupedProblem(_Problem):
    """One launch of a grouped GEMM in the masked layout (MoE decode): ``experts`` groups of a fixed ``capacity``
    rows each (A is experts x capacity x k, D experts x capacity x n), of which group e computes its first
    ``counts[e]`` rows; the counts live on the device, so one captured CUDA graph serves every routing."""

    experts: int
    capacity: int
    n: int
    k: int
    counts: tuple[int, ...]
    kind: ClassVar[str] = "masked_grouped_gemm"

    def __post_init__(self):
        for name in ("experts", "capacity", "n", "k"):
            object.__setattr__(self, name, _positive_int(f"MaskedGroupedProblem.{name}", getattr(self, name)))
        if isinstance(self.counts, (str, bytes)) or not isinstance(self.counts, Iterable):
            raise ArgumentError(f"MaskedGroupedProblem.counts must be a sequence of integers, got {self.counts!r}")
        counts = tuple(self.counts)
        if len(counts) != self.experts:
            raise ArgumentError(f"MaskedGroupedProblem: {len(counts)} counts for {self.experts} experts")
        for e, count in enumerate(counts):
            if isinstance(count, bool) or not isinstance(count, numbers.Integral) or not 0 <= count <= self.capacity:
                raise ArgumentError(f"MaskedGroupedProblem.counts[{e}] = {count!r}: a count is an integer from 0 "
                                    f"to the capacity ({self.capacity})")
        object.__setattr__(self, "counts", tuple(int(c) for c in counts))

    @property
    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.counts).encode()).hexdigest()[:10]

    @property
    def key(self) -> str:
        return f"masked_grouped_gemm {self.experts}x{self.capacity} n={self.n} k={self.k} {self.digest}"

    @property
    def flops(self) -> int:
        return sum(2 * count * self.n * self.k for count in self.counts)

    def _order(self) -> tuple:
        return (self.experts, self.capacity, self.n, self.k, self.counts)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "experts": self.experts, "capacity": self.capacity, "n": self.n, "k": self.k,
                "counts": list(self.counts)}


Problem = GemmProblem | Conv2dProblem | GroupedGemmProblem | MaskedGroupedProblem
PROBLEM_TYPES = MappingProxyType({cls.kind: cls for cls in (GemmProblem, Conv2dProblem, GroupedGemmProblem,
                                                            MaskedGroupedProblem)})


def problem_from_dict(d: Mapping) -> Problem:
    """The inverse of ``problem.to_dict()``."""
    if not isinstance(d, Mapping) or d.get("kind") not in PROBLEM_TYPES:
        raise ArgumentError(f"a problem is a dict with 'kind' one of {list(PROBLEM_TYPES)}, got {d!r}")
    cls = PROBLEM_TYPES[d["kind"]]
    fields = {key: value for key, value in d.items() if key != "kind"}
    allowed = [name for name in cls.__dataclass_fields__ if name != "kind"]
    unknown = sorted(set(fields) - set(allowed))
    if unknown:
        raise ArgumentError(f"{d['kind']} problem: unknown field(s) {unknown}; allowed: {allowed}")
    if cls is GroupedGemmProblem and isinstance(fields.get("shapes"), list):
        fields["shapes"] = tuple(tuple(shape) if isinstance(shape, list) else shape for shape in fields["shapes"])
    for pair in ("pad", "stride", "dilation", "counts"):
        if isinstance(fields.get(pair), list):
            fields[pair] = tuple(fields[pair])
    try:
        return cls(**fields)
    except TypeError as error:  # a required field is missing
        raise ArgumentError(f"{d['kind']} problem {d!r}: {error}; fields: {allowed}") from None


def _as_problem(value) -> Problem:
    if isinstance(value, _Problem):
        return value
    if isinstance(value, Mapping):
        return problem_from_dict(value)
    raise ArgumentError(f"a ProblemSet holds GemmProblem, Conv2dProblem or GroupedGemmProblem values (or their "
                        f"dicts), got {value!r}")


class ProblemSet(Sequence):
    """A named, ordered, de-duplicated, immutable sequence of problems (the first occurrence keeps its place)."""

    __slots__ = ("_name", "_problems")

    def __init__(self, name: str, problems: Iterable = ()):
        if not isinstance(name, str) or not name:
            raise ArgumentError(f"ProblemSet name must be a non-empty string, got {name!r}")
        self._name = name
        self._problems = tuple(dict.fromkeys(_as_problem(p) for p in problems))

    @property
    def name(self) -> str:
        return self._name

    @property
    def problems(self) -> tuple:
        return self._problems

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(p.kind for p in self._problems))

    def __iter__(self) -> Iterator[Problem]:
        return iter(self._problems)

    def __len__(self) -> int:
        return len(self._problems)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return ProblemSet(self._name, self._problems[index])
        return self._problems[index]

    def __add__(self, other: "ProblemSet") -> "ProblemSet":
        if not isinstance(other, ProblemSet):
            return NotImplemented
        return ProblemSet(f"{self._name}+{other._name}", self._problems + other._problems)

    def __eq__(self, other) -> bool:
        return isinstance(other, ProblemSet) and (self._name, self._problems) == (other._name, other._problems)

    def __hash__(self) -> int:
        return hash((self._name, self._problems))

    def __repr__(self) -> str:
        return f"<ProblemSet {self._name!r}: {len(self)} problems>"

    def to_dict(self) -> dict:
        return {"name": self._name, "problems": [p.to_dict() for p in self._problems]}

    @classmethod
    def from_dict(cls, d: Mapping) -> "ProblemSet":
        if not isinstance(d, Mapping) or not isinstance(d.get("problems"), list):
            raise ArgumentError("a problem set is a dict {'name': str, 'problems': [problem dicts]}, got "
                                f"{type(d).__name__}")
        return cls(d.get("name") or "problems", [problem_from_dict(p) for p in d["problems"]])

    def to_json(self, path) -> Path:
        path = Path(path)
        path.write_text(json.dumps(self.to_dict(), indent=1) + "\n")
        return path

    @classmethod
    def from_json(cls, path) -> "ProblemSet":
        """Reads what ``to_json`` wrote, or a bare JSON list of problem dicts (named after the file)."""
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except OSError as error:
            raise ArgumentError(f"cannot read the problem file {path}: {error.strerror or error}") from None
        except json.JSONDecodeError as error:
            raise ArgumentError(f"the problem file {path} is not valid JSON: {error}") from None
        if isinstance(data, list):
            data = {"name": path.stem, "problems": data}
        return cls.from_dict(data)


# ---- GEMM grids ---------------------------------------------------------------------------------------------------
def _inclusive(what: str, start, end, step) -> range:
    start, end, step = (_positive_int(f"{what} {label}", v) for label, v in
                        (("start", start), ("end", end), ("step", step)))
    if end < start:
        raise ArgumentError(f"{what}: end ({end}) is below start ({start})")
    return range(start, end + 1, step)


def square_problems(start: int, end: int, step: int) -> ProblemSet:
    """m = n = k from ``start`` to ``end`` inclusive (the seed's --dim-start/--dim-end/--dim-increment)."""
    sizes = _inclusive("square_problems", start, end, step)
    return ProblemSet(f"square {start}..{end} step {step}", (GemmProblem(d, d, d) for d in sizes))


def _axis(name: str, value) -> list[int]:
    """An int, a list of ints, a ``range`` (Python's, end excluded) or a (start, end, step) tuple (end included)."""
    if isinstance(value, range):
        values = list(value)
    elif isinstance(value, tuple):
        if len(value) != 3:
            raise ArgumentError(f"{name}: a tuple is (start, end, step) with end included, got {value!r}; give a "
                                f"list for explicit values")
        values = list(_inclusive(name, *value))
    elif isinstance(value, list):
        values = value
    else:
        values = [value]
    if not values:
        raise ArgumentError(f"{name}: no values in {value!r}")
    return [_positive_int(name, v) for v in values]


def gemm_range(m, n, k, batch=1, name: str | None = None) -> ProblemSet:
    """The cartesian product of m, n, k (and batch), each an int, a list, a range or a (start, end, step) tuple."""
    axes = [_axis(label, value) for label, value in (("m", m), ("n", n), ("k", k), ("batch", batch))]
    problems = [GemmProblem(mm, nn, kk, bb) for mm in axes[0] for nn in axes[1] for kk in axes[2] for bb in axes[3]]
    return ProblemSet(name or "gemm range", problems)


def explicit_problems(shapes: Iterable, name: str = "explicit") -> ProblemSet:
    """GEMMs from (m, n, k) or (m, n, k, batch) tuples (or GemmProblem values)."""
    problems = []
    for shape in shapes:
        if isinstance(shape, GemmProblem):
            problems.append(shape)
        elif isinstance(shape, Sequence) and not isinstance(shape, str) and len(shape) in (3, 4):
            problems.append(GemmProblem(*shape))
        else:
            raise ArgumentError(f"explicit_problems takes (m, n, k) or (m, n, k, batch) shapes, got {shape!r}")
    return ProblemSet(name, problems)


# ---- LLM layer shapes ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LayerShape:
    """One linear layer y = x @ W with W of k x n; ``tp_split`` says which of them tensor parallelism divides:
    "n" for column-parallel layers (fused QKV, gate+up), "k" for row-parallel ones (attention output, down)."""

    name: str
    k: int
    n: int
    tp_split: str

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ArgumentError(f"LayerShape.name must be a non-empty string, got {self.name!r}")
        _positive_int(f"LayerShape {self.name}: k", self.k)
        _positive_int(f"LayerShape {self.name}: n", self.n)
        if self.tp_split not in ("n", "k"):
            raise ArgumentError(f"LayerShape {self.name}: tp_split must be 'n' (column parallel) or 'k' (row "
                                f"parallel), got {self.tp_split!r}")

    def gemm(self, tokens: int, tp: int) -> GemmProblem:
        """This layer's GEMM on one of ``tp`` ranks, for ``tokens`` rows of activations."""
        split = self.n if self.tp_split == "n" else self.k
        if split % tp:
            raise ArgumentError(f"layer {self.name}: {self.tp_split.upper()}={split} is not divisible by tp={tp}")
        if self.tp_split == "n":
            return GemmProblem(tokens, self.n // tp, self.k)
        return GemmProblem(tokens, self.n, self.k // tp)


def transformer_layers(hidden: int, intermediate: int, heads: int, kv_heads: int, head_dim: int) -> tuple:
    """The four linear layers of a Llama-style decoder block (gated MLP), from the model config's numbers."""
    q, kv = heads * head_dim, kv_heads * head_dim
    return (LayerShape("qkv_proj", hidden, q + 2 * kv, "n"),
            LayerShape("o_proj", q, hidden, "k"),
            LayerShape("gate_up_proj", hidden, 2 * intermediate, "n"),
            LayerShape("down_proj", intermediate, hidden, "k"))


# hidden_size, intermediate_size, num_attention_heads, num_key_value_heads, head_dim: the models' config.json.
# Mixtral's intermediate size is per expert (each expert is one gated MLP).
_MODEL_CONFIGS = (
    ("llama-2-7b", 4096, 11008, 32, 32, 128),
    ("llama-2-13b", 5120, 13824, 40, 40, 128),
    ("llama-2-70b", 8192, 28672, 64, 8, 128),
    ("llama-3-8b", 4096, 14336, 32, 8, 128),
    ("llama-3-70b", 8192, 28672, 64, 8, 128),
    ("mistral-7b", 4096, 14336, 32, 8, 128),
    ("mixtral-8x7b", 4096, 14336, 32, 8, 128),
    ("qwen2-7b", 3584, 18944, 28, 4, 128),
    ("gemma-7b", 3072, 24576, 16, 16, 256),
)
BUILTIN_MODELS = MappingProxyType({name: transformer_layers(*dims) for name, *dims in _MODEL_CONFIGS})

DEFAULT_BATCH_SIZES = (1, 16, 32, 64, 128, 256, 512)


class ModelShapes:
    """A registry of model name -> layer shapes. ``ModelShapes.default()`` holds the built-in models; register
    your own on an instance you keep (nothing global changes)."""

    def __init__(self, models: Mapping | None = None):
        self._models: dict[str, tuple[LayerShape, ...]] = {}
        for name, layers in (models or {}).items():
            self.register(name, layers)

    @classmethod
    def default(cls) -> "ModelShapes":
        return cls(BUILTIN_MODELS)

    def register(self, name: str, layers: Iterable, replace: bool = False) -> "ModelShapes":
        """``layers``: LayerShape values or (name, k, n, tp_split) tuples. Returns self, to chain."""
        if not isinstance(name, str) or not name.strip():
            raise ArgumentError(f"model name must be a non-empty string, got {name!r}")
        key = name.strip().lower()
        if key in self._models and not replace:
            raise ArgumentError(f"model {key!r} is already registered; pass replace=True to redefine it")
        shapes = []
        for layer in layers:
            if isinstance(layer, LayerShape):
                shapes.append(layer)
            elif isinstance(layer, Sequence) and not isinstance(layer, str) and len(layer) == 4:
                shapes.append(LayerShape(*layer))
            else:
                raise ArgumentError(f"model {key!r}: a layer is a LayerShape or (name, k, n, tp_split), "
                                    f"got {layer!r}")
        if not shapes:
            raise ArgumentError(f"model {key!r} needs at least one layer")
        self._models[key] = tuple(shapes)
        return self

    def names(self) -> tuple[str, ...]:
        return tuple(self._models)

    def layers(self, name: str) -> tuple[LayerShape, ...]:
        key = name.strip().lower() if isinstance(name, str) else name
        if key not in self._models:
            raise ArgumentError(f"unknown model {name!r}; known models: {', '.join(self._models)}")
        return self._models[key]

    def __contains__(self, name) -> bool:
        return isinstance(name, str) and name.strip().lower() in self._models


def _int_list(what: str, values) -> tuple[int, ...]:
    values = [values] if isinstance(values, numbers.Integral) else list(values)
    if not values:
        raise ArgumentError(f"{what}: give at least one value")
    return tuple(_positive_int(what, v) for v in values)


def model_problems(model: str, tp_sizes=(1,), batch_sizes=DEFAULT_BATCH_SIZES,
                   registry: ModelShapes | None = None) -> ProblemSet:
    """Every layer GEMM of ``model`` for each tensor-parallel size and batch (M = tokens), in that order."""
    registry = registry or ModelShapes.default()
    layers = registry.layers(model)
    tps, batches = _int_list("tp_sizes", tp_sizes), _int_list("batch_sizes", batch_sizes)
    for tp in tps:
        bad = [f"{layer.name} ({layer.tp_split.upper()}={layer.n if layer.tp_split == 'n' else layer.k})"
               for layer in layers if (layer.n if layer.tp_split == "n" else layer.k) % tp]
        if bad:
            raise ArgumentError(f"model {model}: tp={tp} does not divide {', '.join(bad)}")
    problems = [layer.gemm(m, tp) for tp in tps for layer in layers for m in batches]
    return ProblemSet(f"{model} tp={','.join(map(str, tps))}", problems)


# ---- ResNet-50 ----------------------------------------------------------------------------------------------------
# (blocks, bottleneck width, input size) per stage; v1.5 (torchvision, MLPerf): the stride is on the 3x3.
_RESNET50_STAGES = ((3, 64, 56), (4, 128, 56), (6, 256, 28), (3, 512, 14))


def resnet50_conv_problems(batch: int = 32) -> ProblemSet:
    """The distinct convolutions of ResNet-50 v1.5 on 224x224 images, NHWC, in network order.

    The 7x7 stem reads C=3 channels, which few kernels can load with vector accesses; it is kept (a real layer):
    a sweep skips it for the operations whose alignment cannot run it.
    """
    n = _positive_int("batch", batch)
    convs = [Conv2dProblem(n, 224, 224, 3, 64, 7, 7, pad=(3, 3), stride=(2, 2))]
    channels = 64  # after the stem's max pool: 56 x 56 x 64
    for stage, (blocks, width, size) in enumerate(_RESNET50_STAGES):
        out = 4 * width
        for block in range(blocks):
            stride = 2 if block == 0 and stage > 0 else 1
            out_size = size // stride
            convs.append(Conv2dProblem(n, size, size, channels, width, 1, 1))
            convs.append(Conv2dProblem(n, size, size, width, width, 3, 3, pad=(1, 1), stride=(stride, stride)))
            convs.append(Conv2dProblem(n, out_size, out_size, width, out, 1, 1))
            if block == 0:  # the projection shortcut
                convs.append(Conv2dProblem(n, size, size, channels, out, 1, 1, stride=(stride, stride)))
            channels, size = out, out_size
    return ProblemSet(f"resnet50 batch={n}", convs)


# ---- grouped GEMM -------------------------------------------------------------------------------------------------
def grouped_problems(count: int, m_range, n: int, k: int, seed: int = 0, sets: int = 1) -> ProblemSet:
    """``sets`` grouped GEMMs of ``count`` groups each, MoE style: every group (expert) gets a random M in
    ``m_range`` = (low, high) inclusive and the same n x k weights; the same seed gives the same shapes."""
    count, n, k, sets = (_positive_int(what, v) for what, v in
                         (("count", count), ("n", n), ("k", k), ("sets", sets)))
    if isinstance(m_range, (str, bytes)) or not isinstance(m_range, Sequence) or len(m_range) != 2:
        raise ArgumentError(f"m_range must be (low, high), got {m_range!r}")
    low, high = (_positive_int("m_range", v) for v in m_range)
    if high < low:
        raise ArgumentError(f"m_range: high ({high}) is below low ({low})")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise ArgumentError(f"seed must be an integer, got {seed!r}")
    rng = random.Random(int(seed))  # a private generator: global random state is left alone
    groups = [GroupedGemmProblem(tuple((rng.randint(low, high), n, k) for _ in range(count))) for _ in range(sets)]
    return ProblemSet(f"grouped {count}x m={low}..{high} n={n} k={k} seed={seed}", groups)


# ---- MoE expert GEMMs ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MoeModel:
    """A mixture-of-experts layer: routed ``experts`` (``top_k`` per token), each a gated MLP ``hidden`` ->
    ``intermediate`` -> ``hidden`` (shapes from the models' published configs)."""

    name: str
    experts: int
    top_k: int
    hidden: int
    intermediate: int
    expert_parallel: tuple[int, ...] = (1,)  # the GPU counts its experts are usually spread over


MOE_MODELS = MappingProxyType({m.name: m for m in (
    MoeModel("mixtral-8x7b", 8, 2, 4096, 14336),
    MoeModel("qwen3-30b-a3b", 128, 8, 2048, 768),
    MoeModel("deepseek-v3", 256, 8, 7168, 2048, expert_parallel=(8, 32)),
)})
MOE_TOKENS = (4096, 16384, 65536)
MOE_LAYOUTS = ("contiguous", "masked")
MOE_PASSES = ("forward", "wgrad")
ROUTING_SKEW = 0.5  # sigma of the log-normal popularity: the busiest expert gets 1.7x (8 experts) to 3x (128) the mean


def routed_counts(experts: int, tokens: int, seed: int = 0, skew: float = ROUTING_SKEW) -> tuple[int, ...]:
    """How many of ``tokens`` routed (token, expert) pairs each of ``experts`` receives: a seeded multinomial draw
    over log-normal expert popularities (``skew`` = sigma; 0 is uniform). The counts sum to ``tokens``."""
    import numpy as np

    experts, tokens = _positive_int("experts", experts), _positive_int("tokens", tokens)
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise ArgumentError(f"seed must be a non-negative integer, got {seed!r}")
    if not isinstance(skew, numbers.Real) or isinstance(skew, bool) or not 0 <= skew <= 3:
        raise ArgumentError(f"skew must be a number from 0 to 3 (sigma of the log-normal popularity), got {skew!r}")
    rng = np.random.default_rng(int(seed))
    popularity = np.exp(skew * rng.standard_normal(experts))
    return tuple(int(c) for c in rng.multinomial(tokens, popularity / popularity.sum()))


def _moe_model(name: str) -> MoeModel:
    if name not in MOE_MODELS:
        raise ArgumentError(f"unknown MoE model {name!r}; known: {sorted(MOE_MODELS)}")
    return MOE_MODELS[name]


def moe_problems(model: str, tokens=MOE_TOKENS, *, layout: str = "contiguous", pass_: str = "forward",
                 ep: int | None = None, seed: int = 0, skew: float = ROUTING_SKEW) -> ProblemSet:
    """The expert GEMMs one GPU runs for ``model``'s MoE layer, per routed-token count in ``tokens`` (the (token,
    expert) pairs landing on this GPU's experts, drawn with ``routed_counts``; the same seed gives the same sets).

    ``ep``: the GPUs the experts are spread over (this GPU holds experts / ep of them; default the model's first
    ``expert_parallel``). ``pass_="forward"``: the up (gate/up, N = intermediate, K = hidden) and down (N = hidden,
    K = intermediate) projections, each expert's M its token count; ``layout="contiguous"`` as one grouped GEMM of
    the experts that received tokens (one packed A, offsets, B per expert), ``"masked"`` as every local expert at a
    fixed capacity (the largest count rounded up to 128) with its count on the device. ``pass_="wgrad"``: the
    weight gradients as K-grouped GEMMs, expert e's dW = dY_e^T X_e (M, N the weight's shape, K its token count);
    experts without tokens have no group (their gradient is zero)."""
    spec = _moe_model(model)
    if layout not in MOE_LAYOUTS:
        raise ArgumentError(f"layout must be one of {list(MOE_LAYOUTS)}, got {layout!r}")
    if pass_ not in MOE_PASSES:
        raise ArgumentError(f"pass must be one of {list(MOE_PASSES)}, got {pass_!r}")
    if pass_ == "wgrad" and layout != "contiguous":
        raise ArgumentError("the weight-gradient sets are K-grouped GEMMs over each expert's own tokens: layout "
                            "'contiguous' only")
    ep = spec.expert_parallel[0] if ep is None else _positive_int("ep", ep)
    if spec.experts % ep:
        raise ArgumentError(f"{model}: {spec.experts} experts do not spread evenly over ep={ep} GPUs")
    local = spec.experts // ep
    tokens = _int_list("tokens", [tokens] if isinstance(tokens, numbers.Integral) else tokens)
    hidden, inter = spec.hidden, spec.intermediate
    found = []
    for count in tokens:
        counts = routed_counts(local, count, seed, skew)
        busy = [c for c in counts if c]
        if pass_ == "wgrad":
            found += [GroupedGemmProblem(tuple((inter, hidden, c) for c in busy)),   # up: dW is inter x hidden
                      GroupedGemmProblem(tuple((hidden, inter, c) for c in busy))]   # down: hidden x inter
        elif layout == "contiguous":
            found += [GroupedGemmProblem(tuple((c, inter, hidden) for c in busy)),
                      GroupedGemmProblem(tuple((c, hidden, inter) for c in busy))]
        else:
            capacity = -(-max(counts) // 128) * 128
            found += [MaskedGroupedProblem(local, capacity, inter, hidden, counts),
                      MaskedGroupedProblem(local, capacity, hidden, inter, counts)]
    where = f" ep={ep}" if ep != 1 else ""
    return ProblemSet(f"moe {model}{where} {pass_} {layout} tokens={','.join(map(str, tokens))} seed={seed}", found)


def moe_sets(seed: int = 0) -> dict[str, ProblemSet]:
    """Every standard MoE set: each model (DeepSeek-V3 at each of its expert-parallel sizes) x forward contiguous,
    forward masked and weight gradient, at ``MOE_TOKENS`` routed tokens."""
    sets = {}
    for model in MOE_MODELS.values():
        for ep in model.expert_parallel:
            for pass_, layout in (("forward", "contiguous"), ("forward", "masked"), ("wgrad", "contiguous")):
                found = moe_problems(model.name, layout=layout, pass_=pass_, ep=ep, seed=seed)
                sets[found.name] = found
    return sets


# ---- the command line's form --------------------------------------------------------------------------------------
SPEC_FORMS = (
    "square:START:END:STEP                        e.g. square:128:4096:128 (end included)",
    "gemm:MxNxK[xBATCH],...                       e.g. gemm:4096x4096x4096,1024x8192x4096",
    "range:m=V:n=V:k=V[:batch=V]                  V = 1,16,128 or START..END..STEP (end included)",
    "model:NAME[:tp=1,2][:batch=1,16,128]         e.g. model:llama-3-8b:tp=1,2:batch=1,16,128",
    "resnet50[:batch=32]",
    "grouped:count=C:m=LOW..HIGH:n=N:k=K[:seed=S][:sets=T]",
    "moe:MODEL[:tokens=4096,16384][:layout=contiguous|masked][:pass=forward|wgrad][:ep=E][:seed=S]",
    "file:PATH.json                               a ProblemSet.to_json file",
)


def _spec_error(spec: str, why: str) -> ArgumentError:
    return ArgumentError(f"cannot read problem spec {spec!r}: {why}. Accepted forms:\n  " + "\n  ".join(SPEC_FORMS))


def _spec_int(spec: str, text: str) -> int:
    try:
        return _positive_int("value", int(text))
    except (ValueError, ArgumentError):
        raise _spec_error(spec, f"{text!r} is not a positive integer") from None


def _spec_values(spec: str, text: str):
    """'1,16,128' -> [1, 16, 128]; '128..4096..128' -> (128, 4096, 128); '64..512' -> (64, 512)."""
    if ".." in text:
        return tuple(_spec_int(spec, part) for part in text.split(".."))
    return [_spec_int(spec, part) for part in text.split(",") if part.strip()]


def _spec_options(spec: str, parts: list[str], allowed: tuple[str, ...]) -> dict[str, str]:
    options = {}
    for part in parts:
        key, sep, value = part.partition("=")
        if not sep or key not in allowed or not value:
            raise _spec_error(spec, f"{part!r} is not one of {[a + '=...' for a in allowed]}")
        options[key] = value
    return options


def parse_problems(spec: str) -> ProblemSet:
    """A ProblemSet from the command line's one-string form (``SPEC_FORMS`` lists them)."""
    if not isinstance(spec, str) or not spec.strip():
        raise _spec_error(str(spec), "empty")
    spec = spec.strip()
    form, _, rest = spec.partition(":")
    parts = rest.split(":") if rest else []
    if form == "file":
        if not rest:
            raise _spec_error(spec, "no path after file:")
        return ProblemSet.from_json(rest)  # the path may hold colons: take all of it
    if form == "square":
        if len(parts) != 3:
            raise _spec_error(spec, "square takes START:END:STEP")
        start, end, step = (_spec_int(spec, p) for p in parts)
        return square_problems(start, end, step)
    if form == "gemm":
        shapes = []
        for text in rest.split(","):
            dims = text.strip().lower().split("x")
            if len(dims) not in (3, 4):
                raise _spec_error(spec, f"{text!r} is not MxNxK or MxNxKxBATCH")
            shapes.append(tuple(_spec_int(spec, d) for d in dims))
        return explicit_problems(shapes, name=f"gemm {rest}")
    if form == "range":
        options = _spec_options(spec, parts, ("m", "n", "k", "batch"))
        missing = [axis for axis in "mnk" if axis not in options]
        if missing:
            raise _spec_error(spec, f"range needs m=, n= and k= (missing {missing})")
        axes = {axis: _spec_values(spec, value) for axis, value in options.items()}
        for axis, value in axes.items():
            if isinstance(value, tuple) and len(value) != 3:
                raise _spec_error(spec, f"{axis}: a range is START..END..STEP")
        return gemm_range(axes["m"], axes["n"], axes["k"], axes.get("batch", 1), name=f"range {rest}")
    if form == "model":
        if not parts or not parts[0]:
            raise _spec_error(spec, "model needs a name, e.g. model:llama-3-8b")
        options = _spec_options(spec, parts[1:], ("tp", "batch"))
        tps = _spec_values(spec, options.get("tp", "1"))
        batches = _spec_values(spec, options.get("batch", ",".join(map(str, DEFAULT_BATCH_SIZES))))
        if isinstance(tps, tuple) or isinstance(batches, tuple) and len(batches) != 3:
            raise _spec_error(spec, "tp takes a list (tp=1,2,4); batch a list or START..END..STEP")
        if isinstance(batches, tuple):
            batches = list(_inclusive("batch", *batches))
        return model_problems(parts[0], tps, batches)
    if form == "resnet50":
        options = _spec_options(spec, parts, ("batch",))
        return resnet50_conv_problems(_spec_int(spec, options.get("batch", "32")))
    if form == "grouped":
        options = _spec_options(spec, parts, ("count", "m", "n", "k", "seed", "sets"))
        missing = [key for key in ("count", "m", "n", "k") if key not in options]
        if missing:
            raise _spec_error(spec, f"grouped needs count=, m=LOW..HIGH, n= and k= (missing {missing})")
        m_range = _spec_values(spec, options["m"])
        if not isinstance(m_range, tuple) or len(m_range) != 2:
            raise _spec_error(spec, "grouped m= is LOW..HIGH")
        seed = options.get("seed", "0")
        if not seed.isdigit():
            raise _spec_error(spec, f"seed {seed!r} is not a non-negative integer")
        return grouped_problems(_spec_int(spec, options["count"]), m_range, _spec_int(spec, options["n"]),
                                _spec_int(spec, options["k"]), int(seed), _spec_int(spec, options.get("sets", "1")))
    if form == "moe":
        if not parts or not parts[0]:
            raise _spec_error(spec, f"moe needs a model, one of {sorted(MOE_MODELS)}")
        options = _spec_options(spec, parts[1:], ("tokens", "layout", "pass", "ep", "seed"))
        tokens = _spec_values(spec, options.get("tokens", ",".join(map(str, MOE_TOKENS))))
        if isinstance(tokens, tuple):
            raise _spec_error(spec, "tokens takes a list, e.g. tokens=4096,16384")
        seed = options.get("seed", "0")
        if not seed.isdigit():
            raise _spec_error(spec, f"seed {seed!r} is not a non-negative integer")
        return moe_problems(parts[0], tokens, layout=options.get("layout", "contiguous"),
                            pass_=options.get("pass", "forward"),
                            ep=_spec_int(spec, options["ep"]) if "ep" in options else None, seed=int(seed))
    raise _spec_error(spec, f"unknown form {form!r}")
