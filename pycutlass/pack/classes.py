"""What a pack's kernels accept and what a call needs: matching a call to an operation class, then its shape to an
entry of the class's table."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

_NK_WEIGHT = 4.0  # a different layer (N, K) is further than a different batch size (M)
TORCH = "torch"  # an entry's kernel when tuning found torch's own implementation faster (packs from models)


@dataclass(frozen=True)
class CallClass:
    """What a GEMM call needs from a kernel: element types, layouts ("row"/"col"), epilogue, bias mode, family.
    ``alignment`` (elements of A, B, C) is what the kernel needs; a call qualifies with any multiple of it."""

    a: str
    b: str
    c: str
    d: str
    a_layout: str
    b_layout: str
    c_layout: str
    alignment: tuple
    epilogue: str
    bias: str | None
    family: str

    @classmethod
    def of(cls, operation, params: dict) -> "CallClass":
        math_inst = operation.tile_description.math_instruction
        epilogue = operation.epilogue_functor
        layout = {"RowMajor": "row", "ColumnMajor": "col"}
        return cls(a=math_inst.element_a.label, b=math_inst.element_b.label, c=operation.C.element.label,
                   d=getattr(epilogue, "element_output", operation.C.element).label,
                   a_layout=layout.get(operation.A.layout.value, operation.A.layout.value),
                   b_layout=layout.get(operation.B.layout.value, operation.B.layout.value),
                   c_layout=layout.get(operation.C.layout.value, operation.C.layout.value),
                   alignment=(operation.A.alignment, operation.B.alignment, operation.C.alignment),
                   epilogue=params.get("epilogue", "linear_combination"), bias=operation.bias,
                   family=operation.family)

    def to_dict(self) -> dict:
        return {name: (list(value) if isinstance(value, tuple) else value) for name, value in self.__dict__.items()}

    @classmethod
    def from_dict(cls, data: dict) -> "CallClass":
        return cls(**{**data, "alignment": tuple(data["alignment"])})


@dataclass(frozen=True)
class CallQuery:
    """A call as the pack sees it: its types, layouts, the widest alignment each operand allows, epilogue, bias."""

    a: str
    b: str
    d: str
    a_layout: str
    b_layout: str
    alignment: tuple  # widest alignment (elements) A, B and C/D allow
    epilogue: str
    bias: str | None  # "column" (N values), "row" (M values), None
    c: bool  # C read (beta != 0)

    def accepts(self, call: CallClass) -> bool:
        if (call.a, call.b, call.d, call.a_layout, call.b_layout, call.epilogue) != \
                (self.a, self.b, self.d, self.a_layout, self.b_layout, self.epilogue) or call.c_layout != "row":
            return False
        if any(allowed % needed for allowed, needed in zip(self.alignment, call.alignment)):
            return False
        if self.bias is None:
            return call.bias is None
        # a kernel built with the bias, or a Sm80-family kernel taking it as a broadcast C (then C itself is not read)
        return call.bias == self.bias or (call.bias is None and call.family == "sm80" and self.bias == "column"
                                          and not self.c)


@dataclass
class Entry:
    """One dispatch entry: a problem, the kernel and launch knobs that serve it, and what was measured."""

    problem: tuple  # (m, n, k, batch)
    kernel: str
    knobs: dict
    measured: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        m, n, k, batch = self.problem
        return {"m": m, "n": n, "k": k, "batch": batch, "kernel": self.kernel, "knobs": self.knobs,
                **self.measured}

    @classmethod
    def from_dict(cls, data: dict) -> "Entry":
        measured = {key: value for key, value in data.items() if key not in ("m", "n", "k", "batch", "kernel",
                                                                            "knobs")}
        return cls((data["m"], data["n"], data["k"], data.get("batch", 1)), data["kernel"], dict(data["knobs"]),
                   measured)


@dataclass
class PackClass:
    name: str  # the operation class (pycutlass.tune.db.operation_class)
    call: CallClass
    entries: dict  # (m, n, k, batch) -> Entry
    summary: dict

    def lookup(self, problem: tuple, policy: str, kernels_only: bool = False) -> tuple[Entry | None, str]:
        """The entry for ``problem`` and how it was found ("exact", "nearest", "uncovered"). ``kernels_only`` skips
        entries whose choice is torch (callers that cannot run torch take the nearest kernel instead)."""
        entries = self.entries
        if kernels_only:
            entries = {p: e for p, e in entries.items() if e.kernel != TORCH}
        found = entries.get(problem)
        if found is not None:
            return found, "exact"
        if policy == "exact" or not entries:
            return None, "uncovered"
        wanted = [math.log2(max(v, 1)) for v in problem]

        def distance(known: tuple) -> tuple:
            d = [abs(math.log2(max(v, 1)) - w) for v, w in zip(known, wanted)]
            return (d[0] + _NK_WEIGHT * (d[1] + d[2]) + d[3], known)

        return entries[min(entries, key=distance)], "nearest"
