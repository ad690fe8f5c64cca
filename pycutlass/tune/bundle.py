"""Compile here, run there: one portable file with a sweep's compiled kernels.

    pycutlass bundle export --space sm80-f16 --problems square:256:4096:256 --target 90 sweep.bundle   # no GPU
    pycutlass sweep --bundle sweep.bundle --db results.db                                              # GPU host
    pycutlass db merge local.db results.db                                                             # back home

A bundle is a zip: ``manifest.json`` (format, versions, target, toolchain, the sweep's space and problems, and per
kernel its parameters, symbols, binary and source hashes), ``manifest.sha256`` and ``binaries/<sha256>.cubin``.
Opening one checks every hash; running it rebuilds each operation from its parameters and refuses one whose emitted
source differs from what was compiled (a different pycutlass would otherwise run the wrong binary silently).
"""
from __future__ import annotations

import functools
import hashlib
import json
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import ArgumentError, CacheError
from .db import pycutlass_version

FORMAT = "pycutlass-bundle/1"


class BundleError(CacheError):
    """A bundle file is damaged, altered, or does not match this pycutlass."""


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def export_bundle(sweep, path: str | Path, *, target, jobs: int | None = None) -> Path:
    """Compile ``sweep``'s operations for ``target`` (here, no GPU needed) and write them to one file."""
    from ..compiler import toolchain
    from ..compiler.manager import Compiler, parse_target

    if target is None:
        raise ArgumentError("a bundle needs an explicit target (e.g. 90): the GPU that will run it is elsewhere")
    target = parse_target(target)
    if sweep.space is None:
        raise ArgumentError("bundles carry a SearchSpace's parameters; build the sweep from a SearchSpace")
    sweep.target = target
    summary = sweep.compile(jobs=jobs)
    operations = sweep.ready_operations()
    if not operations:
        raise ArgumentError(f"nothing to bundle: no operation compiled ({summary})")
    compiler = Compiler.of(sweep.session)
    report = compiler.add_module(operations, target=target)  # all cache hits after compile()
    kernels, binaries = [], {}
    for op, compiled in zip(operations, report.kernels):
        binaries[compiled.sha256] = compiled.binary
        kernels.append({"name": op.name, "params": sweep.params_of(op), "target": compiled.target,
                        "backend": compiled.backend, "kernel_symbol": compiled.kernel_symbol,
                        "builder_symbol": compiled.builder_symbol, "binary_sha256": compiled.sha256,
                        "source_sha256": _sha(op.emit().encode())})
    toolchains = {}
    for backend in sorted({k["backend"] for k in kernels}):
        try:
            toolchains[backend] = toolchain.fingerprint(backend)
        except Exception as exc:  # informative only
            toolchains[backend] = {"error": str(exc)}
    manifest = {"format": FORMAT, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "pycutlass": pycutlass_version(), "target": target.name, "toolchains": toolchains,
                "sweep": sweep.name, "space": sweep.space.to_dict(),
                "problems": [p.to_dict() for p in sweep.problems], "pruned": dict(sweep.pruned),
                "compile": {"failed": dict(summary.failed), "known_bad": summary.known_bad}, "kernels": kernels}
    manifest_bytes = json.dumps(manifest, indent=1, sort_keys=True).encode()
    path = Path(path)
    tmp = path.with_name(path.name + ".partial")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("manifest.json", manifest_bytes)
        archive.writestr("manifest.sha256", _sha(manifest_bytes))
        for sha, binary in binaries.items():
            archive.writestr(f"binaries/{sha}.cubin", binary)
    tmp.replace(path)  # a reader never sees half a bundle
    return path


