"""The kind registry: every kind is built through the PyCUTLASS constructors, with the same class whatever kind modules
were imported before (each case runs in a fresh interpreter), and no module reaches into another one to register."""
from __future__ import annotations

import ast
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

import pycutlass
from pycutlass.kinds import registry

PACKAGE = Path(pycutlass.__file__).parent
REPO_ROOT = PACKAGE.parent

# Builds one operation of every kind through the public constructors, and asks each public arguments constructor
# which class it hands out (``Cls.__new__(Cls, op)`` is what ``Cls(op, ...)`` makes before its __init__ runs).
# argv[1]: kind modules to import first, in that order, under bare packages (``pycutlass`` and ``pycutlass.kinds``
# without their __init__, which import every kind in a fixed order); argv[2] == "package": import pycutlass after.
BUILD_EVERY_KIND = r'''
import importlib, json, sys, types
from pathlib import Path

package = Path(sys.argv[3])
for name, folder in (("pycutlass", package), ("pycutlass.kinds", package / "kinds")):
    bare = types.ModuleType(name)
    bare.__path__ = [str(folder)]
    sys.modules[name] = bare
for name in json.loads(sys.argv[1]):
    importlib.import_module(name)
if sys.argv[2] == "package":
    del sys.modules["pycutlass"], sys.modules["pycutlass.kinds"]
    import pycutlass  # the real package, over the kind modules already imported

from pycutlass.description.math_instruction import MathInstruction
from pycutlass.description.tensor_description import TensorDescription
from pycutlass.description.tile_description import TileDescription
from pycutlass.description.types import DataType as D, LayoutType as L, OpClass
from pycutlass.epilogue import LinearCombination
from pycutlass.epilogue.visitor import EpilogueVisitTree
from pycutlass.kinds.conv2d.arguments import Conv2dArguments
from pycutlass.kinds.conv2d.operation import Conv2dOperation
from pycutlass.kinds.conv2d.problem import IteratorAlgorithm, Operator, StrideSupport
from pycutlass.kinds.gemm.arguments import GemmArguments
from pycutlass.kinds.gemm.operation import GemmOperationUniversal
from pycutlass.kinds.gemm_grouped.arguments import GemmGroupedArguments
from pycutlass.kinds.gemm_grouped.operation import GemmOperationGrouped
from pycutlass.kinds.reduction.arguments import ReductionArguments
from pycutlass.kinds.reduction.operation import ReductionOperation


class Linear_(EpilogueVisitTree):
    def __call__(self, accum: 'tensor', c: 'tensor', alpha: 'scalar', beta: 'scalar'):
        D = alpha * accum + beta * c
        return D


sm80_math = MathInstruction([16, 8, 16], D.float16, D.float16, D.float32, OpClass.TensorOp)
sm80_tile = TileDescription([128, 128, 32], 3, [2, 2, 1], sm80_math)
sm90_tile = TileDescription([128, 128, 64], 0, None, MathInstruction([64, 128, 16], D.float16, D.float16, D.float32,
                                                                     OpClass.TensorOp))
A, B, C = (TensorDescription(D.float16, layout, 8) for layout in (L.RowMajor, L.ColumnMajor, L.RowMajor))
nhwc = [TensorDescription(D.float16, L.TensorNHWC, 8) for _ in range(3)]
epilogue = LinearCombination(D.float16, 8, D.float32, D.float32)
tree = Linear_(epilogue, sm80_tile, D.float32, 8, D.float32, D.float16)
tree.initialize()


def conv(arch, tile):
    return Conv2dOperation(Operator.fprop, IteratorAlgorithm.optimized, arch, tile, *nhwc, StrideSupport.Strided,
                           epilogue)


ops = {
    "gemm": GemmOperationUniversal(80, sm80_tile, A, B, C, epilogue),
    "gemm at 90 with an Sm80 tile": GemmOperationUniversal(90, sm80_tile, A, B, C, epilogue),
    "gemm_evt": GemmOperationUniversal(80, sm80_tile, A, B, C, tree, visitor=True),
    "gemm_sm90": GemmOperationUniversal(90, sm90_tile, A, B, C, epilogue),
    "gemm_array_sm90": GemmOperationUniversal(90, sm90_tile, A, B, C, epilogue, array=True),
    "gemm_grouped": GemmOperationGrouped(80, sm80_tile, A, B, C, epilogue),
    "gemm_grouped at 90 with an Sm80 tile": GemmOperationGrouped(90, sm80_tile, A, B, C, epilogue),
    "gemm_grouped_sm90": GemmOperationGrouped(90, sm90_tile, A, B, C, epilogue),
    "conv2d": conv(80, sm80_tile),
    "conv2d at 90 with an Sm80 tile": conv(90, sm80_tile),
    "conv2d_sm90": conv(90, sm90_tile),
    "reduction": ReductionOperation((4, 64), TensorDescription(D.float16, L.RowMajor, 8), D.float32, count=8),
}
ops["gemm_sm90 array=True"] = type(ops["gemm_sm90"])(90, sm90_tile, A, B, C, epilogue, array=True)


def qualified(cls):
    return f"{cls.__module__}.{cls.__qualname__}"


built = {case: qualified(type(op)) for case, op in ops.items()}
arguments = {case: [qualified(type(constructor.__new__(constructor, op)))
                    for constructor in (GemmArguments, GemmGroupedArguments, Conv2dArguments, ReductionArguments)]
             for case, op in ops.items()}
print(json.dumps({"built": built, "arguments": arguments}))
'''

