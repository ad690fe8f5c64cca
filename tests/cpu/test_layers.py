"""Dependencies go one way. Every import in the package (function-local ones included) is checked against the
layer order that docs/concepts.md draws; an import from a lower layer into a higher one fails this test."""
from __future__ import annotations

import ast
import fnmatch
from pathlib import Path

import pycutlass

PACKAGE = Path(pycutlass.__file__).parent

# PyCUTLASS 2.11's module paths: each is the same module as its home in pycutlass.compat.
LEGACY_PATHS = ["_compat", "gemm_operation", "conv2d_operation", "reduction_operation", "memory_manager", "library",
                "parser", "utils", "utils.*", "test", "test.*"]
# The core: what pycutlass is, without PyCUTLASS 2.11's surface.
CORE = ["errors", "session", "description", "epilogue", "emit", "cache", "compiler", "runtime", "kinds", "tune",
        "torch"]

# Lowest first. A module may import its own layer and the layers below it, never one above.
LAYERS = [
    ("state", ["errors", "session"]),
    ("descriptions", ["description", "description.*", "epilogue", "epilogue.*"]),
    # kinds.registry imports a kind's arguments (kind runtime) by module path only, when an arguments constructor asks
    # kinds.families: rules several kinds share (a family's operation rules here; argument rules in kind runtime)
    ("emit", ["emit", "emit.*", "kinds.base", "kinds.registry", "kinds.families", "kinds.families.sm80",
              "kinds.families.sm90", "kinds.families.modes", "kinds.families.conv", "kinds.families.grouped",
              "kinds.families.sm90_ptr_array", "kinds.*.operation", "kinds.*.abi", "kinds.*.problem", "kinds.*.modes"]),
    ("cache", ["cache", "cache.*"]),
    ("compile", ["compiler", "compiler.*"]),
    ("runtime", ["runtime", "runtime.*"]),
    ("kind runtime", ["kinds.*.arguments", "kinds.*.matrix", "kinds.families.*"]),
    ("registration", ["kinds", "kinds.*"]),
    ("tune", ["tune", "tune.space", "tune.problems", "tune.db", "tune.sweep", "tune.bench", "tune.runner",
              "tune.autotune", "tune.select", "tune.plots", "tune.bundle", "tune.progress", "tune.resources",
              "tune.distributed", "tune.rank", "tune.breakdown", "tune.dask_gpus", "tune.gpu_slots", "tune.kernel_timer",
              "pack", "pack.*"]),
    ("torch", ["torch", "torch.*"]),  # the only part that imports torch (docs/torch.md)
    ("api", ["", "gemm", "conv", "cli", "cli.*", "__main__",
             # PyCUTLASS 2.11's surface (pycutlass.compat) and its old module paths (docs/porting.md)
             "compat", "compat.*", *LEGACY_PATHS]),
]


def layer_of(module: str) -> int:
    """The first layer with a matching pattern (patterns are relative to ``pycutlass.``)."""
    relative = module.removeprefix("pycutlass").removeprefix(".")
    for rank, (_, patterns) in enumerate(LAYERS):
        if any(fnmatch.fnmatchcase(relative, p) for p in patterns):
            return rank
    raise AssertionError(f"module {module} belongs to no layer: add it to LAYERS (and to docs/concepts.md)")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> list[tuple[str, int]]:
    """(imported pycutlass module, line) for every import statement anywhere in the file."""
    module = module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names if alias.name.split(".")[0] == "pycutlass"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "pycutlass":
                continue
            # "from . import x" may name submodules: count those, not the package.
            for alias in node.names:
                candidate = f"{target}.{alias.name}"
                is_module = (PACKAGE.parent / Path(*candidate.split("."))).with_suffix(".py").is_file() or \
                    (PACKAGE.parent / Path(*candidate.split(".")) / "__init__.py").is_file()
                found.append((candidate if is_module else target, node.lineno))
    return found


def test_every_import_goes_down_the_layers():
    violations = []
    for path in sorted(PACKAGE.rglob("*.py")):
        source = module_name(path)
        for target, line in imports_of(path):
            if layer_of(target) > layer_of(source):
                violations.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {source} "
                                  f"({LAYERS[layer_of(source)][0]}) imports {target} ({LAYERS[layer_of(target)][0]})")
    assert not violations, "imports against the layer order:\n" + "\n".join(violations)


def _in(module: str, top: list[str]) -> bool:
    relative = module.removeprefix("pycutlass").removeprefix(".")
    return any(fnmatch.fnmatchcase(relative, p) or fnmatch.fnmatchcase(relative, p + ".*") for p in top)


