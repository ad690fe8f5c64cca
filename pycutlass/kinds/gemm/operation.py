"""GemmOperationUniversal: a CUTLASS 2.x (Sm80-family) GEMM, runnable in Gemm, split-K, batched and array modes."""
from __future__ import annotations

from ...description.tensor_description import TensorDescription
from ...description.tile_description import TileDescription
from ...description.types import (GEMM_SWIZZLES, IdentitySwizzle1, LayoutType, OpClass,
                                 SwizzlingFunctor)
from ...emit import names
from ...epilogue.functors import EpilogueFunctor
from ...errors import DescriptionError
from .abi import GemmUniversalArgs
from .. import registry
from ..base import TiledOperation, check_compute_capability, check_description_types  # noqa: F401
# The Sm80 family's rules, under the names this module had (kinds/families/sm80.py holds them).
from ..families.sm80 import (  # noqa: F401
    check_congruous_tile, check_crosswise_tile_k, check_f64_tensor_op_stages, check_gemm_layouts,
    check_interleaved_thread_maps, check_mixed_epilogue_warp_tile, check_narrow_warp_tiles, check_operand_types,
    check_simt_epilogue_width, check_simt_warp_tile, check_wide_warp_tile, epilogue_thread_map_problem,
    gemm_fast_f16_core, kernel_operands, mainloop_thread_map_problem, operand_thread_map, thread_map_problem)