K = "pycutlass.kinds."
GEMM, EVT = K + "gemm.operation.GemmOperationUniversal", K + "gemm_evt.operation.GemmOperationEvt"
SM90, ARRAY = K + "gemm_sm90.operation.GemmOperationSm90", K + "gemm_array_sm90.operation.GemmOperationArraySm90"
GROUPED, GROUPED_SM90 = K + "gemm_grouped.operation.GemmOperationGrouped", \
    K + "gemm_grouped_sm90.operation.GemmOperationGroupedSm90"
CONV, CONV_SM90 = K + "conv2d.operation.Conv2dOperation", K + "conv2d_sm90.operation.Conv2dOperationSm90"
EXPECTED_BUILT = {
    "gemm": GEMM, "gemm at 90 with an Sm80 tile": GEMM, "gemm_evt": EVT, "gemm_sm90": SM90, "gemm_array_sm90": ARRAY,
    "gemm_sm90 array=True": ARRAY, "gemm_grouped": GROUPED, "gemm_grouped at 90 with an Sm80 tile": GROUPED,
    "gemm_grouped_sm90": GROUPED_SM90, "conv2d": CONV, "conv2d at 90 with an Sm80 tile": CONV, "conv2d_sm90": CONV_SM90,
    "reduction": K + "reduction.operation.ReductionOperation",
}
PUBLIC_ARGUMENTS = (K + "gemm.arguments.GemmArguments", K + "gemm_grouped.arguments.GemmGroupedArguments",
                    K + "conv2d.arguments.Conv2dArguments", K + "reduction.arguments.ReductionArguments")
# Which class each public arguments constructor hands out for an operation of the case's kind (the column of the
# constructor that takes it; the others keep their own class, whose __init__ then says what is wrong).
OWN_ARGUMENTS = {
    "gemm_evt": (0, K + "gemm_evt.arguments.GemmEvtArguments"),
    "gemm_sm90": (0, K + "gemm_sm90.arguments.GemmArgumentsSm90"),
    "gemm_array_sm90": (0, K + "gemm_array_sm90.arguments.GemmArgumentsArraySm90"),
    "gemm_sm90 array=True": (0, K + "gemm_array_sm90.arguments.GemmArgumentsArraySm90"),
    "gemm_grouped_sm90": (1, K + "gemm_grouped_sm90.arguments.GemmGroupedArgumentsSm90"),
    "conv2d_sm90": (2, K + "conv2d_sm90.arguments.Conv2dArgumentsSm90"),
}


def expected_arguments(case: str) -> list[str]:
    handed_out = list(PUBLIC_ARGUMENTS)
    if case in OWN_ARGUMENTS:
        column, cls = OWN_ARGUMENTS[case]
        handed_out[column] = cls
    return handed_out


