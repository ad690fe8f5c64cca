"""Building packs: from a sweep's results database, or from the choices a tuning pass made.

From a results database (any machine, no GPU): per operation class, the minimum kernel set covering the measured
problems at ``min_efficiency`` of each problem's best (``select_per_class``); each problem's entry is the set's
fastest kernel on it, with its time, the per-problem best, the efficiency and the torch baseline's time when the
sweep measured one. Only the selected kernels are compiled, for ``target``.
"""
from __future__ import annotations

import json
import math
import time
from pathlib import Path

from ..errors import ArgumentError
from . import format as pack_format
from .classes import TORCH, CallClass, Entry

GEMM_KINDS = ("gemm", "gemm_sm90")  # what Pack.gemm dispatches


def _geomean(values) -> float | None:
    values = [v for v in values if v and v > 0]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def _rounded(value, digits: int = 4):
    return None if value is None else round(value, digits)


class PackChoice:
    """One (problem, kernel) decision on its way into a pack; ``operation`` None records that torch's own
    implementation serves the problem (a model's tuning found it faster)."""

    def __init__(self, problem: tuple, operation, params: dict | None, knobs: dict | None = None,
                 measured: dict | None = None):
        self.problem, self.operation, self.params = problem, operation, params
        self.knobs, self.measured = dict(knobs or {}), dict(measured or {})

    @property
    def kernel(self) -> str:
        return TORCH if self.operation is None else self.operation.name


def write_pack(out, choices: dict, *, target, source: dict, session=None, jobs: int | None = None,
               progress=None) -> Path:
    """Compile the kernels of ``choices`` (``{op_class: [PackChoice]}``) for ``target`` and write the pack."""
    from ..compiler import toolchain
    from ..compiler.elf import slim_cubin
    from ..compiler.manager import Compiler, parse_target
    from ..session import current
    from ..tune.db import pycutlass_version

    target = parse_target(target)
    if target is None:
        raise ArgumentError("a pack needs a target GPU architecture (e.g. 90): its binaries are SASS for one GPU")
    session = session if session is not None else current()
    choices = {op_class: group for op_class, group in choices.items() if any(c.operation for c in group)}
    operations = list({c.kernel: c.operation for group in choices.values() for c in group if c.operation}.values())
    if not operations:
        raise ArgumentError("nothing to pack: no kernel was chosen")
    compiler = Compiler.of(session)
    for operation in operations:  # refuses e.g. SM90 kernels for sm_80 before anything compiles
        compiler.checked_target(operation, target)
    report = compiler.add_module(operations, target=target, jobs=jobs)
    kernels, binaries = {}, {}
    by_name = {c.kernel: c for group in choices.values() for c in group}
    for operation, compiled in zip(dict.fromkeys(operations), report.kernels):
        binary = slim_cubin(compiled.binary)  # loads in milliseconds (pycutlass.compiler.elf)
        digest = pack_format.sha256(binary)
        binaries[digest] = binary
        kernels[operation.name] = {
            "params": by_name[operation.name].params, "target": compiled.target, "backend": compiled.backend,
            "kernel_symbol": compiled.kernel_symbol, "builder_symbol": compiled.builder_symbol,
            "binary_sha256": digest, "binary_bytes": len(binary), "compiled_sha256": compiled.sha256,
            "source_sha256": pack_format.sha256(operation.emit().encode())}
    classes = {}
    for op_class, group in choices.items():
        # (a problem met twice, e.g. by two layers of one shape, keeps its first decision)
        entries = list({c.problem: Entry(c.problem, c.kernel, c.knobs, c.measured)
                        for c in reversed(group)}.values())
        first = next(c for c in group if c.operation is not None)
        efficiencies = [e.measured.get("efficiency") for e in entries]
        versus_torch = [e.measured.get("vs_torch") for e in entries]
        summary = {"kernels": len({e.kernel for e in entries if e.kernel != TORCH}), "problems": len(entries),
                   "worst_efficiency": _rounded(min((v for v in efficiencies if v), default=None)),
                   "geomean_efficiency": _rounded(_geomean(efficiencies)),
                   "geomean_vs_torch": _rounded(_geomean(versus_torch))}
        classes[op_class] = {"call": CallClass.of(first.operation, first.params).to_dict(),
                             "entries": [e.to_dict() for e in sorted(entries, key=lambda e: e.problem)],
                             "summary": summary}
    toolchains = {}
    for backend in sorted({k["backend"] for k in kernels.values()}):
        try:
            toolchains[backend] = toolchain.fingerprint(backend)
        except Exception as exc:  # informative only
            toolchains[backend] = {"error": str(exc)}
    try:
        cutlass = toolchain.cutlass_version()
    except Exception:  # informative only
        cutlass = None
    manifest = {"format": pack_format.FORMAT, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "pycutlass": pycutlass_version(), "cutlass": cutlass, "emitter": pack_format.emitter_digest(),
                "target": {"compute_capability": target.compute_capability}, "toolchains": toolchains,
                "source": source, "classes": classes, "kernels": kernels}
    return pack_format.write(out, manifest, binaries)


