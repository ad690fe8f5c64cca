"""The epilogue visitor tree (EVT): PyCUTLASS 2.11's ``EpilogueVisitTree``, traced into an immutable description.

A user subclasses ``EpilogueVisitTree`` and writes the epilogue as ``__call__`` over the accumulator and extra
tensors, with annotations saying what each parameter is::

    class RowBroadcast_(EpilogueVisitTree):
        def __call__(self, accum: 'tensor', c: 'tensor', vector: 'row', alpha: 'scalar', beta: 'scalar'):
            T = accum + vector
            Z = relu.numpy(alpha * T + beta * c)
            return Z, T

``accum`` is the accumulator; ``'tensor'`` an M x N auxiliary input, ``'row'`` a vector of N broadcast over the
rows, ``'column'`` a vector of M broadcast over the columns, ``'scalar'`` a runtime scalar. The returned names
are the outputs: M x N tensors, or ``reduction_op(X, "row"|"column", "Add", length)`` reductions. The same
``__call__`` runs on numpy arrays as the float64 reference (PyCUTLASS's use of it in its tests); there a reduction
with a ``length`` gives PyCUTLASS's per-tile partial sums (see ``reduction_op``).

Tracing runs ``__call__`` once on symbolic values; the result is ``EvtDescription``, a hashable tuple of nodes
that the GEMM-with-visitor operation (``kinds/gemm_evt``) emits as CUTLASS's own Sm80 EVT types. What cannot be
emitted raises ``DescriptionError`` naming the node.
"""
from __future__ import annotations

import ast
import inspect
import math
import textwrap
from dataclasses import dataclass, field

import numpy as np

from ..description.types import DataType
from ..errors import ArgumentError, DescriptionError

# Binary operators and the CUTLASS functor each becomes.
BINARY_OPS = {"add": "cutlass::plus", "sub": "cutlass::minus", "mul": "cutlass::multiplies",
              "div": "cutlass::divides"}
# Activations a node may apply (``relu.numpy(x)`` on a traced value), with their CUTLASS Array functors.
UNARY_OPS = {"relu": "cutlass::epilogue::thread::ReLu", "tanh": "cutlass::epilogue::thread::Tanh",
             "sigmoid": "cutlass::epilogue::thread::Sigmoid", "silu": "cutlass::epilogue::thread::SiLu",
             "hardswish": "cutlass::epilogue::thread::HardSwish", "gelu": "cutlass::epilogue::thread::GELU",
             "gelu_taylor": "cutlass::epilogue::thread::GELU_taylor",
             "leaky_relu": None}  # leaky_relu takes a constant slope: emitted as its own functor
INPUT_KINDS = ("tensor", "row", "column", "scalar")
REDUCTION_DIRECTIONS = ("row", "column")
MAX_TENSORS = 8
MAX_SCALARS = 8


@dataclass(frozen=True)
class Node:
    """One node of the traced DAG. ``op``: acc, tensor, row, column, scalar, const, add/sub/mul/div, an activation
    name, or reduction; ``name``: the input's name; ``value``: a constant, or the activation's/reduction's
    constant arguments; ``inputs``: the operand nodes."""

    op: str
    inputs: tuple = ()
    name: str | None = None
    value: tuple = ()

    def label(self) -> str:
        if self.name is not None:
            return f"{self.op} {self.name!r}"
        if self.op == "const":
            return f"constant {self.value[0]!r}"
        return f"{self.op}({', '.join(i.label() for i in self.inputs)})"