def kind_modules() -> list[str]:
    """Every module of every kind folder (its package, operation, arguments, ...)."""
    found = []
    for kind in registry.KINDS:
        folder = PACKAGE / "kinds" / kind.name
        found.append(f"{K}{kind.name}")
        found += [f"{K}{kind.name}.{path.stem}" for path in sorted(folder.glob("*.py")) if path.stem != "__init__"]
    return found


def build_every_kind(tmp_path: Path, first: list[str], then_package: bool) -> dict:
    script = tmp_path / "build_every_kind.py"  # a file: the visitor tree reads its own source
    script.write_text(BUILD_EVERY_KIND)
    done = subprocess.run([sys.executable, str(script), json.dumps(first), "package" if then_package else "bare",
                           str(PACKAGE)], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


ORDERS = [("none", []), ("registry order", None), ("reversed", "reversed"), ("shuffled 1", 1), ("shuffled 2", 2),
          ("only the SM80 gemm", [K + "gemm.operation", K + "gemm.arguments"]),
          ("SM90 kinds first", [K + "conv2d_sm90", K + "gemm_array_sm90.arguments", K + "gemm_grouped_sm90"])]


@pytest.mark.parametrize("label, order", ORDERS, ids=[label for label, _ in ORDERS])
@pytest.mark.parametrize("then_package", [False, True], ids=["bare", "package"])
def test_every_kind_is_built_the_same_whatever_was_imported_first(tmp_path, label, order, then_package):
    modules = kind_modules()
    if order is None:
        order = modules
    elif order == "reversed":
        order = modules[::-1]
    elif isinstance(order, int):
        order = random.Random(order).sample(modules, k=len(modules) - 3 * order)  # a subset, shuffled
    found = build_every_kind(tmp_path, order, then_package)
    assert found["built"] == EXPECTED_BUILT
    assert found["arguments"] == {case: expected_arguments(case) for case in EXPECTED_BUILT}


def test_the_table_names_every_kind_folder_once():
    folders = sorted(p.parent.name for p in (PACKAGE / "kinds").glob("*/operation.py"))
    assert sorted(kind.name for kind in registry.KINDS) == folders
    for kind in registry.KINDS:
        assert kind.operation_class().kind == kind.name
        assert issubclass(kind.arguments_class(), registry.kind(kind.name).arguments_class())
        if kind.arguments_built_by != kind.arguments:  # handed out by a public constructor: a subclass of it
            public = registry.select(kind.built_by).arguments_class()
            assert public.__name__ == kind.arguments_built_by and issubclass(kind.arguments_class(), public)


def test_array_and_visitor_together_are_rejected():
    with pytest.raises(pycutlass.DescriptionError, match="no epilogue visitor tree"):
        registry.operation_kind("GemmOperationUniversal", 90, None, visitor=True, array=True)


# --- no module registers itself into another one ------------------------------------------------------------------

def _imported_names(tree: ast.Module) -> set[str]:
    """Names bound by imports of pycutlass's own modules (relative, or ``pycutlass.``)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names
                      if alias.name.split(".")[0] == "pycutlass"}
        elif isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] == "pycutlass"):
            names |= {alias.asname or alias.name for alias in node.names}
    return names


def reaches_into_other_modules(source: str) -> list[str]:
    """Assignments or deletions into a name imported from pycutlass (``module.X = ...``, ``TABLE[key] = ...``),
    ``setattr`` or a mutating call on one, and ``__subclasses__`` calls: what makes a result depend on import order."""
    tree = ast.parse(source)
    imported = _imported_names(tree)
    found = []

    def root(node):
        while isinstance(node, (ast.Attribute, ast.Subscript)):
            node = node.value
        return node.id if isinstance(node, ast.Name) else None

    for node in ast.walk(tree):
        targets = []
        if isinstance(node, (ast.Assign, ast.Delete)):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for target in targets:
            for part in ast.walk(target):
                if isinstance(part, (ast.Attribute, ast.Subscript)) and root(part) in imported:
                    found.append(f"line {node.lineno}: writes into {ast.unparse(part)}")
                    break
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr == "__subclasses__":
                found.append(f"line {node.lineno}: calls __subclasses__()")
            if isinstance(func, ast.Name) and func.id == "setattr" and node.args and root(node.args[0]) in imported:
                found.append(f"line {node.lineno}: setattr on {ast.unparse(node.args[0])}")
            if isinstance(func, ast.Attribute) and func.attr in ("update", "setdefault", "append", "add") and \
                    isinstance(func.value, (ast.Name, ast.Attribute)) and root(func.value) in imported and \
                    (isinstance(func.value, ast.Attribute) or func.value.id.isupper()):
                found.append(f"line {node.lineno}: mutates {ast.unparse(func.value)}")
    return found


def test_the_checker_sees_registration_by_import():
    assert reaches_into_other_modules("from ..gemm import operation as g\ng.VISITOR_OPERATION = X\n")
    assert reaches_into_other_modules("from ..gemm.arguments import TABLE\nTABLE[X] = Y\n")
    assert reaches_into_other_modules("from ..gemm import arguments\narguments.TABLE[X] = Y\n")
    assert reaches_into_other_modules("from ..gemm import arguments\narguments.TABLE.update({X: Y})\n")
    assert reaches_into_other_modules("class A:\n    def f(cls):\n        return cls.__subclasses__()\n")
    assert not reaches_into_other_modules("import ctypes\nx = ctypes.c_int()\nx.value = 1\nTABLE = {}\nTABLE[1] = 2\n")
    assert not reaches_into_other_modules("import sys\nsys.modules['alias'] = sys.modules[__name__]\n")


def test_no_module_registers_into_another_or_asks_for_subclasses():
    offenders = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        found = reaches_into_other_modules(path.read_text())
        if found:
            offenders[str(path.relative_to(PACKAGE.parent))] = found
    assert not offenders, json.dumps(offenders, indent=1)


# --- the operation protocol is declared -------------------------------------------------------------------------

def trait_probes(source: str, declared: set[str]) -> list[str]:
    """``getattr(op, "trait", default)`` on an operation (a name or attribute called ``op``, ``operation`` or
    ``*_op``) for a trait the operation base declares: it should be read plainly."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr" \
                and len(node.args) == 3 and isinstance(node.args[1], ast.Constant) and node.args[1].value in declared:
            target = node.args[0]
            label = target.id if isinstance(target, ast.Name) else target.attr if isinstance(target, ast.Attribute) \
                else ""
            if label in ("op", "operation") or label.endswith("_op"):
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_every_trait_the_layers_read_is_declared_on_the_operation_base():
    from pycutlass.kinds.base import Operation, TiledOperation

    declared = {name for name in dir(TiledOperation) if not name.startswith("__")}
    for trait in ("required_backend", "unit_macros", "pdl_refusal", "bias", "conv_kind", "epilogue_functor",
                  "preamble", "shared_code", "family", "abi_structs", "name", "fast_clamp_max_k",
                  "serial_split_k_through_output"):
        assert trait in declared, trait
    assert Operation.pdl_refusal and Operation.required_backend is None and Operation.unit_macros == ()
    assert trait_probes('x = getattr(op, "required_backend", None)\n', declared)
    assert trait_probes('x = getattr(self.operation, "bias", None)\n', declared)
    assert not trait_probes('x = getattr(props, "bias", None)\n', declared)
    offenders = {str(path.relative_to(PACKAGE.parent)): trait_probes(path.read_text(), declared)
                 for path in sorted(PACKAGE.rglob("*.py"))}
    assert not {path: found for path, found in offenders.items() if found}


def test_sm90_kinds_share_one_set_of_family_traits():
    from pycutlass.kinds.families.sm90 import Sm90Operation

    for name in ("gemm_sm90", "gemm_grouped_sm90", "gemm_array_sm90", "conv2d_sm90"):
        cls = registry.kind(name).operation_class()
        assert issubclass(cls, Sm90Operation) and cls.family == "sm90" and cls.required_backend == "nvrtc"
        for trait in ("family", "required_backend", "takes", "cluster_shape", "shared_code"):
            assert trait not in vars(cls), f"{name} declares {trait} again"


# --- kinds import families, not each other ------------------------------------------------------------------------

KIND_FOLDERS = sorted(kind.name for kind in registry.KINDS)

# The only imports from one kind folder into another: a kind's class subclasses the class of another kind, because
# PyCUTLASS's contract says the object is one (``isinstance(GemmOperationUniversal(90, sm90_tile, ...),
# GemmOperationUniversal)``, and ``GemmArguments(op)`` returns a GemmArguments). Each is
# (importing kind, imported module, class); every name imported must be a base class in the importing module.
SUBCLASSED_ACROSS_KINDS = {
    ("gemm_sm90", "gemm.operation", "GemmOperationUniversal"),
    ("gemm_sm90", "gemm.arguments", "GemmArguments"),
    ("gemm_evt", "gemm.arguments", "GemmArguments"),
    ("gemm_grouped_sm90", "gemm_grouped.operation", "GemmOperationGrouped"),
    ("gemm_grouped_sm90", "gemm_grouped.arguments", "GemmGroupedArguments"),
    ("conv2d_sm90", "conv2d.operation", "Conv2dOperation"),
    ("conv2d_sm90", "conv2d.arguments", "Conv2dArguments"),
    # array=True is a variant of the SM90 GEMM (its operations are GemmOperationSm90s)
    ("gemm_array_sm90", "gemm_sm90.operation", "GemmOperationSm90"),
    ("gemm_array_sm90", "gemm_sm90.arguments", "GemmArgumentsSm90"),
}


def cross_kind_imports(path: Path) -> list[tuple[str, str, str, int]]:
    """(importing kind, imported module relative to pycutlass.kinds, imported name, line) for every import (function-
    local ones included) of another kind folder's module in ``path``."""
    own = path.relative_to(PACKAGE / "kinds").parts[0]
    package = ["pycutlass", "kinds", *path.relative_to(PACKAGE / "kinds").parent.parts]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package[:len(package) - (node.level - 1)] if node.level else []
            target = base + (node.module.split(".") if node.module else [])
            for alias in node.names:
                full = target + [alias.name] if len(target) == 2 else target  # "from .. import gemm"
                if full[:2] == ["pycutlass", "kinds"] and len(full) > 2 and full[2] in KIND_FOLDERS and full[2] != own:
                    found.append((own, ".".join(target[2:]) or alias.name, alias.name, node.lineno))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[:2] == ["pycutlass", "kinds"] and len(parts) > 2 and parts[2] in KIND_FOLDERS and \
                        parts[2] != own:
                    found.append((own, ".".join(parts[2:]), "", node.lineno))
    return found


def _base_class_names(path: Path) -> set[str]:
    return {ast.unparse(base) for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.ClassDef)
            for base in node.bases}