class GemmOperationUniversal(TiledOperation):
    kind = "gemm"
    abi_struct_type = GemmUniversalArgs
    direct_store = False  # PyCUTLASS 2.11's register-to-global epilogue (Sm80 family, see _check_direct_store)

    def __new__(cls, *args, **kwargs):
        if cls is not GemmOperationUniversal:
            return super().__new__(cls)
        # The registry picks the kind: visitor=True the epilogue visitor tree, compute capability 90 with an SM90
        # tile the CUTLASS 3.x family (array=True its pointer-array kernel), anything else this class.
        visitor = kwargs.get("visitor", args[7] if len(args) > 7 else False)
        built = registry.operation_class("GemmOperationUniversal", kwargs.get("arch", args[0] if args else None),
                                         kwargs.get("tile_description", args[1] if len(args) > 1 else None),
                                         visitor=visitor, array=kwargs.get("array", args[9] if len(args) > 9 else False))
        if built is cls:
            return super().__new__(cls)
        if not issubclass(built, cls):  # (the visitor kind, whose signature has no array=): built whole here
            kwargs = {key: value for key, value in kwargs.items() if key != "array"}
            return built(*args, **kwargs)
        return object.__new__(built)  # Python then runs its class's __init__

    def __init__(self, arch: int, tile_description: TileDescription, A: TensorDescription, B: TensorDescription,
                 C: TensorDescription, epilogue_functor: EpilogueFunctor,
                 swizzling_functor: SwizzlingFunctor = IdentitySwizzle1, visitor: bool = False, *,
                 array: bool = False, direct_store: bool = False, bias=None, scales=None):
        self.compute_capability = check_compute_capability(arch)
        if scales is not None:
            raise DescriptionError(f"scales={scales!r}: block-wise scales are built for the SM90 family (compute "
                                   f"capability 90 with an SM90 tile) only", rule="scales.unsupported")
        if bias is not None:  # the SM90 family's epilogue bias; a CUTLASS 2.x kernel adds a bias as a broadcast C
            raise DescriptionError(f"bias={bias!r}: the Sm80 family builds no bias epilogue; allowed here: bias=None "
                                   f"(add a bias vector as a broadcast C: the arguments' bias=True). bias='row' or "
                                   f"'column' builds an SM90 operation (compute capability 90 with an SM90 tile)",
                                   rule="bias.unsupported")
        if not isinstance(direct_store, bool):
            raise DescriptionError(f"direct_store must be True or False, got {direct_store!r}",
                                   rule="description.field_type")
        self.direct_store = direct_store
        if not isinstance(array, bool):
            raise DescriptionError(f"array must be True or False, got {array!r}", rule="description.field_type")
        # array=True builds the SM90 pointer-array kernel; a CUTLASS 2.x kernel runs every mode (Array included) as
        # it is, so here it changes nothing (the same code and name).
        if visitor:
            raise DescriptionError("the epilogue visitor tree is not supported; use LinearCombinationGeneric for "
                                   "activations and a broadcast C for bias", rule="evt.unsupported")
        check_operand_types(tile_description, A, B, C, epilogue_functor, "GemmOperationUniversal", wide_c=True)
        if swizzling_functor not in GEMM_SWIZZLES:
            raise DescriptionError(f"GemmOperationUniversal: swizzling_functor must be one of "
                                   f"{[s.name for s in GEMM_SWIZZLES]}, got {swizzling_functor!r}",
                                   rule="swizzle.unsupported")
        self._describe(arch, tile_description, A, B, C, epilogue_functor, swizzling_functor)
        self._check_layouts()
        if direct_store:
            self._check_direct_store()
        tile_description.check_shared_memory(arch)

    def _check_direct_store(self) -> None:
        """PyCUTLASS 2.11's ``direct_store=True``: CUTLASS's EpilogueDirectStore writes each thread's accumulators
        straight from registers, two adjacent columns per store (epilogue_direct_store.h). It assumes the tensor-op
        accumulator layout (rows lane / 4 + 8 i, columns 2 (lane % 4) + 8 j of 16x8 / 8x8 MMAs), one warp along K
        (as every pycutlass tile), a row-major output (a ColumnMajor C is computed transposed here) and an output
        operator of at least two elements; it guards the first column of each pair only, which the arguments' C
        alignment (>= 2) keeps in bounds."""
        what = "GemmOperationUniversal(direct_store=True)"
        math = self.tile_description.math_instruction
        if math.opcode_class is not OpClass.TensorOp:
            raise DescriptionError(f"{what}: the direct-store epilogue assumes the tensor-op accumulator layout; got a "
                                   f"{math.opcode_class.name} math instruction", rule="direct_store.unsupported")
        if self.C.layout.is_interleaved:
            raise DescriptionError(f"{what}: the direct-store epilogue writes a row- or column-major C, got "
                                   f"{self.C.layout.value}", rule="direct_store.unsupported")
        if self.C.alignment < 2:
            raise DescriptionError(f"{what}: the direct-store epilogue stores two adjacent outputs at a time; C "
                                   f"alignment must be at least 2, got {self.C.alignment}",
                                   rule="direct_store.unsupported")

    def _check_layouts(self) -> None:
        check_gemm_layouts(self)

    # --- identity -------------------------------------------------------------------------------------------
    def _signature(self) -> tuple:
        signature = ("gemm_universal", self.compute_capability, self.tile_description, self.A, self.B, self.C,
                     self.epilogue_functor, self.swizzling_functor)
        return signature + ("direct_store",) if self.direct_store else signature

    def _readable_name(self) -> str:
        layouts = "".join(names.LAYOUT_SHORT[d.layout] for d in (self.A, self.B, self.C))
        return f"gemm_{self._types_and_tile_name(layouts)}{'_ds' if self.direct_store else ''}"

    @property
    def transposed(self) -> bool:
        """Column-major outputs are computed as (B^T A^T)^T with a row-major output."""
        return self.C.layout is LayoutType.ColumnMajor

    # --- emission -------------------------------------------------------------------------------------------
    def headers(self) -> list[str]:
        # (direct_store's header is included by the template, after these: it uses MatrixShape and TensorRef
        # without including them, and a unit's headers are not included in this order.)
        return ["cutlass/gemm/kernel/default_gemm_universal.h", "cutlass/gemm/threadblock/threadblock_swizzle.h",
                *names.epilogue_headers(self.epilogue_functor)]

    def emit_body(self) -> str:
        tile = self.tile_description
        math = tile.math_instruction
        A, B, C = self.A, self.B, self.C
        layout_a, layout_b, layout_c = A.layout, B.layout, C.layout
        if self.transposed:
            # D^T = B^T A^T: swap the operands and transpose each layout.
            A, B = B, A
            layout_a, layout_b = names.TRANSPOSED[A.layout], names.TRANSPOSED[B.layout]
            layout_c = LayoutType.RowMajor
        activation = self.epilogue_functor.activation
        return self.render(
            "gemm_universal.cu.j2", name=self.name, summary=self.describe(),
            epilogue=names.epilogue_functor(self.epilogue_functor),
            element_a=self._operand_element(A), layout_a=names.LAYOUT[layout_a], alignment_a=A.alignment,
            element_b=self._operand_element(B), layout_b=names.LAYOUT[layout_b], alignment_b=B.alignment,
            element_c=names.ELEMENT[C.element], layout_c=names.LAYOUT[layout_c],
            element_accumulator=names.ELEMENT[math.element_accumulator],
            opclass=names.OPCLASS[math.opcode_class], arch_tag=names.arch_tag(self.family),
            threadblock_shape=tile.threadblock_shape, warp_shape=tile.warp_shape,
            instruction_shape=math.instruction_shape, swizzle=names.gemm_swizzle(self.swizzling_functor),
            stages=tile.stages, math_operation=names.MATH_OPERATION[math.cutlass_math_operation],
            transposed=self.transposed, activation_args=activation.argument_names if activation else (),
            direct_store=self.direct_store)

    def describe(self) -> str:
        math = self.tile_description.math_instruction
        return (f"GEMM sm{self.compute_capability} {math.opcode_class.name} {math.math_operation.name} "
                f"A={self.A.element.label}/{self.A.layout.value}/{self.A.alignment} "
                f"B={self.B.element.label}/{self.B.layout.value}/{self.B.alignment} "
                f"C={self.C.element.label}/{self.C.layout.value}/{self.C.alignment} "
                f"acc={math.element_accumulator.label} tile={self.tile_description.procedural_name()} "
                f"epilogue={self.epilogue_functor.describe()} swizzle={self.swizzling_functor.name}")