def _one_device(db, sweep: str | None, device: str | None) -> str:
    sql, args = "select distinct device from runs where status = 'ok'", []
    if sweep is not None:
        sql += " and sweep = ?"
        args.append(sweep)
    devices = [row["device"] for row in db.query(sql, args)]
    if device is not None:
        if device not in devices:
            raise ArgumentError(f"no successful run on device {device!r} in {db.path}; its devices: {devices}")
        return device
    if not devices:
        raise ArgumentError(f"{db.path} holds no successful run{f' of sweep {sweep!r}' if sweep else ''}: run the "
                            f"sweep on a GPU first (a --compile-only sweep measures nothing)")
    if len(devices) > 1:
        raise ArgumentError(f"{db.path} holds runs from {len(devices)} devices ({', '.join(devices)}); a pack's "
                            f"choices come from one GPU: pass device= (--device)")
    return devices[0]


def choices_from_db(db, *, min_efficiency: float = 0.97, sweep: str | None = None, device: str | None = None,
                    solver: str = "auto") -> tuple[dict, dict]:
    """``({op_class: [PackChoice]}, source)`` for the GEMM classes a results database measured."""
    from ..tune.bench import element_label
    from ..tune.problems import problem_from_dict
    from ..tune.runner import baseline_name
    from ..tune.select import select_per_class
    from ..tune.space import build_operation

    device = _one_device(db, sweep, device)
    kinds = {row["name"]: row["kind"] for row in db.query("select name, kind from kernels")}
    results = [r for r in db.results(sweep=sweep, device=device) if kinds.get(r[0]) in GEMM_KINDS]
    if not results:
        raise ArgumentError(f"{db.path} holds no measured GEMM kernel (packs dispatch GEMMs)")
    selections = select_per_class(results, min_efficiency, solver=solver)
    rows = db.query("select name, params from kernels")
    params = {row["name"]: json.loads(row["params"] or "null") for row in rows}
    specs = {row["key"]: json.loads(row["spec"]) for row in db.query("select key, spec from problems")}
    seconds = {(r[0], r[1]): r[2] for r in db.results(sweep=sweep, device=device, include_baselines=True)}
    choices, operations = {}, {}
    for op_class, selection in selections.items():
        group = []
        for problem_key, kernel in selection.assignment.items():
            if not params.get(kernel):
                raise ArgumentError(f"{db.path}: kernel {kernel} has no parameters to rebuild it from (it was not "
                                    f"recorded by a sweep of a SearchSpace)")
            operation = operations.get(kernel)
            if operation is None:
                operation = operations[kernel] = build_operation(params[kernel])
            problem = problem_from_dict(specs[problem_key])
            took = seconds[(kernel, problem_key)]
            efficiency = selection.efficiency[problem_key]
            math_inst = operation.tile_description.math_instruction
            torch_seconds = seconds.get((baseline_name(element_label(math_inst.element_a),
                                                       element_label(operation.C.element)), problem_key))
            measured = {"us": _rounded(took * 1e6, 3), "best_us": _rounded(took * efficiency * 1e6, 3),
                        "efficiency": _rounded(efficiency),
                        "torch_us": _rounded(torch_seconds * 1e6, 3) if torch_seconds else None,
                        "vs_torch": _rounded(torch_seconds / took) if torch_seconds else None}
            group.append(PackChoice((problem.m, problem.n, problem.k, problem.batch), operation, params[kernel], {},
                                 measured))
        choices[op_class] = group
    facts = db.query("select * from devices where id = ?", [device])
    source = {"from": "results database", "database": Path(db.path).name, "sweep": sweep,
              "min_efficiency": min_efficiency, "device": facts[0] if facts else {"id": device}}
    return choices, source


def build_pack(db, out, *, target, min_efficiency: float = 0.97, sweep: str | None = None, device: str | None = None,
               session=None, jobs: int | None = None, solver: str = "auto") -> Path:
    """Select, compile and pack a results database's kernels (see the module's docstring); returns the path."""
    from ..tune.db import ResultsDB

    opened = db if isinstance(db, ResultsDB) else ResultsDB(db, read_only=True)
    try:
        choices, source = choices_from_db(opened, min_efficiency=min_efficiency, sweep=sweep, device=device,
                                          solver=solver)
    finally:
        if opened is not db:
            opened.close()
    return write_pack(out, choices, target=target, source=source, session=session, jobs=jobs)
