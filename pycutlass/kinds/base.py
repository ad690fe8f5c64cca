"""What every operation description shares: a unique name, its emitted code, and how it is run.

An operation is a pure, immutable description. It knows its kernel kind's template (in its own folder), the ABI
structs its code uses, and its template family; it never imports the runtime: ``op.run(arguments)`` hands itself to
the arguments, which belong to the runtime layer.
"""
from __future__ import annotations

import hashlib
import inspect
from pathlib import Path

from ..description.target import OPERATION_COMPUTE_CAPABILITIES, family_of
from ..description.tensor_description import TensorDescription
from ..description.tile_description import TileDescription
from ..description.types import DataType
from ..emit.abi import LaunchInfo
from ..emit import names
from ..emit.emitter import render, translation_unit
from ..epilogue.functors import EpilogueFunctor
from ..errors import ArgumentError, DescriptionError


def check_compute_capability(arch) -> int:
    """An operation's compute capability: it selects the template family (Hopper runs the Sm80 family too)."""
    if isinstance(arch, bool) or not isinstance(arch, int):
        raise DescriptionError(f"compute capability {arch!r} is not supported for operations; choose one of "
                               f"{list(OPERATION_COMPUTE_CAPABILITIES)} (an integer)", rule="target.compute_capability")
    family_of(arch)
    return arch


def check_description_types(tile, A, B, C, epilogue, what: str) -> None:
    """Every tiled GEMM-like kind takes these description types (named in the error when one is not)."""
    for label, desc in (("A", A), ("B", B), ("C", C)):
        if not isinstance(desc, TensorDescription):
            raise DescriptionError(f"{what}: {label} must be a TensorDescription, got {desc!r}",
                                   rule="description.field_type")
    if not isinstance(tile, TileDescription):
        raise DescriptionError(f"{what}: tile_description must be a TileDescription, got {tile!r}",
                               rule="description.field_type")
    if not isinstance(epilogue, EpilogueFunctor):
        raise DescriptionError(f"{what}: epilogue_functor must be an epilogue functor such as LinearCombination, "
                               f"got {epilogue!r}", rule="description.field_type")


class Operation:
    """Base of GEMM, grouped GEMM, conv and reduction operations.

    Subclasses set ``self.compute_capability`` and implement ``_signature()`` (every field that changes the
    emitted code), ``_readable_name()``, ``emit_body()``, ``headers()``, and set ``abi_struct_type``.
    """

    kind = "operation"
    abi_struct_type = None  # the kind's argument struct (kinds/<kind>/abi.py)

    # Traits the compiler, emitter, runtime, tune and torch read; a kind overrides what differs for it.
    required_backend: str | None = None
    """The compiler backend this kind's code needs ("nvrtc"), or None for the session's own."""
    unit_macros: tuple[str, ...] = ()
    """Macros the operation's whole translation unit must define (the compiler never mixes different sets)."""
    pdl_refusal: str | None = ("this kind's kernel does not wait on the previous grid (griddepcontrol.wait); SM90 "
                               "GEMMs and reductions built with arch=90 do")
    """Why arguments may not launch this kernel with programmatic dependent launch (None: they may)."""
    bias = None
    scales = None  # row-wise scale mode (SM90 grouped operations)
    """The fused bias vector the kernel adds (SM90 kinds: "row"/"column" for GEMM, True for conv); None: none."""
    conv_kind = None
    """A convolution's operator (fprop, dgrad, wgrad); None for the other kinds."""
    epilogue_functor = None
    """The epilogue functor (``output_op``'s type), set by every kind's constructor."""

    def preamble(self) -> str | list[str]:
        """Code before any include of the translation unit (one string, or several deduplicated one by one)."""
        return ""

    def shared_code(self) -> str:
        """Code every operation of this kind in a unit shares (identical text is emitted once)."""
        return ""

    @property
    def family(self) -> str:
        """The CUTLASS template family this operation is written in (e.g. "sm80")."""
        return family_of(self.compute_capability)

    def abi_structs(self) -> tuple:
        """The ABI structs this operation's code uses; the translation unit defines each once."""
        return (LaunchInfo, self.abi_struct_type)

    def render(self, template: str, **context) -> str:
        """Render a template that lives beside the kind's module."""
        folder = Path(inspect.getfile(type(self))).parent
        return render(folder / template, **context)

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
            source = self.__dict__["_source"] = translation_unit([self])
        return source

    @property
    def rt_module(self) -> "RuntimeModule":
        """PyCUTLASS's per-operation runtime module, kept for ``operation.rt_module.emit()`` (the examples'
        ``--print_cuda``): its ``emit()`` returns this operation's CUDA C++ (``operation.emit()``)."""
        return RuntimeModule(self)

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
        """Launch on ``arguments``' stream and device (Params were built when the arguments were made)."""
        try:
            launch_for = arguments.launch_for
        except AttributeError:
            raise ArgumentError(f"{self.name}.run() takes the arguments built for it (e.g. GemmArguments), got "
                                f"{type(arguments).__name__}") from None
        launch_for(self)


class RuntimeModule:
    """What remains of PyCUTLASS's ``rt_module``: the operation's source. Params are built on the device, so there
    is no host-side ``plan()`` / ``get_args()``; run operations with ``operation.run(arguments)``."""

    __slots__ = ("operation",)

    def __init__(self, operation: Operation):
        self.operation = operation

    def emit(self) -> str:
        """The operation's complete translation unit, as ``operation.emit()`` returns it."""
        return self.operation.emit()

    def __repr__(self) -> str:
        return f"<RuntimeModule of {self.operation.name}>"


class TiledOperation(Operation):
    """An operation with a tile description and A, B, C operands (GEMM, grouped GEMM, conv)."""

    fast_clamp_max_k: int | None = 256
    """The largest K FastLinearCombinationClamp is exact for (CUTLASS 2.x's fast converters); None: every K."""
    serial_split_k_through_output = True
    """Whether serial split-K passes each K slice's partial result through D (CUTLASS 2.x's semaphore reduction)."""

    def _describe(self, arch: int, tile_description, A, B, C, epilogue_functor, swizzling_functor) -> None:
        """Record the fields every tiled kind has (after its own argument checks)."""
        if self.family == "sm80" and hasattr(tile_description, "check_sm80"):
            tile_description.check_sm80(type(self).__name__)
        self.tile_description = tile_description
        self.A, self.B, self.C = A, B, C
        self.epilogue_functor = epilogue_functor
        self.swizzling_functor = swizzling_functor
        self.arch = arch

    def _operand_element(self, desc) -> str:
        """The C++ element type of operand ``desc``: tf32 instructions read float32 memory as tf32."""
        if self.tile_description.math_instruction.element_a is DataType.tfloat32:
            return names.ELEMENT[DataType.tfloat32]
        return names.ELEMENT[desc.element]

    @property
    def element_accumulator(self):
        return self.tile_description.math_instruction.element_accumulator

    def _types_and_tile_name(self, layouts: str) -> str:
        """The shared part of readable names: arch, op class, types, layouts, tile and alignments."""
        math = self.tile_description.math_instruction
        s = names.SHORT
        return (f"sm{self.compute_capability}_{math.opcode_class.name.lower()}_"
                f"{s[self.A.element]}{s[self.C.element]}{s[math.element_accumulator]}_{layouts}_"
                f"{self.tile_description.procedural_name()}_a{self.A.alignment}{self.B.alignment}{self.C.alignment}")
