"""A loaded pack: which of its kernels serves a call, and running it with no compiler.

``load_pack(path)`` checks the manifest. A kernel is made ready the first time a call needs it: its operation is
rebuilt from its parameters, its binary read and hash-checked, its emitted source checked against the one that was
compiled (by the emitter digest when this pycutlass's emitter files match the builder's, else by emitting it), and
the binary handed to the session's compiler (``Compiler.adopt``), so loading and launching never compile.

A call is matched to an operation class by what the kernels accept (types, layouts, alignment, epilogue, bias);
among the classes that accept it, the one with the widest accesses wins. Within the class, the shape's own entry
serves it (``exact``), else the nearest entry (``nearest``: log2 distance, N and K weighted over M, so a layer's
other batch sizes come first). ``policy="exact"`` refuses unseen shapes instead.
"""
from __future__ import annotations

import threading
from pathlib import Path

from ..errors import ArgumentError
from ..session import Session, current
from .classes import TORCH, CallClass, CallQuery, Entry, PackClass
from .format import (PackCoverageError, PackFile, PackSourceError, PackTargetError, emitter_digest, sha256)

POLICIES = ("nearest", "exact")


class Pack:
    """A loaded pack (see ``load_pack``). Thread-safe."""

    def __init__(self, path: str | Path, *, session: Session | None = None, policy: str = "nearest"):
        if policy not in POLICIES:
            raise ArgumentError(f"policy is {policy!r}; choose one of {list(POLICIES)}")
        if session is not None and not isinstance(session, Session):
            raise ArgumentError(f"session must be a pycutlass.Session, got {type(session).__name__}")
        self.file = PackFile(path)
        self.path = self.file.path
        self.manifest = self.file.manifest
        self.policy = policy
        self.session = session if session is not None else current()
        try:
            self.compute_capability = int(self.manifest["target"]["compute_capability"])
            self.kernels_meta = dict(self.manifest["kernels"])
            self.classes = {name: PackClass(name, CallClass.from_dict(data["call"]),
                                            {e.problem: e for e in map(Entry.from_dict, data["entries"])},
                                            dict(data.get("summary", {})))
                            for name, data in self.manifest["classes"].items()}
        except (KeyError, TypeError, ValueError) as exc:
            from .format import PackDamagedError

            raise PackDamagedError(f"{self.path}: the manifest lacks or misspells {exc}") from None
        self._lock = threading.Lock()
        self._operations: dict = {}  # kernel name -> operation, adopted
        self._checked_devices: set = set()
        self._emitter_matches: bool | None = None
        self._seen: dict = {}  # call signature -> (operation, entry knobs, vector bytes, entry, how)
        self.stats = {"exact": 0, "nearest": 0}

    def __repr__(self) -> str:
        return (f"<Pack {self.path.name}: sm_{self.compute_capability}, {len(self.classes)} classes, "
                f"{len(self.kernels_meta)} kernels>")

    # --- what the pack holds --------------------------------------------------------------------------------------
    def info(self) -> dict:
        """Classes, kernels, shapes covered and efficiencies, as JSON-able data."""
        classes = {}
        for name, found in self.classes.items():
            kernels = sorted({e.kernel for e in found.entries.values() if e.kernel != TORCH})
            measured = {key: value for key, value in found.summary.items() if key not in ("kernels", "problems")}
            classes[name] = {**measured, "kernels": kernels, "problems": len(found.entries),
                             "shapes": ["x".join(map(str, e.problem[:3])) + (f"x{e.problem[3]}" if e.problem[3] > 1
                                                                               else "")
                                        for e in sorted(found.entries.values(), key=lambda e: e.problem)]}
        manifest = self.manifest
        return {"path": str(self.path), "target": f"sm_{self.compute_capability}", "pycutlass": manifest["pycutlass"],
                "cutlass": manifest.get("cutlass"), "created": manifest.get("created"),
                "source": manifest.get("source", {}), "kernels": len(self.kernels_meta), "classes": classes}

    # --- readiness --------------------------------------------------------------------------------------------------
    def check_device(self, device: int) -> None:
        """Refuse a GPU whose architecture cannot run the pack's binaries (once per device)."""
        if device in self._checked_devices:
            return
        from ..compiler.target import detected_compute_capability

        found = detected_compute_capability(device)
        if found is not None:
            self.check_compute_capability(found, f"GPU {device}")
        self._checked_devices.add(device)

    def check_compute_capability(self, found: int, what: str = "this GPU") -> None:
        wanted = self.compute_capability
        sm90 = any(meta["target"].endswith("a") for meta in self.kernels_meta.values())
        # SASS runs on the same major architecture at an equal or higher minor; sm_90a only on 9.0
        if found // 10 != wanted // 10 or found < wanted or (sm90 and found != wanted):
            raise PackTargetError(f"{self.path} holds binaries for sm_{wanted}{'a' if sm90 else ''}; {what} is "
                                  f"sm_{found}, which cannot run them: build the pack with --target {found}")

    def operation(self, name: str):
        """The pack's kernel ``name`` as an operation whose binary is the pack's (made ready on first use)."""
        found = self._operations.get(name)
        if found is not None:
            return found
        with self._lock:
            found = self._operations.get(name)
            if found is None:
                found = self._ready(name)
                self._operations[name] = found
        return found

    def _ready(self, name: str):
        from ..compiler.manager import Compiler
        from ..tune.space import build_operation

        meta = self.kernels_meta.get(name)
        if meta is None:
            raise ArgumentError(f"{self.path} has no kernel {name!r}")
        operation = build_operation(meta["params"])
        if operation.name != name:
            raise PackSourceError(f"{self.path}: the parameters of {name} build {operation.name} with this pycutlass "
                                  f"{_versions(self.manifest)}; build the pack again")
        if self._emitter_matches is None:
            self._emitter_matches = emitter_digest() == self.manifest.get("emitter")
        if not self._emitter_matches and sha256(operation.emit().encode()) != meta["source_sha256"]:
            raise PackSourceError(f"{self.path}: {name} emits a different source with this pycutlass than the one "
                                  f"its binary was compiled from {_versions(self.manifest)}; build the pack again")
        binary = self.file.binary(meta["binary_sha256"], name)
        Compiler.of(self.session).adopt(operation, meta["target"], binary, meta["backend"], meta["kernel_symbol"],
                                        meta["builder_symbol"])
        return operation

    # --- choosing -----------------------------------------------------------------------------------------------------
    def find_class(self, query: CallQuery) -> PackClass | None:
        """The class whose kernels accept ``query`` with the widest accesses, or None."""
        best, best_width = None, -1
        for found in self.classes.values():
            if query.accepts(found.call):
                width = sum(found.call.alignment)
                if width > best_width:
                    best, best_width = found, width
        return best

    def choose(self, query: CallQuery, problem: tuple, *, kernels_only: bool = False
               ) -> tuple[Entry | None, str, PackClass | None]:
        """(entry, "exact" | "nearest" | "uncovered" | "no class", class) for a call of ``problem`` (m, n, k[, batch]).
        An entry's ``kernel`` may be ``"torch"`` (tuning kept torch for that shape) unless ``kernels_only``."""
        problem = tuple(int(v) for v in problem) + ((1,) if len(problem) == 3 else ())
        found = self.find_class(query)
        if found is None:
            return None, "no class", None
        entry, how = found.lookup(problem, self.policy, kernels_only)
        return entry, how, found

    def kernel_for(self, query: CallQuery, problem: tuple):
        """(operation, knobs) serving the call, or raise PackCoverageError saying what the pack holds."""
        entry, how, found = self.choose(query, problem, kernels_only=True)
        if entry is None:
            raise PackCoverageError(self._uncovered(query, problem, how))
        self.stats[how] += 1
        return self.operation(entry.kernel), entry.knobs

    def _uncovered(self, query: CallQuery, problem: tuple, how: str) -> str:
        if how == "uncovered":
            return (f"{self.path.name} has no entry for {'x'.join(map(str, problem))} (policy 'exact'); load it with "
                    f"policy='nearest' to serve unseen shapes from the nearest entry")
        held = "; ".join(f"{c.call.a}/{c.call.a_layout} x {c.call.b}/{c.call.b_layout} -> {c.call.d}, "
                         f"{c.call.epilogue}{', bias ' + c.call.bias if c.call.bias else ''}, alignment "
                         f"{list(c.call.alignment)}" for c in self.classes.values())
        return (f"{self.path.name} holds no kernel for {query.a}/{query.a_layout} x {query.b}/{query.b_layout} -> "
                f"{query.d}, {query.epilogue}{', bias ' + query.bias if query.bias else ''}"
                f"{', reading C' if query.c else ''}, alignment up to {list(query.alignment)}; it holds: {held}")

    # --- running --------------------------------------------------------------------------------------------------
    def gemm(self, a, b, out=None, *, c=None, alpha: float = 1.0, beta: float = 0.0, bias=None, activation=None,
             stream=None):
        """``out = activation(alpha * a @ b + beta * c + bias)`` with the pack's kernel for the call's class and
        shape; returns ``out`` (allocated like ``a`` when not given). ``a``: M x K, ``b``: K x N (torch, cupy or
        numpy; row- or column-major as the pack's classes take them), ``bias``: N values. Device tensors run
        asynchronously on ``stream`` (default: the default stream); host tensors are copied in and out."""
        from .launch import run_gemm

        return run_gemm(self, a, b, out, c, alpha, beta, bias, activation, stream)

    def select(self, a, b, out=None, *, c=None, beta: float = 0.0, bias=None, activation=None):
        """The operation ``gemm`` runs for these arguments (and remembers the choice for the call's signature)."""
        from .launch import _output, resolve

        return resolve(self, a, b, _output(a, b, out), c, c is not None and beta != 0, bias, activation).operation

    def verify(self, *, device: int = 0, progress=None) -> list[dict]:
        """Run every kernel once on GPU ``device`` on one of its shapes (capped) against float64; rows of results."""
        from .verify import verify_pack

        return verify_pack(self, device=device, progress=progress)


def _versions(manifest: dict) -> str:
    from ..tune.db import pycutlass_version

    return f"(pack built by pycutlass {manifest.get('pycutlass')}, this is {pycutlass_version()})"
