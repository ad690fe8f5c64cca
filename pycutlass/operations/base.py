"""What every operation description shares: a unique name, its emitted code, and its compiled artifact."""
from __future__ import annotations

import hashlib

from ..description.types import MAX_SHARED_MEMORY_BYTES
from ..errors import DescriptionError

SUPPORTED_COMPUTE_CAPABILITIES = (80, 86, 89, 90)


def check_compute_capability(arch) -> int:
    if arch not in SUPPORTED_COMPUTE_CAPABILITIES:
        raise DescriptionError(f"compute capability {arch!r} is not supported for CUTLASS 2.x (Sm80-family) "
                               f"operations; choose one of {list(SUPPORTED_COMPUTE_CAPABILITIES)} "
                               f"(Hopper runs the Sm80 family: use 80 or 90)")
    assert arch in MAX_SHARED_MEMORY_BYTES
    return arch


class Operation:
    """Base of GEMM, grouped GEMM, conv and reduction operations.

    Subclasses set ``self.compute_capability`` and implement ``_signature()`` (every field that changes the
    emitted code), ``_readable_name()``, ``emit_body()``, ``headers()`` and ``arguments_struct``.
    """

    kind = "operation"

    def _signature(self) -> tuple:
        raise NotImplementedError

    def _readable_name(self) -> str:
        raise NotImplementedError

    def emit_body(self) -> str:
        raise NotImplementedError

    def headers(self) -> list[str]:
        raise NotImplementedError

    @property
    def name(self) -> str:
        """Unique C identifier: a readable prefix plus a hash of everything that shapes the code."""
        cached = self.__dict__.get("_name")
        if cached is None:
            digest = hashlib.sha256(repr(self._signature()).encode()).hexdigest()[:10]
            cached = f"pycutlass_{self._readable_name()}_{digest}"
            self.__dict__["_name"] = cached
        return cached

    procedural_name = name

    @property
    def kernel_symbol(self) -> str:
        return self.name

    @property
    def builder_symbol(self) -> str:
        return self.name + "_build"

    def emit(self) -> str:
        """The complete translation unit for this operation alone, as the compiler sees it."""
        source = self.__dict__.get("_source")
        if source is None:  # descriptions are immutable, so the source is rendered once
            from ..emit.emitter import translation_unit

            source = self.__dict__["_source"] = translation_unit([self])
        return source

    def __eq__(self, other) -> bool:
        return type(other) is type(self) and other._signature() == self._signature()

    def __hash__(self) -> int:
        return hash(self._signature())

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"

    def epilogue_type(self, alpha=1.0, beta=0.0, *activation_args):
        """Runtime values of the epilogue (``output_op``): alpha, beta, then the activation's arguments."""
        return self.epilogue_functor.make_arguments(alpha, beta, *activation_args)

    def run(self, arguments) -> None:
        """Launch on ``arguments``' stream. Compiles (or loads from the cache) on first use."""
        from ..runtime.launch import launch_operation

        launch_operation(self, arguments)


class TiledOperation(Operation):
    """An operation with a tile description and A, B, C operands (GEMM, grouped GEMM, conv)."""

    @property
    def element_accumulator(self):
        return self.tile_description.math_instruction.element_accumulator

    def _types_and_tile_name(self, layouts: str) -> str:
        """The shared part of readable names: arch, op class, types, layouts, tile and alignments."""
        from ..emit import names

        math = self.tile_description.math_instruction
        s = names.SHORT
        return (f"sm{self.compute_capability}_{math.opcode_class.name.lower()}_"
                f"{s[self.A.element]}{s[self.C.element]}{s[math.element_accumulator]}_{layouts}_"
                f"{self.tile_description.procedural_name()}_a{self.A.alignment}{self.B.alignment}{self.C.alignment}")