def test_the_cross_kind_scan_sees_relative_absolute_and_local_imports(tmp_path):
    folder = PACKAGE / "kinds" / "gemm_sm90"
    sample = folder / "operation.py"
    found = {(kind, module, name) for kind, module, name, _ in cross_kind_imports(sample)}
    assert ("gemm_sm90", "gemm.operation", "GemmOperationUniversal") in found
    source = "def f():\n    from ..conv2d.problem import Operator\n    import pycutlass.kinds.gemm.modes\n" \
             "from .. import gemm_grouped\nfrom ..families.sm90 import NVRTC_SHIM\nfrom .abi import X\n"
    fake = folder / "_scan_sample.py"
    try:
        fake.write_text(source)
        found = {(module, name) for _, module, name, _ in cross_kind_imports(fake)}
    finally:
        fake.unlink()
    assert found == {("conv2d.problem", "Operator"), ("gemm.modes", ""), ("gemm_grouped", "gemm_grouped")}


def test_kind_folders_import_families_never_each_other():
    """Rules several kinds share live in kinds/families; a kind folder imports another kind's module only to
    subclass its class (SUBCLASSED_ACROSS_KINDS)."""
    seen, offenders = set(), []
    for path in sorted((PACKAGE / "kinds").glob("*/*.py")):
        if path.parent.name not in KIND_FOLDERS:
            continue
        bases = _base_class_names(path)
        for kind, module, name, line in cross_kind_imports(path):
            if (kind, module, name) in SUBCLASSED_ACROSS_KINDS and name in bases:
                seen.add((kind, module, name))
            else:
                offenders.append(f"{path.relative_to(PACKAGE.parent)}:{line}: from {module} import {name}")
    assert not offenders, "kinds importing other kinds (move what they share to kinds/families):\n" + \
        "\n".join(offenders)
    assert seen == SUBCLASSED_ACROSS_KINDS, f"exceptions no longer needed: {SUBCLASSED_ACROSS_KINDS - seen}"
