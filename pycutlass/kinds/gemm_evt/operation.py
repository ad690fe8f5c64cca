"""GemmOperationEvt: a CUTLASS 2.x (Sm80-family) GEMM whose epilogue is an epilogue visitor tree.

``GemmOperationUniversal(..., epilogue_functor=<EpilogueVisitTree>, visitor=True)`` builds one (PyCUTLASS 2.11's
spelling). The kernel is CUTLASS 4.2's ``GemmWithEpilogueVisitor`` (``DefaultGemmWithVisitor``) and the tree is
emitted as CUTLASS's own Sm80 EVT types (``Sm80EVT``, ``VisitorAccFetch``, ``VisitorAuxLoad``, ...): see
``emit_tree``. The builder fills the tree's ``Params`` (for the Sm80 visitors, equal to their ``Arguments``) by
nested aggregate initialization from the ABI struct's tensor slots and scalars.
"""
from __future__ import annotations

from ...description.tensor_description import TensorDescription
from ...description.tile_description import TileDescription
from ...description.types import GEMM_SWIZZLES, DataType, IdentitySwizzle1, LayoutType, OpClass, SwizzlingFunctor
from ...emit import names
from ...epilogue.visitor import BINARY_OPS, UNARY_OPS, EpilogueVisitTree, EvtDescription, EvtOutputOp, Node
from ...errors import ArgumentError, DescriptionError
from ..base import TiledOperation, check_compute_capability
from ..families.sm80 import (check_congruous_tile, check_crosswise_tile_k, check_f64_tensor_op_stages,
                               check_mixed_epilogue_warp_tile, check_narrow_warp_tiles, check_wide_warp_tile,
                               epilogue_thread_map_problem, gemm_fast_f16_core, mainloop_thread_map_problem)
from .abi import GemmEvtArgs

_ROUND = "cutlass::FloatRoundStyle::round_to_nearest"