def test_the_core_never_imports_the_pycutlass211_surface():
    """PyCUTLASS 2.11's surface lives at the edge (pycutlass.compat and its old module paths): nothing in the core
    imports it, so the core can change without it and it can go without touching the core."""
    offenders = [f"{path.relative_to(PACKAGE.parent)}:{line}: {module_name(path)} imports {target}"
                 for path in sorted(PACKAGE.rglob("*.py")) if _in(module_name(path), CORE)
                 for target, line in imports_of(path) if _in(target, ["compat", *LEGACY_PATHS])]
    assert not offenders, "the core imports PyCUTLASS 2.11's surface:\n" + "\n".join(offenders)


def test_the_pycutlass211_paths_are_their_compat_modules():
    """Each old path is the compat module itself (not a copy): monkeypatching, ``import *`` and attributes agree."""
    import importlib

    for name in ["_compat", "gemm_operation", "conv2d_operation", "reduction_operation", "memory_manager", "library",
                 "utils", "utils.device", "utils.reference_model", "test", "test._common", "test.gemm_testbed",
                 "test.conv2d_testbed", "test.gemm_grouped_testbed", "test.profiler"]:
        home = "support" if name == "_compat" else name
        assert importlib.import_module(f"pycutlass.{name}") is importlib.import_module(f"pycutlass.compat.{home}")
    # and each old path's file is only the alias: the implementation lives in pycutlass.compat
    for path in [*PACKAGE.glob("*.py"), PACKAGE / "utils" / "__init__.py", PACKAGE / "test" / "__init__.py"]:
        if _in(module_name(path), LEGACY_PATHS):
            body = [node for node in ast.parse(path.read_text()).body
                    if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))]
            assert all(isinstance(node, (ast.Import, ast.ImportFrom, ast.Expr)) for node in body), path
    assert sorted(p.name for p in (PACKAGE / "test").iterdir() if p.suffix == ".py") == ["__init__.py"]
    assert sorted(p.name for p in (PACKAGE / "utils").iterdir() if p.suffix == ".py") == ["__init__.py"]


def import_graph() -> dict[str, set[str]]:
    """module -> the pycutlass modules it imports (function-local imports included)."""
    graph = {module_name(path): set() for path in PACKAGE.rglob("*.py")}
    for path in PACKAGE.rglob("*.py"):
        source = module_name(path)
        graph[source] |= {target for target, _ in imports_of(path) if target != source}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, targets = work[-1]
            target = next(targets, None)
            if target is not None:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph.get(target, ())))))
                elif target in on_stack:
                    low[node] = min(low[node], index[target])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycles():
    """No two modules import each other, directly or through others, not even inside functions: each piece a cycle
    shares belongs in a module below both (or the call is inverted with a parameter)."""
    found = cycles(import_graph())
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_cycle_check_finds_cycles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e", "d"}, "f": {"g"}, "g": {"f"}}
    assert sorted(cycles(graph)) == [["a", "b", "c"], ["f", "g"]]
    assert "pycutlass.torch.tuning" in import_graph()["pycutlass.torch.dispatch"]  # function-local imports count


def test_the_runtime_knows_no_kind():
    """The runtime runs every kind through one interface; it never imports a kind's module."""
    offenders = [(module_name(path), target) for path in (PACKAGE / "runtime").rglob("*.py")
                 for target, _ in imports_of(path) if target.startswith("pycutlass.kinds")]
    assert not offenders


def test_each_kind_owns_its_folder():
    from pycutlass.kinds import KINDS

    for kind in KINDS:
        folder = Path(kind.__file__).parent
        assert (folder / "operation.py").is_file() and (folder / "abi.py").is_file()
        assert (folder / "arguments.py").is_file() and list(folder.glob("*.cu.j2")), folder


def test_the_checker_sees_function_local_and_relative_imports(tmp_path):
    sample = PACKAGE / "kinds" / "base.py"
    targets = {t for t, _ in imports_of(sample)}
    assert "pycutlass.emit.emitter" in targets and "pycutlass.description.target" in targets
    assert layer_of("pycutlass.runtime.launch") > layer_of("pycutlass.kinds.gemm.operation")
    assert layer_of("pycutlass.kinds.gemm.arguments") > layer_of("pycutlass.runtime.launch")


def test_every_template_ships_in_the_wheel():
    """Each kind's templates (and the conv overlay) are package data: a wheel without them emits nothing."""
    import tomllib

    data = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    files = [p for pattern in ("*.j2", "*.cuh") for p in PACKAGE.rglob(pattern)]
    assert len(files) > 8
    for path in files:
        for folder in [path.parent, *path.parents]:
            if folder == PACKAGE.parent:
                raise AssertionError(f"{path.relative_to(PACKAGE)} is not package data in pyproject.toml")
            package = ".".join(folder.relative_to(PACKAGE.parent).parts)
            relative = path.relative_to(folder).as_posix()
            patterns = data.get(package, []) + (data.get("*", []) if folder == path.parent else [])
            if any(fnmatch.fnmatch(relative, p) for p in patterns):
                break