class Traced:
    """A symbolic value while ``__call__`` is traced: arithmetic builds nodes, anything else is refused."""

    __array_priority__ = 1000  # numpy scalars on the left defer to our reflected operators

    def __init__(self, node: Node):
        self.__evt_node__ = node

    # elementwise arithmetic ----------------------------------------------------------------------------------
    def _binary(self, op, other, reflected=False):
        other_node = _as_node(other, f"{'a' if reflected else 'the'} operand of {op}")
        a, b = (other_node, self.__evt_node__) if reflected else (self.__evt_node__, other_node)
        for operand in (a, b):
            if operand.op == "reduction":
                raise DescriptionError(f"EpilogueVisitTree: the reduction {operand.name or operand.label()} is used "
                                       f"in {op}; a reduction's result can only be returned", rule="evt.reduction")
        return Traced(Node(op, (a, b)))

    def __add__(self, other): return self._binary("add", other)
    def __radd__(self, other): return self._binary("add", other, True)
    def __sub__(self, other): return self._binary("sub", other)
    def __rsub__(self, other): return self._binary("sub", other, True)
    def __mul__(self, other): return self._binary("mul", other)
    def __rmul__(self, other): return self._binary("mul", other, True)
    def __truediv__(self, other): return self._binary("div", other)
    def __rtruediv__(self, other): return self._binary("div", other, True)

    def __neg__(self):
        return self._binary("mul", -1.0, True)

    def __pos__(self):
        return self

    def _unsupported(self, what):
        raise DescriptionError(f"EpilogueVisitTree: {what} on {self.__evt_node__.label()} is not supported; nodes "
                               f"may use +, -, *, /, the activations {sorted(UNARY_OPS)}, and reduction_op",
                               rule="evt.operation")

    def __pow__(self, other): self._unsupported("**")
    def __rpow__(self, other): self._unsupported("**")
    def __floordiv__(self, other): self._unsupported("//")
    def __rfloordiv__(self, other): self._unsupported("//")
    def __mod__(self, other): self._unsupported("%")
    def __matmul__(self, other): self._unsupported("@")
    def __abs__(self): self._unsupported("abs()")
    def __lt__(self, other): self._unsupported("<")
    def __le__(self, other): self._unsupported("<=")
    def __gt__(self, other): self._unsupported(">")
    def __ge__(self, other): self._unsupported(">=")
    def __bool__(self): self._unsupported("a truth test (if/and/or)")
    def __getitem__(self, item): self._unsupported("indexing")
    def __array_ufunc__(self, ufunc, method, *args, **kwargs): self._unsupported(f"numpy.{ufunc.__name__}")
    def __array_function__(self, func, types, args, kwargs): self._unsupported(f"numpy.{func.__name__}")

    # activations ---------------------------------------------------------------------------------------------
    def _evt_activation(self, name: str, args: tuple):
        if name == "identity":
            return self
        if name not in UNARY_OPS:
            self._unsupported(f"the activation {name}")
        values = []
        for arg in args:
            if isinstance(arg, Traced) or isinstance(arg, bool) or not isinstance(arg, (int, float, np.number)):
                raise DescriptionError(f"EpilogueVisitTree: {name}'s argument must be a Python number (a constant "
                                       f"of the kernel), got {arg!r}", rule="evt.constant")
            values.append(float(arg))
        if self.__evt_node__.op == "reduction":
            raise DescriptionError(f"EpilogueVisitTree: {name} of a reduction; a reduction's result can only be "
                                   f"returned", rule="evt.reduction")
        return Traced(Node(name, (self.__evt_node__,), value=tuple(values)))


def _as_node(value, what: str) -> Node:
    if isinstance(value, Traced):
        return value.__evt_node__
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise DescriptionError(f"EpilogueVisitTree: {what} must be a traced value or a Python number, got "
                               f"{type(value).__name__} {value!r}", rule="evt.constant")
    value = float(value)
    if not math.isfinite(value):
        raise DescriptionError(f"EpilogueVisitTree: constant {value!r} is not finite", rule="evt.constant")
    return Node("const", value=(value,))