class TreeEmitter:
    """Turns an EvtDescription into C++ ``using`` declarations and the matching nested Params initializer.

    A node returned as an M x N output is wrapped in a ``VisitorAuxStore`` the first time it is emitted (a shared
    node reached again is recomputed, as in PyCUTLASS 2.11); a reduction output wraps its operand in CUTLASS's
    reduction visitor. Independent outputs are joined under a compute node that forwards its first operand.
    """

    def __init__(self, description: EvtDescription, element_output: str, element_compute: str):
        self.description = description
        self.out = element_output
        self.compute = element_compute
        self.lines: list[str] = []
        self.functors: list[str] = []
        self.count = 0
        self.stores = {node: name for name, node in description.outputs if node.op != "reduction"}
        self.stored: set = set()

    def _new(self, definition: str) -> str:
        name = f"N{self.count}"
        self.count += 1
        self.lines.append(f"using {name} = {definition};")
        return name

    def _slot(self, name: str) -> int:
        return self.description.tensors.index(name)

    def _compute(self, functor: str) -> str:
        return f"VisitorCompute<{functor}, {self.compute}, {self.compute}, {_ROUND}>"

    def node(self, node: Node) -> tuple[str, str]:
        """(C++ type, Params initializer) of ``node``, storing it if it is an output not yet stored."""
        if node in self.stores and node not in self.stored:
            self.stored.add(node)
            inner_type, inner_args = self._plain(node)
            i = self._slot(self.stores[node])
            store = (f"VisitorAuxStore<ThreadMap, {self.out}, {_ROUND}, cute::Stride<int64_t, cute::_1, int64_t>>")
            args = (f"{{reinterpret_cast<{self.out} *>(a.ptr_{i}), {{a.ld_{i}, cute::_1{{}}, a.batch_stride_{i}}}}}")
            return self._new(f"Sm80EVT<{store}, {inner_type}>"), f"{{{inner_args}, {args}}}"
        return self._plain(node)

    def _plain(self, node: Node) -> tuple[str, str]:
        op = node.op
        if op == "acc":
            return "VisitorAccFetch", "{}"
        if op in ("scalar", "const"):
            value = f"a.scalar_{self.description.scalars.index(node.name)}" if op == "scalar" else repr(node.value[0])
            return (self._new(f"VisitorScalarBroadcast<{self.compute}>"),
                    f"{{{{{self.compute}({value})}}, {{}}, {{}}}}")
        if op in ("tensor", "row", "column"):
            i = self._slot(node.name)
            stride = {"tensor": "int64_t, cute::_1, int64_t", "row": "cute::_0, cute::_1, int64_t",
                      "column": "cute::_1, cute::_0, int64_t"}[op]
            value = {"tensor": f"a.ld_{i}, cute::_1{{}}", "row": "cute::_0{}, cute::_1{}",
                     "column": "cute::_1{}, cute::_0{}"}[op]
            visitor = {"tensor": "VisitorAuxLoad", "row": "VisitorRowBroadcast", "column": "VisitorColBroadcast"}[op]
            return (self._new(f"{visitor}<ThreadMap, {self.out}, cute::Stride<{stride}>>"),
                    f"{{reinterpret_cast<{self.out} *>(a.ptr_{i}), {self.out}(0), {{{value}, a.batch_stride_{i}}}}}")
        if op in BINARY_OPS:
            (ta, aa), (tb, ab) = self.node(node.inputs[0]), self.node(node.inputs[1])
            return self._new(f"Sm80EVT<{self._compute(BINARY_OPS[op])}, {ta}, {tb}>"), f"{{{aa}, {ab}, {{}}}}"
        if op in UNARY_OPS:
            functor = UNARY_OPS[op]
            if functor is None:  # leaky_relu with a constant slope
                functor = f"LeakyRelu{len(self.functors)}"
                self.functors.append(
                    f"template <class T> struct {functor} {{\n"
                    f"  CUTLASS_HOST_DEVICE T operator()(T const &x) const {{\n"
                    f"    cutlass::epilogue::thread::LeakyReLU<T> op;\n"
                    f"    return op(x, typename T::Element({node.value[0]!r}));\n  }}\n}};")
            ta, aa = self.node(node.inputs[0])
            return self._new(f"Sm80EVT<{self._compute(functor)}, {ta}>"), f"{{{aa}, {{}}}}"
        raise DescriptionError(f"EpilogueVisitTree: node {node.label()} cannot be emitted",
                               rule="evt.operation")  # pragma: no cover

    def reduction(self, name: str, node: Node) -> tuple[str, str]:
        """pycutlass's own row / column sum node (evt_reductions.cu.j2): complete sums or PyCUTLASS 2.11's per-tile
        partial sums, as the arguments' ``reduction_mode`` says."""
        ta, aa = self.node(node.inputs[0])
        i = self._slot(name)
        visitor = "RowSums" if node.value[0] == "row" else "ColumnSums"
        args = f"{{reinterpret_cast<void *>(a.ptr_{i}), a.batch_stride_{i}, a.ld_{i}, a.reduction_mode[{i}]}}"
        return (self._new(f"Sm80EVT<pycutlass_evt::{visitor}<ThreadMap, {self.compute}, {self.out}>, {ta}>"),
                f"{{{aa}, {args}}}")

    def emit(self) -> tuple[str, str]:
        """(declarations ending in ``using Callbacks``, the Params initializer)."""
        outputs = self.description.outputs
        roots = []
        for name, node in outputs:
            if node.op == "reduction":
                roots.append((name, node))
            elif not any(_contains(other, node) for other_name, other in outputs if other_name != name):
                roots.append((name, node))
        emitted = [self.reduction(name, node) if node.op == "reduction" else self.node(node) for name, node in roots]
        # Stores reached only through a reduction's operand were emitted there; any left are roots already.
        if len(emitted) == 1:
            root_type, root_args = emitted[0]
        else:
            joined = ", ".join(t for t, _ in emitted)
            root_type = self._new(f"Sm80EVT<{self._compute('KeepFirst')}, {joined}>")
            root_args = "{" + ", ".join(a for _, a in emitted) + ", {}}"
        self.lines.append(f"using Callbacks = {root_type};")
        return "\n".join(self.functors + self.lines), root_args


def _contains(tree: Node, node: Node) -> bool:
    if tree == node:
        return True
    return any(_contains(child, node) for child in tree.inputs)


def emit_tree(functor: EpilogueVisitTree) -> tuple[str, str]:
    return TreeEmitter(functor.description, names.ELEMENT[functor.element_output],
                       names.ELEMENT[functor.element_compute]).emit()


