"""Dependencies go one way. Every import in the package (function-local ones included) is checked against the
layer order that docs/concepts.md draws; an import from a lower layer into a higher one fails this test."""
from __future__ import annotations

import ast
import fnmatch
from pathlib import Path

import pycutlass

PACKAGE = Path(pycutlass.__file__).parent

# Lowest first. A module may import its own layer and the layers below it, never one above.
LAYERS = [
    ("state", ["errors", "session"]),
    ("descriptions", ["description", "description.*", "epilogue", "epilogue.*"]),
    ("emit", ["emit", "emit.*", "kinds.base", "kinds.*.operation", "kinds.*.abi", "kinds.*.problem",
              "kinds.*.modes"]),
    ("cache", ["cache", "cache.*"]),
    ("compile", ["compiler", "compiler.*"]),
    ("runtime", ["runtime", "runtime.*"]),
    ("kind runtime", ["kinds.*.arguments", "kinds.*.matrix"]),
    ("registration", ["kinds", "kinds.*"]),
    ("tune", ["tune", "tune.space", "tune.problems", "tune.db", "tune.sweep", "tune.bench", "tune.runner",
              "tune.autotune", "tune.select", "tune.plots", "tune.bundle", "tune.resources", "tune.distributed",
              "tune.rank"]),
    ("torch", ["torch", "torch.*"]),  # the only part that imports torch (docs/torch.md)
    ("api", ["", "gemm", "conv", "cli", "__main__", "utils", "utils.*", "tune.cli",
             # PyCUTLASS 2.11's module paths (docs/porting.md)
             "_compat", "gemm_operation", "conv2d_operation", "reduction_operation", "memory_manager", "library",
             "parser", "test", "test.*"]),
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