@dataclass
class Bundle:
    """An opened, verified bundle."""

    path: Path
    manifest: dict
    binaries: dict

    @classmethod
    def open(cls, path: str | Path) -> Bundle:
        path = Path(path)
        try:
            with zipfile.ZipFile(path) as archive:
                manifest_bytes = archive.read("manifest.json")
                recorded = archive.read("manifest.sha256").decode().strip()
                if _sha(manifest_bytes) != recorded:
                    raise BundleError(f"{path}: manifest.json does not match its hash (altered or damaged)")
                manifest = json.loads(manifest_bytes)
                if manifest.get("format") != FORMAT:
                    raise BundleError(f"{path}: format {manifest.get('format')!r}, this pycutlass reads {FORMAT}")
                binaries = {}
                for kernel in manifest["kernels"]:
                    sha = kernel["binary_sha256"]
                    if sha not in binaries:
                        data = archive.read(f"binaries/{sha}.cubin")
                        if _sha(data) != sha:
                            raise BundleError(f"{path}: binary {sha[:12]} of {kernel['name']} fails its hash check")
                        binaries[sha] = data
        except (zipfile.BadZipFile, KeyError, json.JSONDecodeError, FileNotFoundError) as exc:
            raise BundleError(f"{path} is not a readable pycutlass bundle: {exc}") from exc
        return cls(path, manifest, binaries)

    @property
    def target(self) -> str:
        return self.manifest["target"]

    def space(self):
        from .space import SearchSpace

        return SearchSpace.from_dict(self.manifest["space"])

    def problems(self) -> list:
        from .problems import problem_from_dict

        return [problem_from_dict(p) for p in self.manifest["problems"]]

    def operations(self) -> list:
        """Each kernel's operation, rebuilt from its parameters and checked against the compiled source."""
        from .space import build_operation

        found = []
        for kernel in self.manifest["kernels"]:
            op = build_operation(kernel["params"])
            if op.name != kernel["name"] or _sha(op.emit().encode()) != kernel["source_sha256"]:
                raise BundleError(f"{self.path}: {kernel['name']} emits different source with this pycutlass "
                                  f"than the one that compiled it (bundle from pycutlass "
                                  f"{self.manifest['pycutlass']}); export the bundle again")
            found.append(op)
        return found

    def adopt_into(self, session) -> list:
        """Make ``session`` run the bundle's binaries for its operations; returns the operations."""
        from ..compiler.manager import Compiler

        compiler = Compiler.of(session)
        operations = self.operations()
        for op, kernel in zip(operations, self.manifest["kernels"]):
            compiler.adopt(op, kernel["target"], self.binaries[kernel["binary_sha256"]], kernel["backend"],
                           kernel["kernel_symbol"], kernel["builder_symbol"])
        return operations

    def sweep(self, db, *, session=None):
        """The bundle's sweep, recorded in ``db`` (kernels, problems), ready for ``run_bundle``."""
        from .sweep import Sweep

        return Sweep(self.space(), self.problems(), db=db, name=self.manifest["sweep"], session=session)


def run_bundle(path: str | Path, db, *, config=None, devices=None, timeout: float = 120.0, progress=None,
               baseline: bool = True, session=None):
    """Benchmark a bundle's kernels on this host's GPUs without compiling anything."""
    from ..compiler.target import detected_compute_capability
    from .runner import run_sweep

    bundle = Bundle.open(path)
    sweep = bundle.sweep(db, session=session)
    operations = bundle.operations()
    detected = detected_compute_capability((list(devices) or [0])[0] if devices is not None else 0)
    if detected is not None and int(bundle.target.removeprefix("sm_").rstrip("a")) // 10 != detected // 10:
        raise BundleError(f"{path} holds {bundle.target} binaries; this GPU is sm_{detected} (SASS does not run "
                          f"across major architectures): export it again with --target {detected}")
    return run_sweep(sweep, config=config, devices=devices, timeout=timeout, progress=progress, baseline=baseline,
                     prepare_session=functools.partial(adopt_bundle, str(path)), operations=operations)


def adopt_bundle(path: str, session) -> None:
    """Make ``session`` run the binaries of the bundle at ``path`` (a benchmark worker's first step)."""
    Bundle.open(path).adopt_into(session)
