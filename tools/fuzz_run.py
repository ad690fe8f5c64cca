"""Run what the descriptions accept on a GPU: draw random GEMM and conv2d configurations (tools/fuzz_accept.py's
drawing, deterministic by --seed), keep the accepted ones, compile them all in parallel into the cache, then run
each configuration's cases in its own subprocess (several at once, sharing the GPU) on random problem sizes against a
float64 reference with NaN-poisoned outputs. A configuration that kills its process (CUDA_ERROR_ILLEGAL_ADDRESS, a
signal) or hangs is recorded against itself alone: the other configurations run in other CUDA contexts.

    # the full run (GPU host; 16 cores): GEMM Sm80-family / SM90 and conv Sm80-family / SM90
    PYCUTLASS_CACHE_DIR=/tmp/fuzzcache python tools/fuzz_run.py --sm80 48 --sm90 32 --conv80 32 --conv90 16 \\
        --seed 3 --jobs 16 --parallel 8 --timeout 120 --out fuzz-run.jsonl 2>&1 | tee fuzz-run.log
    # what would be drawn (no compile, no GPU): one line per configuration, each rebuilt and checked
    python tools/fuzz_run.py --sm80 48 --sm90 32 --conv80 32 --conv90 16 --seed 3 --dry-run
    # compile the same draw here (no GPU) for an H100 host, so that its run loads instead of compiling: carry the
    # cache there (xz took a 38.5 MB one, 64 operations, to 3.4 MB) and point PYCUTLASS_CACHE_DIR at it
    PYCUTLASS_CACHE_DIR=.gpucache python tools/fuzz_run.py --sm80 48 --sm90 32 --conv80 32 --conv90 16 \\
        --seed 3 --jobs 2 --compile-only --arch 90
    # rerun one configuration in this process (a "cfg" object, or a whole JSONL record: then its exact problem
    # size and data seed), optionally under compute-sanitizer's memcheck
    PYCUTLASS_CACHE_DIR=/tmp/fuzzcache python tools/fuzz_run.py --config "$(sed -n 17p fuzz-run.jsonl)" --sanitize
    # every child under compute-sanitizer (slow: the timeout becomes 900 s unless --timeout says otherwise)
    PYCUTLASS_CACHE_DIR=/tmp/fuzzcache python tools/fuzz_run.py ... --sanitize --parallel 4

With --seed 3, --sm80 48 and --sm90 32 draw the GEMM configurations of the first GPU run (docs/known-defects.md;
its illegal address is #11, pycutlass_gemm_sm80_tensorop_f16f16f32_nnn_64x64x32_1x4x1_s4_a224_db881f83d1); the conv
families are drawn after them, and each configuration's problem sizes come from its own seed.

Families: ``gemm80`` (--sm80; nvcc; target the GPU's architecture), ``gemm90`` (--sm90; NVRTC;
sm_90), ``conv80`` (--conv80; nvcc), ``conv90`` (--conv90; NVRTC), ``grouped80`` (--grouped80; GemmOperationGrouped
with an Sm80 tile, either scheduler mode; nvcc) and ``grouped90`` (--grouped90; the SM90 pointer-array kernel, a
per-group bias now and then; NVRTC), ``gemmarray90`` (--array90; ``GemmOperationUniversal(90, ..., array=True)``,
Mode.Array on lists of 1 to 5 matrices; NVRTC), ``evt80`` (--evt80; Sm80-family GEMMs whose epilogue is a random
visitor tree, ``tools/fuzz_accept.py::draw_evt_tree``; NVRTC), ``splitk80`` (--splitk80; parallel split-K: an
Sm80-family GEMM, now and then an NHWC conv2d, writing partial sums with a plain LinearCombination, and the
ReductionOperation that sums them into D with its own epilogue; both nvcc), ``splitk90`` (--splitk90; the same
with an SM90 GEMM producer, GemmSplitKParallel's L mode over equal K slices; both NVRTC), ``moe90`` (--moe90; SM90
grouped GEMMs with the group sizes in a device tensor: packed tokens or the masked layout, M or (M, N, K) per group,
skewed counts with empty groups, now and then captured in a CUDA graph and replayed with new sizes; NVRTC) and
``scaled90`` (--scaled90; fp8 with block-wise scales, dense or grouped on device sizes, and grouped GEMMs with
row-wise scales on fp8 or 16-bit operands; NVRTC). The parent compiles each
(backend, arch) group with ``add_module(ops, jobs=--jobs)`` (every operation of a configuration: ``fuzz_accept.build_all``; a failing
batch is recompiled one operation at a time, to attribute the failures), then starts ``fuzz_run.py --one '<json>'``
per configuration (``--parallel`` at a time, each with ``--timeout`` seconds). The child rebuilds the operations from
its cfg (``fuzz_accept.build_all``; the names must be the ones the parent compiled), sets the same target arch and
backend, loads them from the same cache (PYCUTLASS_CACHE_DIR is inherited), runs ``--sizes`` problem sizes (an
ArgumentError is recorded as argument-rejected and another size is drawn, up to ``--retries`` times) and prints one
``FUZZ-CASE {json}`` line per case on stdout.

Statuses: ``ok``; ``argument-rejected`` (the operation refused the problem with ArgumentError: not a defect);
defects: ``COMPILE-FAIL``, ``WRONG`` (beyond the tolerance, or NaN poison left), ``ERROR`` (an exception in the
child, e.g. a CUDA error: the child stops there), ``CRASH`` (the child died: signal, nonzero exit, or no JSON; with
its stderr tail and the problem it was running), ``HANG`` (killed after --timeout), ``MEMCHECK`` (--sanitize:
compute-sanitizer reported errors). The JSONL (--out) holds one record per case; a summary table and one line per
defect configuration end the log.

References: GEMMs use the GPU suite's ``tests/gpu/test_gemm_sm90.py::run_case`` (float64 numpy reference), convs
``tests/gpu/test_conv2d.py::run_conv`` (float64 torch reference ``conv_reference``; it serves SM90 operations too:
``Conv2dArguments`` hands them the SM90 arguments class, and their fused bias is C as a vector with beta = 1),
grouped GEMMs ``run_grouped`` (1 to 12 groups, some with M, N or K = 0, each against its float64 reference),
parallel split-K ``run_splitk`` (2 to 5 slices, then the reduction; the GPU suites' operands and references). The
tolerance is this script's (``tolerance``, recorded per case): from the operand type and math operation, the
accumulator, the output type, a float16 epilogue compute type and the approximate activations. Not run: interleaved
int8 layouts (GEMM ColumnMajorInterleaved32, conv TensorNC32HW32 / TensorC32RSK32: the runners have no reference for
them) and GEMMs with FastLinearCombinationClamp (exact only for K <= 256; convs with it run, larger K is refused with
ArgumentError).
"""
from __future__ import annotations

import argparse
import collections
import concurrent.futures
import functools
import json
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from math import lcm
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import fuzz_accept  # noqa: E402

import pycutlass as cutlass  # noqa: E402

CASE_MARK = "FUZZ-CASE "    # a case's JSON record on the child's stdout
START_MARK = "FUZZ-START "  # the problem a child is about to run (so a crash or hang can name it)
DONE_MARK = "FUZZ-DONE"     # the child finished its cases (what follows is teardown)
DEFECTS = ("COMPILE-FAIL", "WRONG", "ERROR", "CRASH", "HANG", "MEMCHECK")
STATUSES = ("ok", "argument-rejected") + DEFECTS
FAMILIES = ("gemm80", "gemm90", "conv80", "conv90", "grouped80", "grouped90", "gemmarray90",
            "evt80", "splitk80", "splitk90", "moe90", "scaled90")  # drawn in this order
D = cutlass.DataType


# --- drawing (parent) ---------------------------------------------------------------------------------------------
def runnable(cfg) -> bool:
    """What the runners' references model: no interleaved layouts; for GEMMs no FastLinearCombinationClamp."""
    layouts = "".join(cfg["layouts"])
    if "Interleaved" in layouts or "32" in layouts:  # ColumnMajorInterleaved32, TensorNC32HW32, TensorC32RSK32
        return False
    return cfg["family"].startswith("conv") or cfg["epilogue"] != "FastLinearCombinationClamp"


@functools.lru_cache(maxsize=None)
def _gpu_arch() -> int | None:
    from pycutlass.compiler.target import detected_compute_capability

    return detected_compute_capability(0)


def target_of(cfg, arch: int | None = None) -> tuple[str, int]:
    """(backend, arch) the parent compiles a configuration with, and its child loads it with: the GPU's own
    architecture, since the child's arguments load the binary for their device (SASS does not run across major
    architectures: an sm_80 binary would be compiled again for an H100 in the child, against its timeout), or
    ``arch`` where given (--arch: compiling here for a GPU host), or on a machine without a GPU (--dry-run) the
    drawn compute capability's."""
    nvrtc = cfg["family"].endswith("90") or cfg["family"] == "evt80"  # visitor trees: the EVT suite's backend
    arch = 90 if cfg["cc"] == 90 else (arch or _gpu_arch() or 80)
    return ("nvrtc" if nvrtc else "nvcc"), arch