class GemmOperationEvt(TiledOperation):
    kind = "gemm_evt"
    abi_struct_type = GemmEvtArgs

    def __init__(self, arch: int, tile_description: TileDescription, A: TensorDescription, B: TensorDescription,
                 C: TensorDescription, epilogue_functor: EpilogueVisitTree,
                 swizzling_functor: SwizzlingFunctor = IdentitySwizzle1, visitor: bool = True, *,
                 direct_store: bool = False, scales=None):
        what = "GemmOperationUniversal(visitor=True)"
        if scales is not None:
            raise DescriptionError(f"{what}: scales={scales!r} is not built with an epilogue visitor tree",
                                   rule="scales.unsupported")
        if direct_store is not False:
            raise DescriptionError(f"{what}: direct_store=True replaces the epilogue, which the visitor tree is",
                                   rule="direct_store.unsupported")
        self.compute_capability = check_compute_capability(arch)
        if not isinstance(epilogue_functor, EpilogueVisitTree):
            raise DescriptionError(f"{what}: epilogue_functor must be an EpilogueVisitTree subclass instance, got "
                                   f"{epilogue_functor!r}", rule="description.field_type")
        for label, desc in (("A", A), ("B", B), ("C", C)):
            if not isinstance(desc, TensorDescription):
                raise DescriptionError(f"{what}: {label} must be a TensorDescription, got {desc!r}",
                                       rule="description.field_type")
            if desc.layout not in (LayoutType.RowMajor, LayoutType.ColumnMajor):
                raise DescriptionError(f"{what}: {label} must be RowMajor or ColumnMajor, got {desc.layout.value}",
                                       rule="evt.layout")
        if not isinstance(tile_description, TileDescription):
            raise DescriptionError(f"{what}: tile_description must be a TileDescription, got {tile_description!r}",
                                   rule="description.field_type")
        math = tile_description.math_instruction
        if math.opcode_class is not OpClass.TensorOp:
            raise DescriptionError(f"{what}: CUTLASS's Sm80 visitor epilogue uses the tensor-op output thread map; "
                                   f"use a TensorOp math instruction", rule="evt.tensor_op")
        if C.layout is not LayoutType.RowMajor:
            raise DescriptionError(f"{what}: the visitor's tensors are row-major M x N; C must be RowMajor, got "
                                   f"{C.layout.value}", rule="evt.layout")
        allowed = {math.element_a} | ({DataType.float32} if math.element_a is DataType.tfloat32 else set())
        for label, desc in (("A", A), ("B", B)):
            if desc.element not in allowed:
                raise DescriptionError(f"{what}: {label}.element is {desc.element.label} but the math instruction "
                                       f"multiplies {math.element_a.label}", rule="sm80.operand_element")
        check_crosswise_tile_k(tile_description, (("A", A, A.layout is LayoutType.RowMajor),
                                                  ("B", B, B.layout is LayoutType.ColumnMajor)), what)
        # The main loop is DefaultGemmUniversal's (default_gemm_universal_with_visitor.h), C RowMajor: the GEMM's rules.
        m, n, _ = tile_description.threadblock_shape
        check_f64_tensor_op_stages(tile_description, what)
        a_along_m, b_along_n = A.layout is LayoutType.ColumnMajor, B.layout is LayoutType.RowMajor
        half_in_smem = gemm_fast_f16_core(tile_description)
        check_congruous_tile(tile_description, [("A", "M", m)] * a_along_m + [("B", "N", n)] * b_along_n, what,
                             fast_f16=half_in_smem)
        problem = mainloop_thread_map_problem(tile_description, A, B, C)
        if problem:
            raise DescriptionError(f"{what}: {problem}", rule="sm80.mainloop_thread_map")
        check_narrow_warp_tiles(tile_description, None, a_along_m, b_along_n, what, half_in_smem=half_in_smem)
        tree = epilogue_functor
        if tree.element_output is not C.element:
            raise DescriptionError(f"{what}: the tree writes {tree.element_output.label} but C is {C.element.label}",
                                   rule="epilogue.output_type")
        if tree.alignment != C.alignment:
            raise DescriptionError(f"{what}: the tree's elements_per_access {tree.alignment} must equal C's "
                                   f"alignment {C.alignment}", rule="alignment.epilogue_match")
        if tree.element_accumulator is not math.element_accumulator:
            raise DescriptionError(f"{what}: the tree reads {tree.element_accumulator.label} accumulators but the "
                                   f"math instruction accumulates in {math.element_accumulator.label}",
                                   rule="epilogue.accumulator_type")
        problem = epilogue_thread_map_problem(tile_description, C)
        if problem:
            raise DescriptionError(f"{what}: {problem}", rule="sm80.epilogue_thread_map")
        check_mixed_epilogue_warp_tile(tile_description, C, math.element_accumulator, what)
        check_wide_warp_tile(tile_description, C, math.element_accumulator, what, visitor=True)
        _, warps_n, warps_k = tile_description.warp_count
        for name, node in epilogue_functor.description.outputs:
            if node.op != "reduction":
                continue
            if warps_n * warps_k >= 8:
                # 8+ warps per 8-row output slice: OutputTileOptimalThreadMap then spreads a row over several
                # warps, and the reduction nodes sum a tile's row within one warp (evt_reductions.cu.j2).
                raise DescriptionError(f"{what}: reduction {name!r}: warp_count {list(tile_description.warp_count)} "
                                       f"puts 8 or more warps on each 8-row slice of the output, spreading a row over "
                                       f"several warps; use warp_count[1] * warp_count[2] < 8", rule="evt.reduction")
            if node.value[1] is not None:
                axis, extent = (("N", tile_description.threadblock_shape[1]) if node.value[0] == "row"
                                else ("M", tile_description.threadblock_shape[0]))
                if node.value[1] != extent:
                    raise DescriptionError(
                        f"{what}: reduction {name!r} has length {node.value[1]}, but the kernel's per-tile partial "
                        f"sums span the threadblock tile's {axis} = {extent} (PyCUTLASS 2.11 wrote one per tile); "
                        f"pass length={extent}, or None for complete sums only", rule="evt.reduction")
        if tile_description.stages > 2:
            for label, desc in (("A", A), ("B", B)):
                if desc.access_bits < 32:
                    raise DescriptionError(f"{what}: {label} alignment {desc.alignment} is below the 32-bit minimum "
                                           f"of multistage kernels", rule="alignment.multistage_32b")
        if swizzling_functor not in GEMM_SWIZZLES:
            raise DescriptionError(f"{what}: swizzling_functor must be one of {[s.name for s in GEMM_SWIZZLES]}, "
                                   f"got {swizzling_functor!r}", rule="swizzle.unsupported")
        self._describe(arch, tile_description, A, B, C, tree, swizzling_functor)
        self.visitor = True
        tile_description.check_shared_memory(arch)

    def _signature(self) -> tuple:
        return ("gemm_evt", self.compute_capability, self.tile_description, self.A, self.B, self.C,
                self.epilogue_functor._key(), self.swizzling_functor)

    def _readable_name(self) -> str:
        layouts = "".join(names.LAYOUT_SHORT[d.layout] for d in (self.A, self.B, self.C))
        return f"gemm_evt_{self._types_and_tile_name(layouts)}"

    def headers(self) -> list[str]:
        return ["cutlass/gemm/kernel/default_gemm_universal_with_visitor.h",
                "cutlass/gemm/threadblock/threadblock_swizzle.h", "cutlass/epilogue/thread/activation.h"]

    def shared_code(self) -> str:
        """CUTLASS's Sm80 visitors (after the GEMM headers they need) and pycutlass's reduction nodes, once per
        translation unit."""
        return self.render("evt_reductions.cu.j2")

    def emit_body(self) -> str:
        tile = self.tile_description
        math = tile.math_instruction
        operand = names.ELEMENT[DataType.tfloat32] if math.element_a is DataType.tfloat32 else None
        declarations, params = emit_tree(self.epilogue_functor)
        return self.render(
            "gemm_evt.cu.j2", name=self.name, summary=self.describe(), tree=declarations, tree_params=params,
            element_a=operand or names.ELEMENT[self.A.element], layout_a=names.LAYOUT[self.A.layout],
            alignment_a=self.A.alignment,
            element_b=operand or names.ELEMENT[self.B.element], layout_b=names.LAYOUT[self.B.layout],
            alignment_b=self.B.alignment,
            element_c=names.ELEMENT[self.C.element], layout_c=names.LAYOUT[self.C.layout], alignment_c=self.C.alignment,
            element_accumulator=names.ELEMENT[math.element_accumulator],
            element_compute=names.ELEMENT[self.epilogue_functor.element_compute],
            opclass=names.OPCLASS[math.opcode_class], arch_tag=names.arch_tag(self.family),
            threadblock_shape=tile.threadblock_shape, warp_shape=tile.warp_shape,
            instruction_shape=math.instruction_shape, swizzle=names.gemm_swizzle(self.swizzling_functor),
            stages=tile.stages, math_operation=names.MATH_OPERATION[math.cutlass_math_operation])

    def epilogue_type(self, *args, problem_size=None, **values) -> EvtOutputOp:
        """PyCUTLASS 2.11's visitor ``output_op``: every tensor and scalar of the tree by name, and problem_size."""
        if args:
            d = self.epilogue_functor.description
            raise ArgumentError("a visitor GEMM's epilogue_type takes keyword arguments only: the tree's tensors "
                                f"and scalars by name ({list(d.tensors + d.scalars)}) and problem_size=[M, N]")
        return EvtOutputOp(self.epilogue_functor.description, problem_size, **values)

    def describe(self) -> str:
        math = self.tile_description.math_instruction
        return (f"GEMM+EVT sm{self.compute_capability} {math.opcode_class.name} "
                f"A={self.A.element.label}/{self.A.layout.value}/{self.A.alignment} "
                f"B={self.B.element.label}/{self.B.layout.value}/{self.B.alignment} "
                f"C={self.C.element.label}/{self.C.layout.value}/{self.C.alignment} "
                f"acc={math.element_accumulator.label} tile={self.tile_description.procedural_name()} "
                f"epilogue={self.epilogue_functor.describe()} swizzle={self.swizzling_functor.name}")