def reduction_op(x, direction: str, op: str = "Add", length=None):
    """PyCUTLASS 2.11's ``reduction_op(X, "row"|"column", "Add", length)``.

    ``"row"`` sums each row of X (over N), ``"column"`` each column (over M). With ``length`` (PyCUTLASS's
    scripts pass the threadblock tile's N for "row", its M for "column"), the sums are PyCUTLASS's per-tile partial
    sums: on numpy arrays, shape (..., ceil(N / length), M) for "row" and (..., ceil(M / length), N) for "column"
    (flattened, PyCUTLASS's buffer order), a ragged last tile summing only the elements it holds. Without
    ``length``, the complete sums: (..., M) and (..., N). On traced values it makes a reduction node; the kernel
    writes either form, as the output buffer's size says (see ``kinds/gemm_evt``).
    """
    if direction not in REDUCTION_DIRECTIONS:
        raise DescriptionError(f"reduction_op: direction must be 'row' or 'column', got {direction!r}",
                               rule="evt.reduction")
    if str(op).lower() not in ("add", "sum", "plus"):
        raise DescriptionError(f"reduction_op: only the 'Add' reduction is supported, got {op!r}", rule="evt.reduction")
    if length is not None and (isinstance(length, bool) or not isinstance(length, (int, np.integer)) or length < 1):
        raise DescriptionError(f"reduction_op: length must be a positive integer (the threadblock tile's extent "
                               f"along the reduced dimension) or None, got {length!r}", rule="evt.reduction")
    length = None if length is None else int(length)
    if isinstance(x, Traced):
        node = x.__evt_node__
        if node.op == "reduction":
            raise DescriptionError("reduction_op of a reduction; a reduction's result can only be returned",
                                   rule="evt.reduction")
        return Traced(Node("reduction", (node,), value=(direction, length)))
    x = np.asarray(x, dtype=np.float64)
    axis = -1 if direction == "row" else -2
    if length is None:
        return x.sum(axis=axis)
    extent = x.shape[axis]
    tiles = -(-extent // length)
    padding = [(0, 0)] * x.ndim
    padding[axis] = (0, tiles * length - extent)  # the ragged last tile's missing elements add nothing
    x = np.pad(x, padding)
    if direction == "row":  # (..., M, tiles, length) -> (..., tiles, M)
        return np.swapaxes(x.reshape(*x.shape[:-1], tiles, length).sum(axis=-1), -1, -2)
    return x.reshape(*x.shape[:-2], tiles, length, x.shape[-1]).sum(axis=-2)  # (..., tiles, N)


def _kind_of(annotation, parameter: str) -> str:
    if annotation is inspect.Parameter.empty:
        raise DescriptionError(f"EpilogueVisitTree.__call__: parameter {parameter!r} needs an annotation, one of "
                               f"{list(INPUT_KINDS)} (e.g. {parameter}: 'tensor')", rule="evt.signature")
    text = annotation if isinstance(annotation, str) else repr(annotation)
    found = [kind for kind in INPUT_KINDS if f"'{kind}'" in text or text == kind]
    if len(found) != 1:
        raise DescriptionError(f"EpilogueVisitTree.__call__: parameter {parameter!r} is annotated {annotation!r}; "
                               f"use one of {list(INPUT_KINDS)}", rule="evt.signature")
    return found[0]


def _return_names(function) -> list[str] | None:
    """The names in ``__call__``'s return statement (they name the outputs), or None if unreadable."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    except (OSError, TypeError, SyntaxError):
        return None
    returns = [n for n in ast.walk(tree) if isinstance(n, ast.Return) and n.value is not None]
    if len(returns) != 1:
        raise DescriptionError("EpilogueVisitTree.__call__ must have exactly one return statement naming its "
                               "outputs (e.g. return D, T)", rule="evt.signature")
    value = returns[0].value
    items = value.elts if isinstance(value, ast.Tuple) else [value]
    if not all(isinstance(item, ast.Name) for item in items):
        raise DescriptionError("EpilogueVisitTree.__call__ must return variable names (they name the outputs: "
                               "return D, T), not expressions", rule="evt.signature")
    return [item.id for item in items]


@dataclass(frozen=True)
class EvtDescription:
    """The traced tree: inputs (name, kind) in parameter order, outputs (name, node) in return order."""

    inputs: tuple
    outputs: tuple
    tensors: tuple = field(init=False)  # names with a pointer in the ABI struct: inputs, then outputs
    scalars: tuple = field(init=False)

    def __post_init__(self):
        object.__setattr__(self, "tensors", tuple(
            [name for name, kind in self.inputs if kind in ("tensor", "row", "column")] +
            [name for name, _ in self.outputs]))
        object.__setattr__(self, "scalars", tuple(name for name, kind in self.inputs if kind == "scalar"))

    def tensor_kind(self, name: str) -> str:
        """tensor, row, column (inputs), store (an M x N output), reduce_row or reduce_column."""
        for input_name, kind in self.inputs:
            if input_name == name:
                return kind
        node = dict(self.outputs)[name]
        return f"reduce_{node.value[0]}" if node.op == "reduction" else "store"


def trace(functor, function) -> EvtDescription:
    signature = inspect.signature(function)
    inputs, arguments, has_accumulator = [], {}, False
    for parameter in signature.parameters.values():
        if parameter.kind not in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY):
            raise DescriptionError(f"EpilogueVisitTree.__call__: *args/**kwargs ({parameter.name}) are not supported",
                                   rule="evt.signature")
        if parameter.name in ("accum", "accumulator"):
            has_accumulator = True
            arguments[parameter.name] = Traced(Node("acc"))
            continue
        kind = _kind_of(parameter.annotation, parameter.name)
        if parameter.name == "problem_size":
            raise DescriptionError("EpilogueVisitTree.__call__: 'problem_size' is reserved (output_op takes it)",
                                   rule="evt.signature")
        inputs.append((parameter.name, kind))
        arguments[parameter.name] = Traced(Node(kind, name=parameter.name))
    if not has_accumulator:
        raise DescriptionError("EpilogueVisitTree.__call__ needs the accumulator as a parameter named 'accum'",
                               rule="evt.signature")
    result = function(**arguments)
    values = list(result) if isinstance(result, tuple) else [result]
    names = _return_names(function)
    if names is None:
        names = ["D"] + [f"output{i}" for i in range(1, len(values))]
    if len(names) != len(values):
        raise DescriptionError(f"EpilogueVisitTree.__call__ returns {len(values)} values but its return statement "
                               f"names {len(names)}", rule="evt.signature")
    if not values:
        raise DescriptionError("EpilogueVisitTree.__call__ must return at least one output", rule="evt.signature")
    outputs = []
    for name, value in zip(names, values):
        if not isinstance(value, Traced):
            raise DescriptionError(f"EpilogueVisitTree: output {name!r} is {value!r}, not a value computed from the "
                                   f"inputs", rule="evt.signature")
        if name in dict(inputs) or name in ("accum", "accumulator"):
            raise DescriptionError(f"EpilogueVisitTree: output {name!r} has the name of an input; name outputs "
                                   f"with new variables", rule="evt.signature")
        if name in dict(outputs):
            raise DescriptionError(f"EpilogueVisitTree: output {name!r} is returned twice", rule="evt.signature")
        outputs.append((name, value.__evt_node__))
    description = EvtDescription(tuple(inputs), tuple(outputs))
    if len(description.tensors) > MAX_TENSORS:
        raise DescriptionError(f"EpilogueVisitTree: {len(description.tensors)} tensors (inputs and outputs) exceed "
                               f"the {MAX_TENSORS} the kernel's argument struct holds", rule="evt.capacity")
    if len(description.scalars) > MAX_SCALARS:
        raise DescriptionError(f"EpilogueVisitTree: {len(description.scalars)} scalars exceed the {MAX_SCALARS} "
                               f"the kernel's argument struct holds", rule="evt.capacity")
    return description


class EpilogueVisitTree:
    """Subclass it and define ``__call__`` (see the module docstring). Built like PyCUTLASS 2.11's::

        epilogue_functor = MyTree(elementwise_functor, tile_description, element_accumulator,
                                  elements_per_access, element_compute, element_output)
        epilogue_functor.initialize()   # optional: tracing happens at construction

    ``element_compute`` left out (None) is float64 for a float64 accumulator or output, else float32 (PyCUTLASS's
    default); a float64 tree computing in anything narrower is rejected. ``elementwise_functor`` (PyCUTLASS's base
    epilogue) is accepted and unused. Equal trees (same traced
    description and types) compare equal and hash alike: they are part of the operation's name.
    """

    kind = "EpilogueVisitTree"
    activation = None

    def __init__(self, elementwise_functor=None, tile_description=None, element_accumulator=DataType.float32,
                 elements_per_access: int = 1, element_compute=None, element_output=DataType.float16):
        for label, element in (("element_accumulator", element_accumulator), ("element_compute", element_compute),
                               ("element_output", element_output)):
            if not isinstance(element, DataType) and not (label == "element_compute" and element is None):
                raise DescriptionError(f"{type(self).__name__}: {label} must be a pycutlass data type, got "
                                       f"{element!r}", rule="description.field_type")
        if isinstance(elements_per_access, bool) or not isinstance(elements_per_access, int) or \
                elements_per_access < 1:
            raise DescriptionError(f"{type(self).__name__}: elements_per_access must be a positive integer, got "
                                   f"{elements_per_access!r}", rule="description.field_type")
        if type(self).__call__ is EpilogueVisitTree.__call__:
            raise DescriptionError(f"{type(self).__name__} must define __call__ (the epilogue)", rule="evt.signature")
        self.elementwise_functor = elementwise_functor
        self.tile_description = tile_description
        self.element_accumulator = element_accumulator
        element_compute = self._resolve_element_compute(element_accumulator, element_compute, element_output)
        self.element_compute = element_compute
        self.element_epilogue = element_compute
        self.element_output = element_output
        self.alignment = elements_per_access
        self.elements_per_access = elements_per_access
        self.description = trace(self, self.__call__)
        self._check_types()

    def _resolve_element_compute(self, element_accumulator, element_compute, element_output):
        """As the functors' element_epilogue: a float64 tree (float64 accumulator or output) computes in float64,
        since every node's arithmetic, activation and constant is in element_compute and float32 would round the
        float64 results to about 3e-8. Omitted: float64 for a float64 tree, else float32; narrower: rejected."""
        wide = [f"{label} float64" for label, element in (("element_accumulator", element_accumulator),
                                                          ("element_output", element_output))
                if element is DataType.float64]
        if element_compute is None:
            return DataType.float64 if wide else DataType.float32
        if wide and element_compute is not DataType.float64:
            raise DescriptionError(f"{type(self).__name__}: a float64 tree ({', '.join(wide)}) must compute in "
                                   f"float64: every node computes in element_compute, and {element_compute.label} "
                                   f"would round the float64 results; pass element_compute=float64 or leave it out",
                                   rule="evt.types")
        return element_compute

    def _check_types(self):
        if self.element_compute not in (DataType.float32, DataType.float64):
            raise DescriptionError(f"{type(self).__name__}: element_compute must be float32 or float64, got "
                                   f"{self.element_compute.label}", rule="evt.types")
        if self.element_output not in (DataType.float16, DataType.bfloat16, DataType.float32, DataType.float64):
            raise DescriptionError(f"{type(self).__name__}: element_output must be a floating-point type, got "
                                   f"{self.element_output.label}", rule="evt.types")

    def initialize(self):
        """PyCUTLASS 2.11 parsed the tree here; pycutlass traced it at construction. Kept for its scripts."""
        return self

    def __call__(self, *args, **kwargs):  # pragma: no cover - subclasses define it
        raise NotImplementedError

    def _key(self):
        return (type(self).__qualname__, self.description, self.element_accumulator, self.element_compute,
                self.element_output, self.alignment)

    def __eq__(self, other):
        return isinstance(other, EpilogueVisitTree) and other._key() == self._key()

    def __hash__(self):
        return hash(self._key())

    def __repr__(self):
        return f"{type(self).__name__}({self.describe()})"

    def describe(self) -> str:
        outputs = ", ".join(f"{name}={node.label()}" for name, node in self.description.outputs)
        return f"EVT[{outputs}] out={self.element_output.label}/{self.alignment} compute={self.element_compute.label}"


class EvtOutputOp:
    """``operation.epilogue_type(**named tensors and scalars, problem_size=[M, N])``: what a visitor GEMM's
    arguments bind. ``sync()`` waits and copies host outputs back (it asks the arguments that used it)."""

    def __init__(self, description: EvtDescription, problem_size=None, **values):
        expected = set(description.tensors) | set(description.scalars)
        unknown = sorted(set(values) - expected)
        missing = sorted(expected - set(values))
        if unknown:
            raise ArgumentError(f"epilogue_type: unknown argument(s) {unknown}; the tree takes {sorted(expected)}"
                                   f" and problem_size")
        if missing:
            raise ArgumentError(f"epilogue_type: missing argument(s) {missing} (the tree's inputs and outputs, by "
                                   f"name)")
        for name in description.scalars:
            value = values[name]
            if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
                raise ArgumentError(f"epilogue_type: scalar {name!r} must be a number, got {value!r}")
        self.description = description
        self.problem_size = None if problem_size is None else tuple(int(x) for x in problem_size)
        self.values = values
        self.scalars = tuple(float(values[name]) for name in description.scalars)
        self._arguments = None

    def tensor(self, name: str):
        return self.values[name]

    def sync(self):
        if self._arguments is None:
            raise ArgumentError("output_op.sync(): these values were not used by any GemmArguments yet")
        self._arguments.sync()