def accepted(rng, family, count, tries=20000):
    found, seen = [], set()
    for _ in range(tries if count else 0):
        cfg, op, _ = fuzz_accept.draw(rng, family)
        key = (op.name, json.dumps(cfg.get("reduction"), sort_keys=True)) if op is not None else None
        if op is not None and runnable(cfg) and key not in seen:  # (a split-K pair is new if its reduction is)
            seen.add(key)
            found.append((cfg, op))
            if len(found) == count:
                break
    return found


def draw_plan(seed, counts, arch: int | None = None):
    """[(entry, op)]: entry = {index, family, backend, arch, name, seed, cfg} (and ``companions``, the names of the
    operations that run after ``op``: a split-K reduction). The families are drawn in FAMILIES' order from one
    Random(seed) (so --sm80/--sm90 with the same seed draw the GEMMs earlier runs drew), then each configuration gets
    the seed of its cases."""
    rng = random.Random(seed)
    drawn = [(family, cfg, op) for family in FAMILIES for cfg, op in accepted(rng, family, counts.get(family, 0))]
    plan = []
    for index, (family, cfg, op) in enumerate(drawn):
        backend, target = target_of(cfg, arch)
        entry = dict(index=index, family=family, backend=backend, arch=target, name=op.name,
                     seed=rng.randint(0, 2**31 - 1), cfg=cfg)
        companions = fuzz_accept.companions(cfg)
        if companions:
            entry["companions"] = [companion.name for companion in companions]
        plan.append((entry, op))
    return plan


def entry_names(entry) -> list:
    """The names of every operation an entry compiles and runs, its main one first."""
    return [entry["name"]] + entry.get("companions", [])


def select(backend, arch):
    cutlass.compiler.nvrtc() if backend == "nvrtc" else cutlass.compiler.nvcc()
    cutlass.compiler.set_target_arch(arch)


def compile_all(plan, jobs):
    """{name: error text} of the operations that do not compile; the others are in the cache."""
    groups = collections.defaultdict(list)
    for entry, op in plan:
        groups[(entry["backend"], entry["arch"])] += [op] + fuzz_accept.companions(entry["cfg"])
    failed = {}
    for (backend, arch), ops in groups.items():
        start = time.perf_counter()
        select(backend, arch)
        before = len(failed)
        try:
            cutlass.compiler.add_module(ops, jobs=jobs)
        except Exception as error:  # noqa: BLE001  (CompilationError, or anything else the batch raised)
            print(f"  the batch failed ({type(error).__name__}); compiling one at a time", flush=True)
            for op in ops:  # which ones
                try:
                    cutlass.compiler.add_module([op])
                except cutlass.CompilationError as error:
                    failed[op.name] = fuzz_accept._error_summary(error)[-1500:]
                except Exception as error:  # noqa: BLE001
                    failed[op.name] = f"{type(error).__name__}: {str(error)[-1500:]}"
        print(f"compile {backend} sm_{arch}: {len(ops)} operations in {time.perf_counter() - start:.0f} s, "
              f"{len(failed) - before} failed", flush=True)
    return failed


# --- checking (child) ---------------------------------------------------------------------------------------------
_APPROXIMATE = ("tanh", "sigmoid", "silu", "gelu", "gelu_taylor", "hardswish")


def tolerance(op) -> float:
    """Relative (Frobenius) error a correct kernel stays below, for float outputs."""
    math = op.tile_description.math_instruction
    operand, acc, out = math.element_a, math.element_accumulator, op.C.element
    functor = op.epilogue_functor
    if operand is D.float64:
        tol = 1e-12
    elif operand is D.tfloat32:
        tol = 5e-3
    elif operand is D.float32 and math.opcode_class is cutlass.OpClass.TensorOp:
        tol = {"multiply_add_fast_f32": 1e-4, "multiply_add_fast_bf16": 2e-2}.get(math.math_operation.name, 5e-3)
    else:  # f32 SIMT; f16 / bf16 / int8 / fp8 values are exact in the accumulator
        tol = 1e-5
    if acc is D.float16:
        tol = max(tol, 1e-2)
    # The operation's resolved schedule: Auto picks the FP8FastAccum form for fp8 (the description still says Auto).
    schedule = getattr(op, "kernel_schedule", None) or getattr(op.tile_description, "kernel_schedule", None)
    if operand.is_fp8:
        # wgmma sums fp8 products in a narrower accumulator (about 14 bits) between promotions to f32 registers:
        # 0.4-1.2e-4 measured with the promoting main loop on K <= 512 (fuzz seed 53)
        tol = max(tol, 5e-4)
    if schedule is not None and "FP8FastAccum" in schedule.name:
        tol = max(tol, 1e-3)  # fp8 fast accumulation skips the periodic promotion to full f32 sums (by design)
    tol = max(tol, {D.float16: 2e-3, D.bfloat16: 2e-2, D.float8_e4m3: 8e-2, D.float8_e5m2: 1.5e-1}.get(out, 0.0))
    compute = getattr(functor, "element_epilogue", None)
    if compute is D.float16 and acc is not D.float16:
        tol = max(tol, 4e-3)
    if compute is D.bfloat16:
        tol = max(tol, 1.5e-2)  # alpha * acc + beta * C rounded to 8 significant bits
    activation = getattr(functor, "activation", None)
    if activation is not None and activation.name in _APPROXIMATE and compute is not D.float64:
        tol = max(tol, 2e-3)  # CUTLASS's fast tanh / exp approximations
    return tol


def splitk_tolerance(op, reduction) -> float:
    """A parallel split-K pair: the producer's tolerance (its math, the partials' type, its epilogue's compute type),
    then what the reduction adds: float16 partials rounded before the sum (then the output again), a 16-bit
    accumulator, its output type, a float16 compute type and the approximate activations."""
    tol = tolerance(op)
    if op.C.element is D.float16:
        tol = max(tol, 3e-3)
    if reduction.element_accumulator.bits == 16:
        tol = max(tol, 1e-2)
    tol = max(tol, {D.float16: 2e-3, D.bfloat16: 2e-2}.get(reduction.C.element, 0.0))
    functor = reduction.epilogue_functor
    if functor.element_epilogue is D.float16:
        tol = max(tol, 4e-3)
    if functor.element_epilogue is D.bfloat16:
        tol = max(tol, 1.5e-2)
    if functor.activation is not None and functor.activation.name in _APPROXIMATE and \
            functor.element_epilogue is not D.float64:
        tol = max(tol, 2e-3)
    return tol


class Measured:
    """What the last check measured (recorded with the case); ``checked``: the comparison was reached (an
    AssertionError before it is an ERROR, not a WRONG result)."""
    error = None
    tolerance = None
    checked = False


def check(op, got, reference, tol=None):
    """Integers: equal to the rounded, saturated reference within 1 (float epilogue math ties), more for a 16-bit
    epilogue; floats: relative error below ``tolerance(op)`` and no NaN poison left."""
    import numpy as np

    Measured.checked = True
    got = np.asarray(got, dtype=np.float64)
    reference = np.asarray(reference, dtype=np.float64)
    assert got.shape == reference.shape, f"shape {got.shape} != reference {reference.shape}"
    out = op.C.element
    if out.is_integer:
        info = np.iinfo(np.int8 if out is D.int8 else np.int32)
        expected = np.clip(np.rint(reference), info.min, info.max)
        compute = op.epilogue_functor.element_epilogue  # a 16-bit epilogue rounds: 4x its unit roundoff as slack
        limit = 1.0 + np.abs(expected) * {D.float16: 2.0**-9, D.bfloat16: 2.0**-6}.get(compute, 0.0)
        diff = np.abs(got - expected)
        Measured.error, Measured.tolerance = float(diff.max(initial=0.0)), 1.0
        assert np.all(np.isfinite(got)) and np.all(diff <= limit), f"max |difference| {diff.max(initial=0)}"
        return
    from tests.gpu.conftest import relative_error

    Measured.error, Measured.tolerance = relative_error(got, reference), tol or tolerance(op)
    assert Measured.error < Measured.tolerance, \
        f"relative error {Measured.error:.3e} (tolerance {Measured.tolerance:.1e})"


# --- running (child) ----------------------------------------------------------------------------------------------
def _suites():
    from tests.gpu import test_conv2d as conv_suite
    from tests.gpu import test_gemm_sm90 as gemm_suite  # the GPU suites' runners and float64 references

    gemm_suite.TORCH.setdefault(D.float64, "float64")  # (that suite has no f64: the Sm80 family does)
    gemm_suite.TOLERANCE.setdefault(D.float64, 1e-12)
    gemm_suite._check = check  # run_case and run_conv look these up at call time: our tolerances, measured
    conv_suite.assert_close = lambda op, got, reference, tol=None: check(op, got, reference)
    return gemm_suite, conv_suite


def _alpha_beta(out, functor=None):
    """alpha and beta the runners pass: exact for integer outputs (int8 within its range), ordinary otherwise;
    integers for an epilogue computing in int32."""
    if functor is not None and functor.element_epilogue.is_integer:
        return (1.0, 1.0) if out is D.int32 else (1.0, -1.0)
    return (1.0, 1.0) if out is D.int32 else (0.25, 1.0) if out is D.int8 else (1.25, -0.5)


def _activation_args(cfg):
    return (0.1,) if cfg["epilogue"] == "LinearCombinationGeneric" and cfg["activation"] == "leaky_relu" else ()


_NUMPY_TYPES = (D.float16, D.float32, D.tfloat32, D.float64, D.int8, D.int32)  # numpy and cupy have no bf16 or fp8


def _gemm_size_multiples(cfg, op) -> dict:
    """{dimension: what its size must be a multiple of}: each operand's contiguous dimension by its alignment
    (SM90: by 16 bytes as well, which TMA needs)."""
    row = cutlass.RowMajor
    need = {"m": 1, "n": 1, "k": 1}
    for desc, contiguous in ((op.A, "k" if op.A.layout is row else "m"), (op.B, "n" if op.B.layout is row else "k"),
                             (op.C, "n" if op.C.layout is row else "m")):
        alignment = desc.alignment
        if cfg["family"].endswith("90"):
            alignment = max(alignment, 128 // desc.element.bits)
        need[contiguous] = lcm(need[contiguous], alignment)
    return need


def draw_gemm_problem(cfg, op, rng, attempt):
    """Sizes that are multiples of 16 or, half the time, any size the alignments allow (now and then 1 to 8); now
    and then a batch (L of 2 or 3), serial split-K (Sm80 family), stream-K's runtime knobs (an SM90 stream-K
    operation), raster order / swizzle / SM count (SM90), or numpy / cupy operands in place of torch. Later attempts
    draw multiples of 16 without extras."""
    if attempt >= 2:
        plain = dict(m=rng.randint(1, 24) * 16, n=rng.randint(1, 24) * 16, k=rng.randint(1, 24) * 16)
        return {**plain, "array": 2} if cfg.get("array") else plain
    sm90 = cfg["family"] == "gemm90"
    if rng.random() < 0.5:
        need = _gemm_size_multiples(cfg, op)
        sizes = {}
        for dim in "mnk":
            size = rng.randint(1, 8) if rng.random() < 0.2 else rng.randint(1, 400)
            sizes[dim] = -(-size // need[dim]) * need[dim]
        problem = sizes
    else:
        problem = dict(m=rng.randint(1, 24) * 16, n=rng.randint(1, 24) * 16, k=rng.randint(1, 24) * 16)
    if cfg.get("array"):  # the pointer-array kernel: lists of matrices (Mode.Array)
        problem["array"] = rng.choice([1, 2, 3, 5])
        return problem
    knobs = {}
    roll = rng.random()
    if roll < 0.2:
        problem["batch"] = rng.choice([2, 3])
    elif roll < 0.4 and not sm90:
        knobs["split_k_slices"] = rng.choice([2, 3, 5])
    elif roll < 0.6 and sm90 and cfg["tile_scheduler"] == "StreamK":
        knobs.update(rng.choice([{"split_k_slices": 2, "decomposition": "split_k"}, {"split_k_slices": 3},
                                 {"decomposition": "stream_k"}, {"decomposition": "data_parallel"}]))
    if sm90 and rng.random() < 0.3:
        cluster = cfg["cluster"][0] * cfg["cluster"][1]  # sm_count counts whole clusters (else argument-rejected)
        knobs.update(raster_order=rng.choice(["heuristic", "along_m", "along_n"]), swizzle=rng.choice([1, 2, 4, 8]),
                     sm_count=rng.choice([None, 1, 7, 66]) if rng.random() < 0.2 else
                     rng.choice([None, cluster, 7 * cluster, 33 * cluster]))
    if knobs:
        problem["knobs"] = knobs
    elif "batch" not in problem and not cfg.get("bias") and rng.random() < 0.25 and \
            all(desc.element in _NUMPY_TYPES for desc in (op.A, op.B, op.C)):
        problem["lib"] = rng.choice(["numpy", "cupy"])
    return problem


def _round_up(size, multiple):
    return -(-size // multiple) * multiple


def draw_splitk_problem(cfg, op, rng, attempt):
    """Parallel split-K: 2 to 5 slices, the workspace handed to the reduction as the producer's arguments or as their
    ``ptr_D``, and a problem within the producer's alignments whose reduced contiguous extent (N of a row-major D, M
    of a column-major one; a conv's output channels) is a multiple of the reduction's count. GEMMs: K up to 1024
    (the long K split-K is for; 400 with a float16 accumulator), now and then tiny sizes; later attempts multiples
    of 16."""
    count = cfg["reduction"]["c_align"]
    split = dict(slices=rng.randint(2, 5), workspace=rng.choice(["arguments", "ptr_D"]))
    if cfg["producer"] == "conv80":
        conv = draw_problem(dict(cfg, family="conv80"), op, rng, attempt)
        conv.pop("lib", None)  # torch operands only
        channels = "k" if cfg["conv_kind"] == "fprop" else "c"  # the implicit GEMM's N: K, C, or R*S*C (wgrad)
        conv[channels] = _round_up(conv[channels], count)
        return dict(conv, split_k=split["slices"], workspace=split["workspace"])
    need = _gemm_size_multiples(dict(cfg, family=cfg["producer"]), op)
    contiguous = "n" if cfg["reduction"]["layout"] == "RowMajor" else "m"
    need[contiguous] = lcm(need[contiguous], count)
    if attempt >= 2:
        need = {dim: lcm(multiple, 16) for dim, multiple in need.items()}
    sizes = {}
    for dim, top in (("m", 320), ("n", 320), ("k", 400 if cfg["acc"] == "float16" else 1024)):
        size = rng.randint(1, 8) if rng.random() < 0.15 else rng.randint(1, top)
        sizes[dim] = _round_up(size, need[dim])
    if cfg["producer"] == "gemm90":  # the L mode: equal K slices, each starting where TMA can (need["k"])
        sizes["k"] = _round_up(-(-sizes["k"] // split["slices"]), need["k"]) * split["slices"]
    return dict(sizes, **split)


def _skewed_counts(rng, groups, total, empty, capacity=None):
    """M per group summing to at most ``total``: lognormal weights (an MoE router's skew), ``empty`` groups at 0;
    each at most ``capacity`` where given (the masked layout's slabs)."""
    weights = [rng.lognormvariate(0.0, 1.0) for _ in range(groups)]
    for index in rng.sample(range(groups), min(empty, groups)):
        weights[index] = 0.0
    whole = sum(weights) or 1.0
    return [min(int(total * w / whole), capacity or total) for w in weights]


def _group_sizes(rng, counts, n, k, need, columns):
    """(groups,) M only, or (groups, 3) rows of M and each group's own N <= n and K <= k (multiples of what the
    alignments need, now and then 0)."""
    if columns == 1:
        return list(counts)
    rows = []
    for m in counts:
        n_g = n if rng.random() < 0.5 else _round_up(rng.randint(0, n), need["n"]) if n else 0
        k_g = k if rng.random() < 0.5 else _round_up(rng.randint(0, k), need["k"]) if k else 0
        rows.append([m, min(n_g, n), min(k_g, k)])
    return rows


def draw_moe_problem(cfg, op, rng, attempt, columns=None):
    """Group sizes on the device (the MoE layouts): packed tokens (one A of ``rows`` x K, each group's rows after the
    previous group's) or the masked layout (each group a slab of ``capacity`` rows); (groups,) M or (groups, 3) sizes;
    skewed counts with empty groups; now and then captured in a CUDA graph and replayed with new sizes."""
    need = _gemm_size_multiples(cfg, op)
    groups = rng.choice([1, 2, 3, 5, 8, 16, 33, 64])
    n, k = (_round_up(rng.randint(1, 320), need[dim]) for dim in "nk")
    columns = columns or (1 if rng.random() < 0.6 else 3)
    layout = rng.choice(["packed", "masked"])
    problem = dict(layout=layout, groups=groups, n=n, k=k)
    if layout == "packed":
        problem.update(rows=rng.randint(1, 1500), with_c=rng.random() < 0.7)
        total = problem["rows"]
    else:
        problem["capacity"] = rng.randint(1, 200)
        total = groups * problem["capacity"]

    def draw_sizes():
        counts = _skewed_counts(rng, groups, rng.randint(0, total), rng.randint(0, groups // 3),
                                problem.get("capacity"))
        return _group_sizes(rng, counts, n, k, need, columns)

    problem["sizes"] = draw_sizes()
    if attempt < 2 and rng.random() < 0.4:
        problem["replay"] = draw_sizes()
    return problem


def draw_scaled_problem(cfg, op, rng, attempt):
    """Block-wise (dense): M, N, K within the alignments, K and N often over several 128-blocks and ending in a
    partial one; grouped block-wise: device sizes as the MoE layouts (packed or masked); grouped row-wise: host
    sizes, packed scale vectors or lists of them."""
    need = _gemm_size_multiples(cfg, op)
    form = cfg["form"]
    if form == "blockwise":
        m, n = (_round_up(rng.randint(1, 600), need[dim]) for dim in "mn")
        k = _round_up(rng.randint(1, 1100), need["k"])
        return dict(m=m, n=n, k=k, alpha=round(rng.uniform(0.5, 2.0), 3), beta=rng.choice([0.0, -0.5, 1.0]))
    if form == "grouped_blockwise":
        groups = rng.choice([1, 2, 3, 5, 8, 16, 33])
        n, k = _round_up(rng.randint(1, 400), need["n"]), _round_up(rng.randint(1, 700), need["k"])
        masked = rng.random() < 0.4
        rows = rng.randint(1, 200) if masked else rng.randint(1, 1500)
        counts = _skewed_counts(rng, groups, groups * rows if masked else rows, rng.randint(0, groups // 3),
                                rows if masked else None)
        return dict(groups=groups, n=n, k=k, rows=rows, masked=masked,
                    sizes=_group_sizes(rng, counts, n, k, need, 1 if rng.random() < 0.6 else 3),
                    alpha=round(rng.uniform(0.5, 2.0), 3), beta=rng.choice([0.0, 0.0, -0.5, 1.25]))
    row = cutlass.RowMajor
    if op.A.layout is row and op.C.layout is row and rng.random() < 0.5:  # counts and scales on the device
        return dict(draw_moe_problem(cfg, op, rng, attempt, columns=1), scale_form="device")
    problem = draw_problem(dict(cfg, family="grouped90"), op, rng, attempt)
    problem["scale_form"] = rng.choice(["packed", "lists"])
    return problem


def draw_problem(cfg, op, rng, attempt):
    """A random problem within what the operation's alignments allow (later attempts: stride and dilation 1)."""
    if cfg["family"] in ("splitk80", "splitk90"):
        return draw_splitk_problem(cfg, op, rng, attempt)
    if cfg["family"] == "moe90":
        return draw_moe_problem(cfg, op, rng, attempt)
    if cfg["family"] == "scaled90":
        return draw_scaled_problem(cfg, op, rng, attempt)
    if cfg["family"].startswith("gemm"):
        return draw_gemm_problem(cfg, op, rng, attempt)
    if cfg["family"] == "evt80":  # N a multiple of C's alignment, K of A's and B's; now and then a batch or numpy
        need = _gemm_size_multiples(cfg, op)
        problem = {dim: -(-rng.randint(1, 320) // need[dim]) * need[dim] for dim in "mn"}
        problem["k"] = -(-rng.randint(1, 96) // need["k"]) * need["k"]  # small K: integer values stay exact
        if attempt < 2 and rng.random() < 0.25:
            problem["batch"] = rng.choice([2, 3])
        elif attempt < 2 and rng.random() < 0.2:
            problem["lib"] = "numpy"
        return problem
    if cfg["family"].startswith("grouped"):
        # 1..12 groups, multiples of 16 or (half the time, early attempts) any size the alignments allow, now and then
        # an empty M, N or K
        need = _gemm_size_multiples(cfg, op) if attempt < 2 and rng.random() < 0.5 else dict(m=16, n=16, k=16)
        groups = []
        for _ in range(rng.randint(1, 12)):
            size = [-(-rng.randint(1, 320) // need[dim]) * need[dim] for dim in "mnk"]
            if rng.random() < 0.15:
                size[rng.randrange(3)] = 0
            groups.append(size)
        return dict(groups=groups)
    sm90 = cfg["family"] == "conv90"
    align = max(op.A.alignment, op.B.alignment, op.C.alignment, 8 if sm90 else 1)
    kind, algorithm = cfg["conv_kind"], cfg["algorithm"]
    big = rng.random() < 0.25  # now and then channels over several tiles
    channels, extent = (136, 40) if big else (40, 20)
    if algorithm == "fixed_channels":
        c = op.A.alignment
    elif algorithm == "few_channels":
        c = align * rng.randint(1, 3)
    else:
        c = align * rng.randint(1, max(2, channels // align))
    k = align * rng.randint(1, max(2, channels // align))
    r, s = rng.choice([1, 1, 2, 3, 3, 5]), rng.choice([1, 1, 2, 3, 3, 5])
    safe = attempt >= 2
    stride = [1, 1] if safe else [rng.choice([1, 1, 2, 3]) for _ in range(2)]
    dilation = [1, 1] if safe else [rng.choice([1, 1, 1, 2]) for _ in range(2)]
    if kind == "dgrad" and (sm90 or cfg["stride_support"] == "Unity"):
        stride = [1, 1]
    if kind == "dgrad" and not sm90 and cfg["stride_support"] == "Strided":
        dilation = [1, 1]  # the strided-dgrad kernel has no dilation
    if kind == "wgrad" and cfg.get("bias"):
        r = s = 1  # a bias vector is C of the 1x1 filter gradient only
    ph, pw = rng.randint(0, min(2, r)), rng.randint(0, min(2, s))
    pad = [ph, ph, pw, pw]
    if kind == "fprop" and rng.random() < 0.3:
        pad = [rng.randint(0, 2) for _ in range(4)]
    n = rng.randint(1, 3)
    h = max(rng.randint(1, extent), dilation[0] * (r - 1) + 1 - pad[0] - pad[1])
    w = max(rng.randint(1, extent), dilation[1] * (s - 1) + 1 - pad[2] - pad[3])
    if getattr(op, "filter_taps", False) and (safe or rng.random() < 0.8):
        # the filter-tap-reuse wgrad computes 3x3, stride-1 problems with channels in 64s: mostly draw those
        c, k, r, s, stride, dilation = 64 * rng.randint(1, 3), 64 * rng.randint(1, 3), 3, 3, [1, 1], [1, 1]
        ph, pw = rng.randint(0, 3), rng.randint(0, 3)
        pad = [ph, ph, pw, pw]  # the reference (tests/gpu/test_conv2d.py) pads dgrad and wgrad symmetrically
        w = rng.choice([rng.randint(1, 20), rng.randint(50, 140)])  # rows of one and of several 64-pixel segments
        h = rng.randint(1, 24)
        h, w = max(h, 3 - pad[0] - pad[1]), max(w, 3 - pad[2] - pad[3])
    problem = dict(n=n, h=h, w=w, c=c, k=k, r=r, s=s, pad=pad, stride=stride, dilation=dilation)
    if not safe and not sm90 and rng.random() < 0.25:  # serial split-K (the kernel reduces through semaphores)
        problem["split_k"] = rng.choice([2, 3])
    if not safe and not cfg.get("bias") and rng.random() < 0.2 and \
            all(desc.element in _NUMPY_TYPES for desc in (op.A, op.B, op.C)):
        problem["lib"] = "numpy"
    return problem


def run_grouped(cfg, op, problem, seed):
    """Every group against its float64 reference (tests/gpu/test_gemm_grouped.py's operands, NaN-poisoned D), the
    per-group bias added before the activation as the SM90 kernel does."""
    from tests.gpu.gemm_cases import epilogue_reference, random_values, to_float64, to_tensor
    from tests.gpu.test_gemm_grouped import Group
    from tests.gpu.test_gemm_grouped import _activation_args as group_activation_args  # what Group passes

    import numpy as np

    out = op.C.element
    alpha, beta = _alpha_beta(out, op.epilogue_functor)
    group = Group(op, problem["groups"], seed=seed)
    kwargs, bias = {}, None
    if cfg.get("bias"):
        rng = np.random.default_rng(seed + 1)
        bias = [random_values(rng, (n,), out) for m, n, k in group.problems]
        kwargs["bias"] = [to_tensor(v[None, :], out, cutlass.RowMajor, "torch")[0] for v in bias]
    arguments = group.arguments(alpha=alpha, beta=beta, **kwargs)
    op.run(arguments)
    arguments.sync()
    for index, ((m, n, k), a, b, c, Dt) in enumerate(zip(group.problems, group.a, group.b, group.c, group.Ds)):
        if m == 0 or n == 0:
            continue
        accumulator = alpha * (a @ b) + (bias[index][None, :] if bias is not None else 0.0)
        check(op, to_float64(Dt), epilogue_reference(op, accumulator, c, 1.0, beta, group_activation_args(op)))


def run_gemm_lib(cfg, op, problem, seed):
    """One GEMM on numpy or cupy operands (D NaN-poisoned) against its float64 reference."""
    from tests.gpu.test_gemm import run_gemm

    if problem["lib"] == "cupy":
        try:
            import cupy  # noqa: F401
        except ImportError:
            raise cutlass.ArgumentError("cupy is not installed here") from None  # recorded as not run
    out = op.C.element
    alpha, beta = _alpha_beta(out, op.epilogue_functor)
    got, reference = run_gemm(op, problem["m"], problem["n"], problem["k"], lib=problem["lib"], alpha=alpha,
                              beta=beta, activation_args=_activation_args(cfg), seed=seed)
    check(op, got, reference)


def _gemm_partials(op, reduction, problem, seed, output_op):
    """tests/gpu/test_gemm.py's parallel split-K flow: C and D (the reduction's) passed to GemmArguments too, which
    only take their shapes. Returns (D, A @ B, C) as float64."""
    from pycutlass.gemm import GemmCoord, Mode
    from tests.gpu.gemm_cases import poisoned_output, random_values, to_float64, to_tensor

    import numpy as np

    m, n, k, slices = (problem[key] for key in ("m", "n", "k", "slices"))
    rng = np.random.default_rng(seed)
    a, b = random_values(rng, (m, k), op.A.element), random_values(rng, (k, n), op.B.element)
    out, layout = reduction.C.element, reduction.C.layout
    c = random_values(rng, (m, n), out)
    A, B = to_tensor(a, op.A.element, op.A.layout, "torch"), to_tensor(b, op.B.element, op.B.layout, "torch")
    C, Dt = to_tensor(c, out, layout, "torch"), poisoned_output((m, n), out, layout, "torch")
    arguments = cutlass.GemmArguments(op, GemmCoord(m, n, k), A, B, C, Dt, gemm_mode=Mode.GemmSplitKParallel,
                                      split_k_slices=slices)
    op.run(arguments)
    workspace = arguments if problem["workspace"] == "arguments" else arguments.ptr_D
    reduction_arguments = cutlass.ReductionArguments(reduction, [m, n], slices, workspace, Dt, C, output_op)
    reduction.run(reduction_arguments)
    reduction_arguments.sync()  # (the arguments, and with them the workspace, stay alive up to here)
    return to_float64(Dt), a @ b, c


def _conv_partials(op, reduction, problem, seed, output_op):
    """tests/gpu/test_conv2d.py's parallel split-K flow (C and D belong to the reduction, None for the conv): a
    RowMajor reduction writes the implicit GEMM's M x N row-major views of the channels_last tensors, a TensorNHWC
    one the tensors themselves (wgrad given a bare ``ptr_D``: packed 1-D views, as PyCUTLASS passed them; without
    the producer's problem, ReductionArguments reads a 4-D tensor as N*P*Q x K, not as the filter gradient's
    K x R*S*C). Returns (D, conv(A, B), C) as float64 NHWC."""
    from pycutlass.conv import Operator, SplitKMode
    from tests.gpu import test_conv2d as conv_suite
    from tests.gpu.gemm_cases import random_values

    import numpy as np

    p = problem
    ps = conv_suite.problem(p["n"], p["h"], p["w"], p["c"], p["k"], p["r"], p["s"], tuple(p["pad"]),
                            tuple(p["stride"]), tuple(p["dilation"]), split_k=p["split_k"])
    kind, out = op.conv_kind, reduction.C.element
    rng = np.random.default_rng(seed)
    a = random_values(rng, tuple(ps.tensor_a_extent(kind)), op.A.element)
    b = random_values(rng, tuple(ps.tensor_b_extent(kind)), op.B.element)
    c_extent = tuple(ps.tensor_c_extent(kind))
    c = random_values(rng, c_extent, out)
    A, B = conv_suite.to_lib(a, op.A.element, "torch"), conv_suite.to_lib(b, op.B.element, "torch")
    C, Dt = conv_suite.to_lib(c, out, "torch"), conv_suite.poisoned(c_extent, out, "torch")
    arguments = cutlass.Conv2dArguments(op, ps, A, B, None, None, split_k_mode=SplitKMode.Parallel,
                                        split_k_slices=ps.split_k_slices)
    op.run(arguments)
    m, n = arguments.reduction_problem_size
    destination, source = Dt, C
    if reduction.C.layout is not cutlass.TensorNHWC:
        destination, source = (t.permute(0, 2, 3, 1).reshape(m, n) for t in (Dt, C))  # views of NHWC memory
    elif kind is Operator.wgrad and problem["workspace"] == "ptr_D":
        destination, source = (t.permute(0, 2, 3, 1).reshape(-1) for t in (Dt, C))
    workspace = arguments if problem["workspace"] == "arguments" else arguments.ptr_D
    reduction_arguments = cutlass.ReductionArguments(reduction, [m, n], arguments.split_k_slices, workspace,
                                                     destination, source, output_op,
                                                     partition_stride=arguments.partition_stride)
    reduction.run(reduction_arguments)
    reduction_arguments.sync()
    return conv_suite.from_lib(Dt, "torch"), conv_suite.conv_reference(kind, ps, a, b), c


def splitk_reference(reduction, accumulator, c, alpha, beta, activation_args):
    """D = act(alpha * accumulator + beta * C) in float64, rounded and saturated for integer outputs
    (``epilogue_reference``) and, for LinearCombinationClamp, clamped to a float output's finite range too."""
    from tests.gpu.gemm_cases import epilogue_reference

    import numpy as np
    import torch

    reference = epilogue_reference(reduction, accumulator, c, alpha, beta, activation_args)
    out = reduction.C.element
    if reduction.epilogue_functor.kind == "LinearCombinationClamp" and out.is_float:
        finite = torch.finfo(getattr(torch, out.name)).max
        reference = np.clip(reference, -finite, finite)
    return reference


def run_splitk(cfg, op, problem, seed):
    """Parallel split-K into the producer's workspace, then the reduction (rebuilt from the cfg: the same operation
    the child loaded) into NaN-poisoned D, against the float64 reference with the reduction's epilogue."""
    reduction, = fuzz_accept.companions(cfg)
    alpha, beta = _alpha_beta(reduction.C.element)
    activation_args = _activation_args(cfg["reduction"])
    output_op = reduction.epilogue_type(alpha, beta, *activation_args)
    partials = _conv_partials if cfg["producer"] == "conv80" else _gemm_partials
    got, accumulator, c = partials(op, reduction, problem, seed, output_op)
    reference = splitk_reference(reduction, accumulator, c, alpha, beta, activation_args)
    check(reduction, got, reference, tol=splitk_tolerance(op, reduction))


def _assert_no_size_flags(args):
    """The sizes kernel must flag none of the drawn sizes (every one lies within the bounds and alignments)."""
    flags = args.size_flags()
    assert flags == 0, f"the sizes kernel flagged in-bounds sizes: {flags:#x}"


def run_moe(cfg, op, problem, seed):
    """Device-side sizes (tests/gpu/test_gemm_grouped_sm90.py's Packed and Masked: NaN-poisoned D with guard rows,
    every group's rows against float64, nothing written elsewhere); with ``replay``, the run captured once in a CUDA
    graph and replayed with the drawn sizes and then new ones written in place."""
    import numpy as np
    import torch

    from tests.gpu.test_gemm_grouped_sm90 import Masked, Packed, _device_sizes

    p = problem
    bias = op.bias is not None
    if p["layout"] == "packed":
        data = Packed(op, p["groups"], p["rows"], p["n"], p["k"], seed=seed, with_c=p["with_c"], bias=bias)
    else:
        data = Masked(op, p["groups"], p["capacity"], p["n"], p["k"], seed=seed, bias=bias)
    alpha, beta = _alpha_beta(op.C.element, op.epilogue_functor)
    sizes = _device_sizes(p["sizes"])
    stream = torch.cuda.Stream() if p.get("replay") else None
    args = data.arguments(sizes, alpha=alpha, beta=beta, **({"stream": stream} if stream else {}))
    tol = tolerance(op)

    def check_sizes(values):
        Measured.checked, Measured.tolerance = True, tol  # Packed / Masked compare each group against float64
        data.check(values, tol)
        _assert_no_size_flags(args)

    if not p.get("replay"):
        op.run(args)
        args.sync()
        check_sizes(p["sizes"])
        return
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        op.run(args)
    for values in (p["sizes"], p["replay"]):
        sizes.copy_(torch.from_numpy(np.asarray(values, dtype=np.int32)).to(sizes.device))
        data.guarded.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        check_sizes(values)
    del graph


def run_scaled(cfg, op, problem, seed):
    """The GPU suites' runners for scaled fp8 (and row-wise 16-bit) operations, each against float64 of the
    dequantized operands: tests/gpu/test_gemm_sm90_blockwise.py (dense block-wise),
    test_gemm_grouped_sm90_blockwise.py's Experts (grouped block-wise, device sizes) and
    test_gemm_grouped_sm90_fp8.py's run_rowwise (grouped row-wise, host sizes)."""
    import torch

    p = problem
    if cfg["form"] == "blockwise":
        from tests.gpu.test_gemm_sm90_blockwise import TOLERANCES, run_blockwise

        error = run_blockwise(op, p["m"], p["n"], p["k"], seed=seed, alpha=p["alpha"], beta=p["beta"])
        Measured.checked = True
        Measured.error, Measured.tolerance = float(error), TOLERANCES[op.C.element]
        assert error < Measured.tolerance, f"relative error {error:.3e} (tolerance {Measured.tolerance:.1e})"
        return
    if cfg["form"] == "grouped_blockwise":
        from tests.gpu.test_gemm_grouped_sm90_blockwise import Experts

        experts = Experts(op, p["groups"], p["rows"], p["n"], p["k"], seed=seed, masked=p["masked"])
        sizes = torch.tensor(p["sizes"], dtype=torch.int32, device="cuda")
        args = experts.arguments(sizes, alpha=p["alpha"], beta=p["beta"])
        op.run(args)
        args.sync()
        problems = [(m, p["n"], p["k"]) if isinstance(m, int) else tuple(m) for m in p["sizes"]]
        Measured.checked = True  # Experts.check compares each group against float64, then the NaN poison
        experts.check(problems, alpha=p["alpha"], beta=p["beta"])
        _assert_no_size_flags(args)
        return
    from tests.gpu import test_gemm_grouped_sm90_fp8 as rowwise_suite

    try:
        if p["scale_form"] == "device":  # counts and scales on the device, under a CUDA graph
            args = rowwise_suite.run_rowwise_on_device_counts(
                op, p["layout"], p["groups"], p.get("capacity"), p.get("rows"), p["n"], p["k"],
                [p["sizes"], p.get("replay") or p["sizes"]], seed, tol=tolerance(op))
            Measured.checked = True
            _assert_no_size_flags(args)
        else:
            rowwise_suite.run_rowwise(op, p["scale_form"], [tuple(size) for size in p["groups"]], seed)
    except AssertionError as error:  # its comparisons name the groups or the rows; else it failed before comparing
        Measured.checked = Measured.checked or str(error).startswith(("group ", "a row no group owns"))
        raise


def run_problem(cfg, op, problem, seed):
    """Run one case; raises what the runner raises."""
    gemm_suite, conv_suite = _suites()
    if cfg["family"] in ("splitk80", "splitk90"):
        run_splitk(cfg, op, problem, seed)
        return
    if cfg["family"] == "moe90":
        run_moe(cfg, op, problem, seed)
        return
    if cfg["family"] == "scaled90":
        run_scaled(cfg, op, problem, seed)
        return
    if cfg["family"].startswith("grouped"):
        run_grouped(cfg, op, problem, seed)
        return
    if cfg["family"] == "evt80":  # tests/gpu/test_evt.py's runner: the tree's own float64 __call__ as reference
        from tests.gpu import test_evt as evt_suite

        import numpy as np

        approximate = any(f"{name}.numpy" in cfg["tree"] for name in _APPROXIMATE)

        def check_output(op, got, expected):  # f16 outputs, or fast activation approximations: 2e-3
            check(op, got, expected, tol=2e-3 if np.asarray(got).dtype == np.float16 or approximate else 1e-5)

        evt_suite.run(op, problem["m"], problem["n"], problem["k"], batch=problem.get("batch", 1),
                      lib=problem.get("lib", "torch"), seed=seed, check=check_output)
        return
    if cfg["family"].startswith("gemm"):
        if problem.get("array"):  # lists of matrices (tests/gpu/test_gemm_array_sm90.py's runner)
            from tests.gpu import test_gemm_array_sm90 as array_suite

            array_suite._check = lambda op, got, reference: check(op, got.double().cpu().numpy(), reference)
            array_suite.run_array(op, problem["m"], problem["n"], problem["k"], problem["array"], seed=seed,
                                  activation_args=_activation_args(cfg))
            return
        if problem.get("lib"):  # PyCUTLASS's numpy / cupy operands (tests/gpu/test_gemm.py's runner)
            run_gemm_lib(cfg, op, problem, seed)
            return
        gemm_suite.run_case(op, problem["m"], problem["n"], problem["k"], batch=problem.get("batch", 1), seed=seed,
                            bias=bool(cfg.get("bias")), activation_args=_activation_args(cfg),
                            **problem.get("knobs", {}))
        return
    p = problem
    ps = conv_suite.problem(p["n"], p["h"], p["w"], p["c"], p["k"], p["r"], p["s"], tuple(p["pad"]),
                            tuple(p["stride"]), tuple(p["dilation"]), split_k=p.get("split_k", 1))
    out = op.C.element
    alpha, beta = _alpha_beta(out, op.epilogue_functor)
    bias = None
    if cfg.get("bias"):  # the SM90 fused bias: C is one value per output channel, added once
        bias, beta = "vector", 1.0
    conv_suite.run_conv(op, ps, lib=p.get("lib", "torch"), alpha=alpha, beta=beta, bias=bias,
                        activation_args=_activation_args(cfg), seed=seed)


def run_case(cfg, op, problem, seed):
    """One case as a record: status ok / argument-rejected / WRONG / ERROR."""
    record = dict(problem=problem, case_seed=seed)
    Measured.error = Measured.tolerance = None
    Measured.checked = False
    start = time.perf_counter()
    try:
        run_problem(cfg, op, problem, seed)
        record["status"] = "ok"
    except cutlass.ArgumentError as error:
        record.update(status="argument-rejected", error=str(error)[:400])
    except AssertionError as error:
        if Measured.checked:
            record.update(status="WRONG", error=str(error)[:400])
        else:
            record.update(status="ERROR", error=f"AssertionError before the comparison: {str(error)[:400]}",
                          trace=traceback.format_exc()[-2000:])
    except Exception as error:  # noqa: BLE001
        record.update(status="ERROR", error=f"{type(error).__name__}: {str(error)[:400]}",
                      trace=traceback.format_exc()[-2000:])
    record["seconds"] = round(time.perf_counter() - start, 3)
    if Measured.error is not None:
        record.update(measured=Measured.error, tolerance=Measured.tolerance)
    return record


def prepare(entry, pool=True):
    """The operation of ``entry`` rebuilt, with the backend and target the parent compiled it with (and its
    companions, e.g. a split-K reduction, rebuilt and loaded too)."""
    ops = fuzz_accept.build_all(entry["cfg"])
    if entry.get("name"):
        for built, name in zip(ops, entry_names(entry)):
            if built.name != name:
                raise RuntimeError(f"the cfg rebuilds as {built.name}, not {name} (drawing is not reproducible)")
    op = ops[0]
    select(entry["backend"], entry["arch"])
    cutlass.session.current().set_option("progress", False)
    if entry.get("preload", True):  # from the cache the parent filled; a compile here means a miss (recorded)
        report = cutlass.compiler.add_module(ops)
        entry["child_compiled"] = report.compiled
    if pool:
        cutlass.get_memory_pool(2**26, 2**33)
    return op


def cases(entry, op, emit):
    """Run the entry's cases (or its one recorded problem), handing each record to ``emit``; stop after an ERROR
    (the CUDA context may be gone)."""
    cfg = entry["cfg"]
    if entry.get("problem") is not None:
        plan = [(entry["problem"], entry.get("case_seed", 0))]
        retries = 0
    else:
        rng = random.Random(entry["seed"])
        plan = None
        retries = entry.get("retries", 3)
    for index in range(1 if plan else entry.get("sizes", 2)):
        for attempt in range(retries + 1):
            if plan:
                problem, seed = plan[0]
            else:
                problem, seed = draw_problem(cfg, op, rng, attempt), rng.randint(0, 2**31 - 1)
            print(START_MARK + json.dumps(dict(problem=problem, case_seed=seed)), flush=True)
            record = run_case(cfg, op, problem, seed)
            emit(record)
            if record["status"] == "ERROR":
                return
            if record["status"] != "argument-rejected":
                break


def child_main(payload: str) -> None:
    """``--one``: one configuration's cases, one FUZZ-CASE line each; leaves with os._exit (no teardown of a CUDA
    context a kernel may have broken)."""
    entry = json.loads(payload)

    def emit(record):
        if entry.get("child_compiled"):
            record["child_compiled"] = entry["child_compiled"]  # not found in the cache: compiled by the child
        print(CASE_MARK + json.dumps(record), flush=True)

    try:
        print(START_MARK + json.dumps(dict(problem=None, phase="rebuild and load the operation")), flush=True)
        op = prepare(entry, pool=entry.get("pool", True))
        cases(entry, op, emit)
    except Exception as error:  # noqa: BLE001  (rebuilding or setting up failed)
        emit(dict(status="ERROR", error=f"{type(error).__name__}: {str(error)[:400]}",
                  trace=traceback.format_exc()[-2000:]))
    print(DONE_MARK, flush=True)
    sys.stderr.flush()
    os._exit(0)


# --- orchestration (parent) ---------------------------------------------------------------------------------------
def sanitizer_path():
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home and os.access(Path(home) / "bin" / "compute-sanitizer", os.X_OK):
            return str(Path(home) / "bin" / "compute-sanitizer")
    return None


SANITIZER_EXIT = 86


def sanitizer_prefix():
    path = sanitizer_path()
    if path is None:
        raise SystemExit("--sanitize: compute-sanitizer is neither on PATH nor in $CUDA_HOME/bin or "
                         "/usr/local/cuda/bin")
    return [path, "--tool", "memcheck", "--error-exitcode", str(SANITIZER_EXIT), "--print-limit", "30"]


def sanitizer_env():
    """Allocations the sanitizer can see: no torch caching allocator (and the child skips the RMM pool)."""
    return dict(os.environ, PYTORCH_NO_CUDA_MEMORY_CACHING="1")


def _signal_name(code):
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


_LIVE = set()  # children running now (killed if the parent is interrupted)
_LIVE_LOCK = threading.Lock()
_STOP = threading.Event()


def _kill(process):
    try:
        os.killpg(process.pid, signal.SIGKILL)  # the child's own process group (its sanitizer included)
    except (ProcessLookupError, PermissionError):
        pass


def kill_children():
    _STOP.set()
    with _LIVE_LOCK:
        for process in list(_LIVE):
            _kill(process)


def run_child(entry, command, timeout, env=None):
    """Run one entry's child; return its case records plus, where it died, hung or the sanitizer objected, one
    record saying so. None if the run was interrupted first."""
    if _STOP.is_set():
        return None
    args = command + ["--one", json.dumps(entry)]
    start = time.perf_counter()
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace",
                               start_new_session=True, env=env)
    with _LIVE_LOCK:
        _LIVE.add(process)
    hung = False
    try:
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            hung = True
            _kill(process)
            stdout, stderr = process.communicate()
    finally:
        with _LIVE_LOCK:
            _LIVE.discard(process)
    if _STOP.is_set():
        return None
    elapsed = round(time.perf_counter() - start, 1)
    records, other, running, done = [], [], None, False
    for line in stdout.splitlines():
        if line.startswith(CASE_MARK):
            try:
                records.append(json.loads(line[len(CASE_MARK):]))
            except json.JSONDecodeError:
                other.append(line)
            running = None
        elif line.startswith(START_MARK):
            try:
                running = json.loads(line[len(START_MARK):])
            except json.JSONDecodeError:
                running = dict(problem=line[len(START_MARK):])
        elif line.strip() == DONE_MARK:
            done = True
        else:
            other.append(line)
    rc = process.returncode
    how = _signal_name(rc) if rc < 0 else f"exit status {rc}"
    tails = dict(stderr_tail=stderr[-3000:], stdout_tail="\n".join(other)[-3000:], exit=rc, child_seconds=elapsed)
    if not isinstance(running, dict) or "problem" not in running:  # what it was running: {problem, case_seed}
        running = dict(problem=running)
    extra = None
    if hung:
        extra = dict(status="HANG", error=f"no exit within {timeout} s (killed)", **running)
    elif rc == SANITIZER_EXIT or (rc != 0 and "ERROR SUMMARY:" in stdout and "ERROR SUMMARY: 0 errors" not in stdout):
        extra = dict(status="MEMCHECK", error="compute-sanitizer memcheck reported errors", **running)
    elif rc != 0 and not done:
        extra = dict(status="CRASH", error=f"the child died ({how}) while running a case", **running)
    elif not records:
        extra = dict(status="CRASH", error=f"the child printed no case ({how})", **running)
    elif rc != 0 and not any(r["status"] in DEFECTS for r in records):
        extra = dict(status="CRASH", error=f"the child ended with {how} after its cases", problem=None)
    if extra is not None:
        records.append(dict(extra, **tails))
    elif rc != 0 or any(r["status"] in DEFECTS for r in records):
        for record in records:
            if record["status"] in DEFECTS:
                record.update(tails)
    return records


def describe(cfg) -> str:
    """One readable line: family, cc, class, types, layouts, tile, warps, stages, alignments, epilogue."""
    short = {"RowMajor": "T", "ColumnMajor": "N", "TensorNHWC": "NHWC"}
    types = f"{cfg['a_elem']}*{cfg['b_elem']}->{cfg['c_elem']} (math {cfg['element']}, acc {cfg['acc']}" + \
        ("" if cfg["math_op"] == "multiply_add" else f", {cfg['math_op']}") + ")"
    layouts = "/".join(short.get(x, x) for x in cfg["layouts"])
    if len(set(cfg["layouts"])) == 1 and cfg["layouts"][0] == "TensorNHWC":
        layouts = "NHWC"
    parts = [cfg["family"], f"cc{cfg['cc']}", cfg["opclass"], types, layouts]
    if cfg["family"].startswith("conv") or cfg.get("producer") == "conv80":
        parts.append(f"{cfg['conv_kind']} {cfg['algorithm']} {cfg['stride_support']}")
    warps = "x".join(map(str, cfg["warps"])) if cfg.get("warps") else "auto"
    parts += [f"tile {'x'.join(map(str, cfg['tb']))}", f"warps {warps}", f"stages {cfg['stages'] or 'auto'}",
              f"inst {'x'.join(map(str, cfg['inst']))}", f"align {cfg['a_align']}/{cfg['b_align']}/{cfg['c_align']}"]
    if "cluster" in cfg:
        parts.append(f"cluster {'x'.join(map(str, cfg['cluster']))} {cfg['kernel_schedule']}/"
                     f"{cfg['epilogue_schedule']}/{cfg['tile_scheduler']}")
    epilogue = cfg["epilogue"]
    if epilogue == "LinearCombinationGeneric":
        epilogue += f"({cfg['activation']})"
    if cfg.get("element_epilogue"):
        epilogue += f" compute {cfg['element_epilogue']}"
    if cfg.get("bias"):
        epilogue += f" bias {cfg['bias'] if isinstance(cfg['bias'], str) else 'vector'}"
    if cfg.get("tree"):
        epilogue = "tree: " + "; ".join(line.strip() for line in cfg["tree"].splitlines()[1:])
    parts += [epilogue, f"swizzle {cfg['swizzle']}"]
    if cfg.get("scales"):
        parts.append(f"scales {cfg['scales']}" + (" grouped" if cfg["form"].startswith("grouped") else ""))
    if cfg.get("reduction"):
        parts.append(_reduction_text(cfg))
    return ", ".join(parts)


def _reduction_text(cfg) -> str:
    spec = cfg["reduction"]
    epilogue = spec["epilogue"] + (f"({spec['activation']})" if spec["epilogue"] == "LinearCombinationGeneric" else "")
    if spec["element_epilogue"]:
        epilogue += f" compute {spec['element_epilogue']}"
    return (f"reduce {cfg['c_elem']}->{spec['c_elem']} (acc {spec['acc']}) {spec['layout']}, shape "
            f"{'x'.join(map(str, spec['shape']))} count {spec['c_align']} stage {spec['partitions_per_stage']}, "
            f"{epilogue}")


def _problem_text(problem) -> str:
    if not isinstance(problem, dict):
        return "" if problem is None else str(problem)
    if "m" in problem:
        extras = "".join(f" {key}={problem[key]}" for key in ("batch", "array", "knobs", "lib", "slices", "workspace")
                         if key in problem)
        return f"M={problem['m']} N={problem['n']} K={problem['k']}{extras}"
    if "sizes" in problem:  # device-side sizes: the layout, the bounds, the sizes (and the replay's)
        layout = problem.get("layout") or ("masked" if problem.get("masked") else "packed")
        bound = f"capacity {problem['capacity']}" if "capacity" in problem else f"rows {problem['rows']}"
        sizes = " ".join("x".join(map(str, size)) if isinstance(size, list) else str(size)
                         for size in problem["sizes"])
        extras = " replayed with new sizes" if problem.get("replay") else ""
        extras += ", scales on the device" if problem.get("scale_form") == "device" else ""
        return f"{layout} {problem['groups']} groups, {bound}, N={problem['n']} K={problem['k']}: {sizes}{extras}"
    if "groups" in problem:
        extras = f" scales {problem['scale_form']}" if "scale_form" in problem else ""
        return "groups " + " ".join("x".join(map(str, size)) for size in problem["groups"]) + extras
    p = problem
    extras = "".join(f" {key}={p[key]}" for key in ("split_k", "lib", "workspace") if key in p)
    return (f"N={p['n']} H={p['h']} W={p['w']} C={p['c']} K={p['k']} R={p['r']} S={p['s']} pad={p['pad']} "
            f"stride={p['stride']} dilation={p['dilation']}{extras}")


def summarize(records, out=None):
    """The count table (family x status) and one line per defect configuration."""
    out = out or sys.stdout
    counts = collections.defaultdict(collections.Counter)
    for record in records:
        counts[record["family"]][record["status"]] += 1
    columns = [s for s in STATUSES if any(c[s] for c in counts.values())]
    widths = [max(len(s), 5) + 2 for s in columns]
    print("\nsummary (cases; COMPILE-FAIL, CRASH, HANG and MEMCHECK count configurations):", file=out)
    print("  " + "family".ljust(12) + "".join(s.rjust(w) for s, w in zip(columns, widths)), file=out)
    total = collections.Counter()
    for family in FAMILIES:
        if family in counts:
            total.update(counts[family])
            print("  " + family.ljust(12) + "".join(str(counts[family][s]).rjust(w) for s, w in zip(columns, widths)),
                  file=out)
    print("  " + "all".ljust(12) + "".join(str(total[s]).rjust(w) for s, w in zip(columns, widths)), file=out)
    defects = collections.OrderedDict()
    for record in records:
        if record["status"] in DEFECTS:
            defects.setdefault(record["index"], []).append(record)
    print(f"\ndefect configurations: {len(defects)}", file=out)
    for index, found in defects.items():
        first = found[0]
        statuses = ",".join(sorted({r["status"] for r in found}))
        problem = next((r.get("problem") for r in found if r.get("problem")), None)
        print(f"  [{index}] {statuses}: {describe(first['cfg'])}", file=out)
        print(f"        {first['name']}" + (f"  at {_problem_text(problem)}" if problem else ""), file=out)
        print(f"        {(first.get('error') or '').splitlines()[0][:200] if first.get('error') else ''}", file=out)
    return total


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def family_counts(args) -> dict:
    return {"gemm80": args.sm80, "gemm90": args.sm90, "conv80": args.conv80, "conv90": args.conv90,
            "grouped80": args.grouped80, "grouped90": args.grouped90, "gemmarray90": args.array90,
            "evt80": args.evt80, "splitk80": args.splitk80, "splitk90": args.splitk90, "moe90": args.moe90,
            "scaled90": args.scaled90}


def orchestrate(args, plan):
    counts = family_counts(args)
    for family in FAMILIES:
        got = sum(1 for entry, _ in plan if entry["family"] == family)
        if got < counts[family]:
            print(f"warning: only {got} of {counts[family]} {family} configurations drawn", flush=True)
    failed = {} if args.no_compile else compile_all(plan, args.jobs)
    command = shlex.split(args.child_cmd) if args.child_cmd else [sys.executable, str(Path(__file__).resolve())]
    env = None
    if args.sanitize:
        command = sanitizer_prefix() + command
        env = sanitizer_env()
    lock = threading.Lock()
    records = []
    out = open(args.out, "w")

    def keep(entry, found):
        with lock:
            for found_record in found:
                record = dict(index=entry["index"], family=entry["family"], backend=entry["backend"],
                              arch=entry["arch"], name=entry["name"])
                if entry.get("companions"):
                    record["companions"] = entry["companions"]
                record.update(found_record)
                record["cfg"] = entry["cfg"]
                records.append(record)
                out.write(json.dumps(record) + "\n")
            out.flush()
            statuses = collections.Counter(r["status"] for r in found)
            marks = " ".join(f"{s}={n}" for s, n in statuses.items())
            done = len({r["index"] for r in records})
            print(f"[{done}/{len(plan)}] #{entry['index']} {entry['name']}: {marks}", flush=True)
            for record in found:
                if record["status"] in DEFECTS:
                    print(f"    {record['status']} {_problem_text(record.get('problem'))} "
                          f"{(record.get('error') or '')[:300]}", flush=True)

    runs = []
    for entry, _ in plan:
        errors = [f"{name}: {failed[name]}" if name != entry["name"] else failed[name]
                  for name in entry_names(entry) if name in failed]
        if errors:  # the entry's own operation or a companion (its reduction) did not compile
            keep(entry, [dict(status="COMPILE-FAIL", error="\n".join(errors))])
        else:
            runs.append(dict(entry, sizes=args.sizes, retries=args.retries, pool=not args.sanitize))
    start = time.perf_counter()
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.parallel))
    previous = signal.signal(signal.SIGTERM, _interrupt) if threading.current_thread() is threading.main_thread() \
        else None
    interrupted = False
    try:
        futures = {pool.submit(run_child, entry, command, args.timeout, env): entry for entry in runs}
        for future in concurrent.futures.as_completed(futures):
            entry = futures[future]
            try:
                found = future.result()
            except Exception as error:  # noqa: BLE001  (the orchestration itself: record, go on)
                found = [dict(status="CRASH", error=f"starting the child failed: {type(error).__name__}: {error}")]
            if found is not None:
                keep(entry, found)
    except KeyboardInterrupt:
        interrupted = True
        kill_children()  # no child outlives the run (they are in their own sessions: Ctrl-C does not reach them)
        print("interrupted: children killed; the summary covers the configurations that finished", flush=True)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        _STOP.clear()
    out.close()
    print(f"ran {len({r['index'] for r in records})} of {len(plan)} configurations in "
          f"{time.perf_counter() - start:.0f} s{' (interrupted)' if interrupted else ''}; records in {args.out}",
          flush=True)
    records.sort(key=lambda r: r["index"])
    summarize(records)
    return records


def run_config(args):
    """--config: one configuration in this process (a cfg, or a JSONL record: then its exact problem and seed)."""
    text = args.config
    if not text.lstrip().startswith("{") and Path(text).is_file():
        text = Path(text).read_text()
    given = json.loads(text)
    cfg = given.get("cfg", given)
    backend, arch = target_of(cfg)
    entry = dict(given if "cfg" in given else {}, cfg=cfg, backend=given.get("backend", backend),
                 arch=given.get("arch", arch), sizes=args.sizes, retries=args.retries)
    entry.setdefault("seed", args.seed)
    if not entry.get("problem"):
        entry.pop("problem", None)
    entry["preload"] = not args.no_compile
    print(describe(cfg), flush=True)
    op = prepare(entry, pool=not os.environ.get("FUZZ_RUN_NO_POOL"))
    print(op.name + (f" (compiled here: {entry['child_compiled']})" if entry.get("child_compiled") else ""),
          flush=True)

    def emit(record):
        print(json.dumps(dict(record, name=op.name)), flush=True)

    cases(entry, op, emit)


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sm80", type=int, default=48, help="Sm80-family GEMM configurations (gemm80)")
    parser.add_argument("--sm90", type=int, default=32, help="SM90 GEMM configurations (gemm90)")
    parser.add_argument("--conv80", type=int, default=32, help="Sm80-family conv2d configurations (conv80)")
    parser.add_argument("--conv90", type=int, default=16, help="SM90 conv2d configurations (conv90)")
    parser.add_argument("--grouped80", type=int, default=0,
                        help="Sm80-family grouped GEMM configurations (grouped80; drawn after the others)")
    parser.add_argument("--grouped90", type=int, default=0, help="SM90 grouped GEMM configurations (grouped90)")
    parser.add_argument("--evt80", type=int, default=0,
                        help="Sm80-family GEMMs with random epilogue visitor trees (evt80; NVRTC)")
    parser.add_argument("--array90", type=int, default=0,
                        help="SM90 pointer-array GEMM configurations (gemmarray90: array=True, lists of matrices)")
    parser.add_argument("--splitk80", type=int, default=0,
                        help="Sm80-family parallel split-K GEMMs / conv2ds and their ReductionOperations (splitk80)")
    parser.add_argument("--splitk90", type=int, default=0,
                        help="SM90 GEMM parallel split-K (the L mode) and its ReductionOperations (splitk90)")
    parser.add_argument("--moe90", type=int, default=0,
                        help="SM90 grouped GEMMs with group sizes on the device: packed tokens and the masked "
                             "layout, now and then replayed from a CUDA graph with new sizes (moe90)")
    parser.add_argument("--scaled90", type=int, default=0,
                        help="SM90 GEMMs with scales: fp8 block-wise (dense, and grouped with device sizes) and "
                             "grouped row-wise (scaled90)")
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=16, help="parallel compile units")
    parser.add_argument("--parallel", type=int, default=8, help="child processes at once (sharing the GPU)")
    parser.add_argument("--timeout", type=float, default=None, help="seconds per child, beyond which it is a HANG "
                                                                     "(default 120; 900 with --sanitize)")
    parser.add_argument("--sizes", type=int, default=2, help="random problem sizes per configuration")
    parser.add_argument("--retries", type=int, default=3, help="new sizes after an argument-rejected one")
    parser.add_argument("--out", default="fuzz_run.jsonl")
    parser.add_argument("--dry-run", action="store_true", help="draw, rebuild and list the configurations; no "
                                                               "compile, no GPU")
    parser.add_argument("--no-compile", action="store_true", help="skip the parent's compile step (the cache is "
                                                                  "warm, or children compile what they miss)")
    parser.add_argument("--compile-only", action="store_true", help="compile the drawn configurations into the "
                        "cache and stop (no GPU): fill a cache here for a GPU host, with --arch")
    parser.add_argument("--arch", type=int, default=None, help="target of the Sm80-family configurations (default: "
                        "this machine's GPU, else 80); give the GPU host's, e.g. 90, with --compile-only")
    parser.add_argument("--config", default=None, help="rerun one configuration in this process: a cfg object or "
                                                       "a JSONL record (JSON text or a file)")
    parser.add_argument("--sanitize", action="store_true", help="run children (or --config) under "
                                                                "compute-sanitizer --tool memcheck")
    parser.add_argument("--child-cmd", default=None, help=argparse.SUPPRESS)  # tests: a fake child
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a child: one entry's cases
    return parser.parse_args(argv)


def main(argv=None):
    args = parse(argv)
    if args.timeout is None:
        args.timeout = 900.0 if args.sanitize else 120.0
    if args.one is not None:
        child_main(args.one)
    if args.config is not None:
        if args.sanitize:  # the same command, under the sanitizer, without the RMM pool or torch's cache
            argv = list(sys.argv[1:] if argv is None else argv)
            argv.remove("--sanitize")
            command = sanitizer_prefix() + [sys.executable, str(Path(__file__).resolve())] + argv
            env = dict(sanitizer_env(), FUZZ_RUN_NO_POOL="1")
            os.execvpe(command[0], command, env)
        run_config(args)
        return 0
    plan = draw_plan(args.seed, family_counts(args), args.arch)
    if args.compile_only:
        failed = compile_all(plan, args.jobs)
        for name, error in failed.items():
            print(f"COMPILE-FAIL {name}: {error[-600:]}", flush=True)
        print(f"compiled {len(plan)} configurations; {len(failed)} operations failed", flush=True)
        return 1 if failed else 0
    if args.dry_run:
        for entry, op in plan:
            again = [built.name for built in fuzz_accept.build_all(json.loads(json.dumps(entry["cfg"])))]
            same = "" if again == entry_names(entry) else f"   REBUILDS AS {' + '.join(again)}"
            print(f"#{entry['index']} {entry['backend']} sm_{entry['arch']} {' + '.join(entry_names(entry))}{same}\n"
                  f"    {describe(entry['cfg'])}")
        by_family = collections.Counter(entry["family"] for entry, _ in plan)
        print(f"{len(plan)} configurations: {dict(by_family)}")
        return 0
    orchestrate(args, plan)
    return 0


if __name__ == "__main__":
    sys.exit(main())
