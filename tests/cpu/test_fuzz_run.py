"""tools/fuzz_run.py's orchestration without a GPU: fake children (and a fake compute-sanitizer) that pass, fail,
die by a signal, exit nonzero, hang, print nothing or break at teardown; the parent's JSONL statuses and summary.
Also the conv drawing (every drawn configuration rebuilds under the same name) and the real child's protocol on a
machine without CUDA (it reports an ERROR for its case, not a crash)."""
from __future__ import annotations

import collections
import json
import os
import stat
import sys
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parents[2] / "tools"
sys.path.insert(0, str(TOOLS))

import fuzz_run  # noqa: E402

# index % 8 -> what the fake child does
MODES = ["ok", "wrong", "segv", "exit", "hang", "silent", "error", "teardown"]
FAKE_CHILD = """
import json, os, signal, sys, time
entry = json.loads(sys.argv[sys.argv.index("--one") + 1])
assert entry["sizes"] == 2 and entry["cfg"]["family"] == "gemm80" and entry["name"].startswith("pycutlass_")
mode = MODES[entry["index"] % len(MODES)]

def start(m):
    print(START + json.dumps({"problem": {"m": m, "n": 16, "k": 16}, "case_seed": 5}), flush=True)

def case(status, m=16, **extra):
    print(CASE + json.dumps(dict(status=status, problem={"m": m, "n": 16, "k": 16}, case_seed=7, **extra)), flush=True)

print("some other output on stdout")
if mode == "ok":
    start(16); case("argument-rejected", error="no"); start(32); case("ok", m=32); start(48); case("ok", m=48)
elif mode == "wrong":
    start(16); case("ok"); start(32); case("WRONG", m=32, error="relative error 1.0e+00 (tolerance 2.0e-03)")
elif mode == "segv":
    start(16); case("ok"); start(80)
    sys.stderr.write("CUDA_ERROR_ILLEGAL_ADDRESS somewhere\\n"); sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGSEGV)
elif mode == "exit":
    sys.stderr.write("Traceback: boom\\n"); sys.exit(3)
elif mode == "hang":
    start(16); case("ok"); start(96); time.sleep(60)
elif mode == "silent":
    sys.exit(0)
elif mode == "error":
    start(16); case("ERROR", error="CudaError: CUDA_ERROR_ILLEGAL_ADDRESS"); print(DONE, flush=True); sys.exit(1)
elif mode == "teardown":
    start(16); case("ok"); start(32); case("ok", m=32); print(DONE, flush=True); os.abort()
print(DONE, flush=True)
"""
FAKE_SANITIZER = """#!/bin/sh
# compute-sanitizer --tool memcheck --error-exitcode N --print-limit 30 <command...>
[ "$1" = "--tool" ] && [ "$2" = "memcheck" ] && [ "$3" = "--error-exitcode" ] || exit 90
code=$4
shift 6
[ "$PYTORCH_NO_CUDA_MEMORY_CACHING" = "1" ] || exit 91
"$@"
rc=$?
case "$*" in
  *'"index": 0,'*) echo "========= Invalid __global__ read of size 4 bytes"; echo "========= ERROR SUMMARY: 1 error";
                   exit $code;;
esac
echo "========= ERROR SUMMARY: 0 errors"
exit $rc
"""


def _fake_child(tmp_path):
    script = tmp_path / "fake_child.py"
    script.write_text(f"MODES = {MODES!r}\nSTART = {fuzz_run.START_MARK!r}\nCASE = {fuzz_run.CASE_MARK!r}\n"
                      f"DONE = {fuzz_run.DONE_MARK!r}\n" + FAKE_CHILD)
    return f"{sys.executable} {script}"


def _records(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def test_children_statuses_and_summary(tmp_path, capsys):
    out = tmp_path / "run.jsonl"
    fuzz_run.main(["--sm80", str(len(MODES)), "--sm90", "0", "--conv80", "0", "--conv90", "0", "--seed", "3",
                   "--no-compile", "--child-cmd", _fake_child(tmp_path), "--timeout", "2", "--parallel",
                   str(len(MODES)), "--sizes", "2", "--out", str(out)])
    printed = capsys.readouterr().out
    records = _records(out)
    by_index = {}
    for record in records:
        by_index.setdefault(record["index"], []).append(record)
        assert record["family"] == "gemm80" and record["cfg"]["family"] == "gemm80"
        assert record["backend"] == "nvcc" and record["arch"] in (80, 90)
    assert sorted(by_index) == list(range(len(MODES)))
    statuses = {i: [r["status"] for r in by_index[i]] for i in by_index}
    assert statuses[0] == ["argument-rejected", "ok", "ok"]
    assert statuses[1] == ["ok", "WRONG"]
    assert statuses[2] == ["ok", "CRASH"]
    crash = by_index[2][1]
    assert "SIGSEGV" in crash["error"] and crash["problem"]["m"] == 80 and "ILLEGAL_ADDRESS" in crash["stderr_tail"]
    assert crash["case_seed"] == 5  # what --config needs to rerun the case that died
    assert statuses[3] == ["CRASH"] and "exit status 3" in by_index[3][0]["error"]
    assert "boom" in by_index[3][0]["stderr_tail"]
    assert statuses[4] == ["ok", "HANG"] and by_index[4][1]["problem"]["m"] == 96
    assert statuses[5] == ["CRASH"] and "no case" in by_index[5][0]["error"]
    assert statuses[6] == ["ERROR"] and by_index[6][0]["exit"] == 1  # no extra CRASH: the ERROR says it
    assert statuses[7] == ["ok", "ok", "CRASH"] and "after its cases" in by_index[7][2]["error"]
    assert "some other output" in by_index[1][1]["stdout_tail"]
    # the summary: counts per family and status, then one line per defect configuration
    assert "defect configurations: 7" in printed
    row = next(line for line in printed.splitlines() if line.strip().startswith("gemm80"))
    header = next(line for line in printed.splitlines() if line.strip().startswith("family"))
    counts = dict(zip(header.split()[1:], map(int, row.split()[1:])))
    assert counts == {"ok": 7, "argument-rejected": 1, "WRONG": 1, "ERROR": 1, "CRASH": 4, "HANG": 1}
    defect_lines = [line for line in printed.splitlines() if line.startswith("  [")]
    assert len(defect_lines) == 7 and all("gemm80, cc" in line and "tile " in line for line in defect_lines)
    assert any(line.startswith("  [4] HANG") for line in defect_lines)


def test_sanitize_wraps_children(tmp_path, capsys, monkeypatch):
    sanitizer = tmp_path / "bin" / "compute-sanitizer"
    sanitizer.parent.mkdir()
    sanitizer.write_text(FAKE_SANITIZER)
    sanitizer.chmod(sanitizer.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{sanitizer.parent}{os.pathsep}{os.environ['PATH']}")
    assert fuzz_run.sanitizer_path() == str(sanitizer)
    out = tmp_path / "run.jsonl"
    fuzz_run.main(["--sm80", "2", "--sm90", "0", "--conv80", "0", "--conv90", "0", "--seed", "3", "--no-compile",
                   "--child-cmd", _fake_child(tmp_path), "--timeout", "5", "--sanitize", "--out", str(out)])
    records = _records(out)
    assert [r["status"] for r in records if r["index"] == 0] == ["argument-rejected", "ok", "ok", "MEMCHECK"]
    assert "Invalid __global__ read" in records[-1]["stdout_tail"] or any(
        "Invalid __global__ read" in r.get("stdout_tail", "") for r in records)
    assert [r["status"] for r in records if r["index"] == 1] == ["ok", "WRONG"]
    assert "defect configurations: 2" in capsys.readouterr().out


def test_conv_configurations_draw_and_rebuild(capsys):
    fuzz_run.main(["--sm80", "2", "--sm90", "2", "--conv80", "6", "--conv90", "3", "--seed", "11", "--dry-run"])
    printed = capsys.readouterr().out
    assert "13 configurations: {'gemm80': 2, 'gemm90': 2, 'conv80': 6, 'conv90': 3}" in printed
    assert "REBUILDS AS" not in printed
    plan = fuzz_run.draw_plan(11, {"conv80": 6, "conv90": 3})
    assert [e["index"] for e, _ in plan] == list(range(9))
    assert all(fuzz_run.runnable(e["cfg"]) for e, _ in plan)
    assert {(e["family"], e["backend"]) for e, _ in plan} == {("conv80", "nvcc"), ("conv90", "nvrtc")}
    again = fuzz_run.draw_plan(11, {"conv80": 6, "conv90": 3})  # deterministic by seed
    assert [e for e, _ in again] == [e for e, _ in plan]
    import random
    for entry, op in plan:  # problems the operations take (channel alignment, SM90 dgrad stride 1, ...)
        problem = fuzz_run.draw_problem(entry["cfg"], op, random.Random(entry["seed"]), 0)
        from pycutlass.conv import Conv2dProblemSize, Mode
        p = problem
        ps = Conv2dProblemSize((p["n"], p["h"], p["w"], p["c"]), (p["k"], p["r"], p["s"], p["c"]), tuple(p["pad"]),
                               tuple(p["stride"]), tuple(p["dilation"]), Mode.cross_correlation, 1, 1)
        op.check_problem_size(ps)


def _assert_contiguous_extents_aligned(family, op, m, n, k):
    """Each operand's contiguous extent is a multiple of its alignment (SM90: of 16 bytes as well, for TMA)."""
    row = __import__("pycutlass").RowMajor
    for desc, extent in ((op.A, k if op.A.layout is row else m), (op.B, n if op.B.layout is row else k),
                         (op.C, n if op.C.layout is row else m)):
        alignment = max(desc.alignment, 128 // desc.element.bits) if family.endswith("90") else desc.alignment
        assert extent % alignment == 0, (family, op.name, (m, n, k))


def test_gemm_problem_draws_cover_odd_sizes_modes_knobs_and_libraries():
    """The GEMM draws reach odd sizes within the alignments, batches, serial split-K (Sm80 family), stream-K and
    scheduler knobs (SM90), numpy / cupy operands and the pointer-array family's lists; later attempts fall back to
    plain multiples of 16."""
    import random

    plan = fuzz_run.draw_plan(113, {"gemm80": 12, "gemm90": 10, "gemmarray90": 4})
    seen = collections.Counter()
    for entry, op in plan:
        rng = random.Random(entry["seed"])
        for _ in range(12):
            problem = fuzz_run.draw_problem(entry["cfg"], op, rng, 0)
            _assert_contiguous_extents_aligned(entry["family"], op, problem["m"], problem["n"], problem["k"])
            seen["odd"] += any(problem[d] % 16 for d in "mnk")
            seen["batch"] += "batch" in problem
            knobs = problem.get("knobs", {})
            seen["serial split-K"] += entry["family"] == "gemm80" and "split_k_slices" in knobs
            assert entry["family"] != "gemm80" or set(knobs) <= {"split_k_slices"}
            if "decomposition" in knobs or "split_k_slices" in knobs and entry["family"] == "gemm90":
                assert entry["cfg"]["tile_scheduler"] == "StreamK"
                seen["stream-K knobs"] += 1
            seen["sm_count"] += "sm_count" in knobs
            seen[problem.get("lib", "torch")] += 1
            if entry["family"] == "gemmarray90":
                assert 1 <= problem["array"] <= 5 and set(problem) == {"m", "n", "k", "array"}
                seen["array"] += 1
        plain = fuzz_run.draw_problem(entry["cfg"], op, rng, 2)
        assert set(plain) - {"array"} == {"m", "n", "k"} and all(plain[d] % 16 == 0 for d in "mnk")
        assert ("array" in plain) == (entry["family"] == "gemmarray90")
    for what in ("odd", "batch", "serial split-K", "stream-K knobs", "sm_count", "numpy", "cupy", "array"):
        assert seen[what] > 0, (what, seen)


def test_visitor_tree_configurations_draw_rebuild_and_trace(capsys):
    """evt80 draws random trees that trace (the operation's description names every drawn input and output),
    rebuild under the same name from their JSON record, and run on problems within the alignments."""
    import random

    plan = fuzz_run.draw_plan(114, {"evt80": 8})
    assert len(plan) == 8 and {e["backend"] for e, _ in plan} == {"nvrtc"}
    for entry, op in plan:
        cfg = json.loads(json.dumps(entry["cfg"]))
        assert fuzz_run.fuzz_accept.build(cfg).name == op.name
        description = op.epilogue_functor.description
        signature = cfg["tree"].splitlines()[0]
        assert [name for name, _ in description.inputs] == [
            name for name in ("c", "v_row", "v_col", "alpha", "beta") if f"{name}:" in signature]
        returned = cfg["tree"].splitlines()[-1].split("return ")[1].split(", ")
        assert len(description.outputs) == len(returned)
        problem = fuzz_run.draw_problem(cfg, op, random.Random(entry["seed"]), 0)
        _assert_contiguous_extents_aligned("evt80", op, problem["m"], problem["n"], problem["k"])
    fuzz_run.main(["--sm80", "0", "--sm90", "0", "--conv80", "0", "--conv90", "0", "--evt80", "4", "--seed", "114",
                   "--dry-run"])
    printed = capsys.readouterr().out
    assert "4 configurations: {'evt80': 4}" in printed and "REBUILDS AS" not in printed and "tree: " in printed


def test_grouped_configurations_draw_and_rebuild(capsys):
    """Grouped families come after the others (earlier seeds draw the configurations they drew), rebuild under their names, take the
    backend of their kernel family and draw lists of groups within the operations' alignments."""
    import random

    base = fuzz_run.draw_plan(19, {"gemm80": 3, "conv90": 2})
    plan = fuzz_run.draw_plan(19, {"gemm80": 3, "conv90": 2, "grouped80": 5, "grouped90": 4})
    assert [(e["name"], e["cfg"]) for e, _ in plan[:5]] == [(e["name"], e["cfg"]) for e, _ in base]
    grouped = plan[5:]
    assert [e["family"] for e, _ in grouped] == ["grouped80"] * 5 + ["grouped90"] * 4
    assert {e["backend"] for e, _ in grouped if e["family"] == "grouped90"} == {"nvrtc"}
    for entry, op in grouped:
        assert isinstance(op, __import__("pycutlass").GemmOperationGrouped)
        problem = fuzz_run.draw_problem(entry["cfg"], op, random.Random(entry["seed"]), 0)
        assert 1 <= len(problem["groups"]) <= 12
        for m, n, k in problem["groups"]:
            assert min(m, n, k) >= 0
            _assert_contiguous_extents_aligned(entry["family"], op, m, n, k)
    fuzz_run.main(["--sm80", "0", "--sm90", "0", "--conv80", "0", "--conv90", "0", "--grouped80", "3",
                   "--grouped90", "2", "--seed", "19", "--dry-run"])
    printed = capsys.readouterr().out
    assert "5 configurations: {'grouped80': 3, 'grouped90': 2}" in printed and "REBUILDS AS" not in printed


def test_moe_and_scaled_families_draw_after_the_others_and_rebuild(capsys):
    """moe90 and scaled90 come after every other family (earlier seeds draw what they drew); they rebuild under
    their names with NVRTC, and their problems stay inside what the layouts take: packed sizes within the rows,
    masked ones within the capacity, per-group N and K within the bounds and aligned, block-wise sizes aligned."""
    import random

    import pycutlass as cutlass

    counts = {"gemm80": 2, "gemm90": 2, "grouped90": 2}
    base = fuzz_run.draw_plan(29, counts)
    plan = fuzz_run.draw_plan(29, dict(counts, moe90=6, scaled90=9))
    assert [(e["name"], e["cfg"]) for e, _ in plan[:len(base)]] == [(e["name"], e["cfg"]) for e, _ in base]
    drawn = plan[len(base):]
    assert [e["family"] for e, _ in drawn] == ["moe90"] * 6 + ["scaled90"] * 9
    assert {e["backend"] for e, _ in drawn} == {"nvrtc"}
    forms = collections.Counter(e["cfg"]["form"] for e, _ in drawn if e["family"] == "scaled90")
    assert len(forms) >= 2, forms
    layouts, scale_forms, replays = collections.Counter(), collections.Counter(), 0
    for entry, op in drawn:
        cfg = entry["cfg"]
        need = fuzz_run._gemm_size_multiples(cfg, op)
        if cfg["family"] == "moe90" or cfg["form"].startswith("grouped"):
            assert isinstance(op, cutlass.GemmOperationGrouped)
        else:
            assert isinstance(op, cutlass.GemmOperationUniversal) and op.scales == "blockwise"
        for attempt in range(8):
            problem = fuzz_run.draw_problem(cfg, op, random.Random(entry["seed"] + attempt), attempt % 3)
            if cfg["family"] == "scaled90" and cfg["form"] == "blockwise":
                assert all(problem[dim] > 0 and problem[dim] % need[dim] == 0 for dim in "mnk"), problem
                continue
            if cfg["family"] == "scaled90" and cfg["form"] == "grouped_rowwise":
                scale_forms[problem["scale_form"]] += 1
                if problem["scale_form"] != "device":  # host sizes, packed scale vectors or lists of them
                    assert problem["scale_form"] in ("packed", "lists") and problem["groups"]
                    continue
                assert all(isinstance(size, int) for size in problem["sizes"])  # counts and scales on the device
            masked = problem.get("layout") == "masked" or problem.get("masked")
            layouts["masked" if masked else "packed"] += 1
            replays += bool(problem.get("replay"))
            bound = problem["capacity"] if "capacity" in problem else problem["rows"]
            for sizes in [problem["sizes"]] + ([problem["replay"]] if problem.get("replay") else []):
                assert len(sizes) == problem["groups"]
                rows = [size if isinstance(size, int) else size[0] for size in sizes]
                assert min(rows) >= 0 and (max(rows) <= bound if masked else sum(rows) <= bound), problem
                for size in sizes:
                    if isinstance(size, list):
                        m, n, k = size
                        assert 0 <= n <= problem["n"] and 0 <= k <= problem["k"]
                        assert n % need["n"] == 0 and k % need["k"] == 0, (size, need)
    assert layouts["masked"] and layouts["packed"] and replays and scale_forms["device"]
    fuzz_run.main(["--sm80", "0", "--sm90", "0", "--conv80", "0", "--conv90", "0", "--moe90", "2", "--scaled90", "3",
                   "--seed", "23", "--dry-run"])
    printed = capsys.readouterr().out
    assert "5 configurations: {'moe90': 2, 'scaled90': 3}" in printed and "REBUILDS AS" not in printed
    assert printed.count(", scales ") == 3


@pytest.mark.parametrize("family", ["gemm80", "splitk80", "moe90", "scaled90"])
def test_real_child_without_cuda_reports_an_error_not_a_crash(family):
    """The real child rebuilds the operations (for splitk80 both, names checked) and runs the first case up to the
    first CUDA call: an ERROR naming CUDA with the drawn problem, not a crash."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the child would compile and run for real")
    (entry, _), = fuzz_run.draw_plan(3, {family: 1})
    records = fuzz_run.run_child(dict(entry, sizes=1, retries=0, pool=False, preload=False),
                                 [sys.executable, str(TOOLS / "fuzz_run.py")], 60)
    assert [r["status"] for r in records] == ["ERROR"] and "CUDA" in records[0]["error"]
    problem = records[0]["problem"]
    if family == "gemm80":
        assert {"m", "n", "k"} <= set(problem)  # (and the runner's own keys: knobs, lib)
    elif family == "splitk80":
        assert {"slices", "workspace"} <= set(problem) or "split_k" in problem
    elif family == "moe90":
        assert {"layout", "groups", "n", "k", "sizes"} <= set(problem)
    else:
        assert {"m", "n", "k"} <= set(problem) or "sizes" in problem or "scale_form" in problem


def test_tolerance_and_check():
    import numpy as np

    plan = fuzz_run.draw_plan(3, {"gemm80": 30, "conv80": 10})
    for entry, op in plan:
        tol = fuzz_run.tolerance(op)
        assert 0 < tol <= 0.15
        reference = np.linspace(-3, 3, 64).reshape(8, 8)
        fuzz_run.check(op, reference if op.C.element.is_float else np.rint(reference), reference)
        poisoned = reference.copy()
        poisoned[0, 0] = np.nan
        with pytest.raises(AssertionError):
            fuzz_run.check(op, poisoned, reference)


def test_fp8_auto_schedule_gets_the_fast_accumulation_tolerance():
    """Seed 31 on an H100: an fp8 -> f32 operation with KernelScheduleType.Auto (which CUTLASS resolves to the
    cooperative FP8FastAccum schedule) measured 1.5e-4 and 2.2e-4 against float64; the tolerance follows the
    operation's resolved schedule, not the description's Auto."""
    import fuzz_accept

    cfg = {"family": "gemm90", "cc": 90, "tb": [128, 64, 128], "warps": [8, 1, 1], "stages": 0, "cluster": [2, 1, 1],
           "kernel_schedule": "Auto", "epilogue_schedule": "Auto", "tile_scheduler": "StreamK",
           "inst": [64, 128, 32], "element": "float8_e4m3", "acc": "float32", "opclass": "TensorOp",
           "math_op": "multiply_add", "a_elem": "float8_e4m3", "b_elem": "float8_e4m3", "c_elem": "float32",
           "a_align": 16, "b_align": 16, "c_align": 4, "epilogue": "LinearCombination", "activation": "hardswish",
           "element_epilogue": None, "layouts": ["RowMajor", "ColumnMajor", "ColumnMajor"],
           "swizzle": "IdentitySwizzle4", "bias": "column"}
    op = fuzz_accept.build(cfg)
    assert op.kernel_schedule.is_fp8_fast_accum
    assert fuzz_run.tolerance(op) == 1e-3


def test_fp8_promoting_main_loop_gets_the_fp8_accumulator_tolerance():
    """Seed 53 on an H100: fp8 -> f32 with the plain cooperative schedule (CUTLASS's promoting main loop) measured
    0.4-1.2e-4 against float64, GEMM and grouped alike: wgmma sums fp8 products in a narrower accumulator between
    promotions. Not a defect; the tolerance for fp8 operands is 5e-4 whatever the schedule."""
    import fuzz_accept

    cfg = {"family": "gemm90", "cc": 90, "tb": [256, 64, 128], "warps": None, "stages": 4, "cluster": [1, 2, 1],
           "kernel_schedule": "TmaWarpSpecializedCooperative", "epilogue_schedule": "TmaWarpSpecializedCooperative",
           "tile_scheduler": "StreamK", "inst": [16, 8, 32], "element": "float8_e4m3", "acc": "float32",
           "opclass": "TensorOp", "math_op": "multiply_add", "a_elem": "float8_e4m3", "b_elem": "float8_e4m3",
           "c_elem": "float32", "a_align": 16, "b_align": 16, "c_align": 4, "epilogue": "LinearCombination",
           "activation": "identity", "element_epilogue": None, "layouts": ["RowMajor", "ColumnMajor", "RowMajor"],
           "swizzle": "IdentitySwizzle4", "bias": "column"}
    op = fuzz_accept.build(cfg)
    assert not op.kernel_schedule.is_fp8_fast_accum
    assert fuzz_run.tolerance(op) == 5e-4


# --- parallel split-K (splitk80): a producer writing partial sums and the ReductionOperation that sums them ----------
def test_splitk_draws_mostly_build_their_reduction():
    """Of the draws whose producer (the Sm80-family GEMM / conv2d drawing) builds, nearly all reductions build too."""
    import random

    import fuzz_accept

    rng = random.Random(41)
    producers = reductions = 0
    for _ in range(1500):
        cfg = fuzz_accept.draw_splitk80(rng)
        try:
            fuzz_accept.build(cfg)
        except fuzz_accept.DescriptionError:
            continue
        producers += 1
        try:
            fuzz_accept.companions(cfg)
            reductions += 1
        except fuzz_accept.DescriptionError:
            pass
    assert producers >= 40 and reductions >= 0.9 * producers, (producers, reductions)


def _split_k_pairs(seed, family, count):
    """(entry, cfg rebuilt from its JSON record, producer, reduction) for ``count`` drawn ``family``
    configurations; both operations rebuild under the names the plan recorded."""
    plan = fuzz_run.draw_plan(seed, {family: count})
    assert len(plan) == count
    for entry, op in plan:
        cfg = json.loads(json.dumps(entry["cfg"]))
        producer, reduction = fuzz_run.fuzz_accept.build_all(cfg)
        assert [producer.name, reduction.name] == fuzz_run.entry_names(entry) == [op.name, entry["companions"][0]]
        yield entry, cfg, producer, reduction


def test_splitk_configurations_pair_a_producer_with_its_reduction():
    """60 accepted splitk80 configurations: both operations rebuild under the names the plan recorded from the JSON
    record; the producer writes raw partial sums (a plain LinearCombination, no interleaved layout) in the type the
    reduction reads (element_workspace), never int8; GEMM and conv producers, partials in the accumulator type and in
    a 16-bit output type, and the three reduction epilogues all come up."""
    import pycutlass as cutlass

    D = cutlass.DataType
    seen = collections.Counter()
    for entry, cfg, producer, reduction in _split_k_pairs(41, "splitk80", 60):
        assert (entry["backend"], entry["arch"]) == ("nvcc", cfg["cc"])
        assert isinstance(reduction, cutlass.ReductionOperation) and reduction.compute_capability == cfg["cc"]
        assert reduction.element_workspace is producer.C.element is D[cfg["c_elem"]]
        assert producer.C.element is not D.int8
        functor = producer.epilogue_functor
        assert functor.kind == "LinearCombination" and functor.activation is None
        assert fuzz_run.runnable(cfg) and not any("Interleaved" in x or "32" in x for x in cfg["layouts"])
        if cfg["producer"] == "conv80":
            assert isinstance(producer, cutlass.Conv2dOperation) and cfg["layouts"] == ["TensorNHWC"] * 3
            assert not producer.is_strided_dgrad  # the strided-dgrad kernel has no parallel split-K
        else:
            assert isinstance(producer, cutlass.GemmOperationUniversal)
            assert reduction.C.layout is producer.C.layout  # the workspace is packed in the GEMM's C layout
        accumulator = producer.tile_description.math_instruction.element_accumulator
        seen[cfg["producer"]] += 1
        seen["accumulator partials" if producer.C.element is accumulator else f"{producer.C.element.name} partials"] += 1
        seen[cfg["reduction"]["epilogue"]] += 1
        assert fuzz_run.fuzz_accept.build_all(cfg)[1].name == reduction.name  # stable
    for what in ("gemm80", "conv80", "accumulator partials", "LinearCombination", "LinearCombinationGeneric",
                 "LinearCombinationClamp"):
        assert seen[what] > 0, (what, seen)
    assert seen["float16 partials"] + seen["bfloat16 partials"] > 0, seen


def test_splitk_problems_fit_the_producer_and_the_reduction():
    """Problems the pair takes: the producer's alignments (and CUTLASS's can_implement), 2 to 5 slices, the
    reduced contiguous extent a multiple of the reduction's count; the reduction's runtime epilogue values."""
    import random

    import pycutlass as cutlass
    from pycutlass.conv import Conv2dProblemSize, Mode as ConvMode
    from pycutlass.gemm import Mode
    from pycutlass.kinds.gemm.arguments import check_problem_alignment, check_split_k_output

    plan = fuzz_run.draw_plan(42, {"splitk80": 24})
    seen = collections.Counter()
    for entry, op in plan:
        cfg = entry["cfg"]
        reduction, = fuzz_run.fuzz_accept.companions(cfg)
        reduction.epilogue_type(1.25, -0.5, *fuzz_run._activation_args(cfg["reduction"]))
        rng = random.Random(entry["seed"])
        for attempt in (0, 0, 0, 2):
            p = fuzz_run.draw_problem(cfg, op, rng, attempt)
            seen[p["workspace"]] += 1
            if cfg["producer"] == "conv80":
                assert 2 <= p["split_k"] <= 5 and "lib" not in p
                ps = Conv2dProblemSize((p["n"], p["h"], p["w"], p["c"]), (p["k"], p["r"], p["s"], p["c"]),
                                       tuple(p["pad"]), tuple(p["stride"]), tuple(p["dilation"]),
                                       ConvMode.cross_correlation, p["split_k"], 1)
                op.check_problem_size(ps)
                assert ps.implicit_gemm_size(op.conv_kind).n() % reduction.count == 0
                seen["conv"] += 1
            else:
                assert 2 <= p["slices"] <= 5 and set(p) == {"m", "n", "k", "slices", "workspace"}
                _assert_contiguous_extents_aligned("splitk80", op, p["m"], p["n"], p["k"])
                check_problem_alignment(op, p["m"], p["n"], p["k"])
                check_split_k_output(op, Mode.GemmSplitKParallel, p["slices"], op.epilogue_type(1.0, 0.0))
                contiguous = p["n"] if reduction.C.layout is cutlass.RowMajor else p["m"]
                assert contiguous % reduction.count == 0
                seen["gemm"] += 1
                if attempt == 2:
                    assert all(p[d] % 16 == 0 for d in "mnk")
    for what in ("conv", "gemm", "arguments", "ptr_D"):
        assert seen[what] > 0, (what, seen)


def test_splitk_family_keeps_earlier_draws_and_dry_runs(capsys):
    """splitk80 is drawn after every other family: the others' configurations and names are what they were without
    it; --dry-run lists both operations of each pair and rebuilds them from JSON."""
    counts = {"gemm80": 3, "conv80": 2, "gemm90": 2, "grouped80": 1, "evt80": 1}
    base = fuzz_run.draw_plan(5, counts)
    plan = fuzz_run.draw_plan(5, dict(counts, splitk80=6))
    assert [(e["name"], e["cfg"]) for e, _ in plan[:len(base)]] == [(e["name"], e["cfg"]) for e, _ in base]
    assert all("companions" not in e for e, _ in plan[:len(base)])
    assert [e["family"] for e, _ in plan[len(base):]] == ["splitk80"] * 6
    fuzz_run.main(["--sm80", "0", "--sm90", "0", "--conv80", "0", "--conv90", "0", "--splitk80", "5", "--seed", "5",
                   "--dry-run"])
    printed = capsys.readouterr().out
    assert "5 configurations: {'splitk80': 5}" in printed and "REBUILDS AS" not in printed
    assert printed.count(" + pycutlass_reduce_splitk_") == 5 and printed.count(", reduce ") == 5


def test_splitk_compiles_both_operations_and_fails_the_pair_with_either(tmp_path, monkeypatch, capsys):
    """The parent compiles the reduction with its producer (same backend and arch group); a reduction that does not
    compile makes its configuration COMPILE-FAIL; the child refuses a cfg whose reduction rebuilds under another
    name."""
    import pycutlass as cutlass

    plan = fuzz_run.draw_plan(43, {"splitk80": 3})
    compiled = []
    monkeypatch.setattr(cutlass.compiler, "add_module", lambda ops, jobs=None: compiled.extend(o.name for o in ops))
    assert fuzz_run.compile_all(plan, jobs=1) == {}
    assert sorted(compiled) == sorted(name for entry, _ in plan for name in fuzz_run.entry_names(entry))

    broken = plan[0][0]["companions"][0]
    monkeypatch.setattr(fuzz_run, "compile_all", lambda plan, jobs: {broken: "error: boom"})
    child = tmp_path / "child.py"
    child.write_text(f"print({fuzz_run.CASE_MARK!r} + '{{\"status\": \"ok\", \"problem\": null}}')\n"
                     f"print({fuzz_run.DONE_MARK!r})\n")
    out = tmp_path / "run.jsonl"
    fuzz_run.main(["--sm80", "0", "--sm90", "0", "--conv80", "0", "--conv90", "0", "--splitk80", "3", "--seed", "43",
                   "--child-cmd", f"{sys.executable} {child}", "--timeout", "20", "--out", str(out)])
    records = {r["index"]: r for r in _records(out)}
    assert records[0]["status"] == "COMPILE-FAIL" and broken in records[0]["error"]
    assert records[0]["companions"] == [broken]
    assert records[1]["status"] == records[2]["status"] == "ok"
    capsys.readouterr()

    entry = dict(plan[0][0], companions=["pycutlass_reduce_splitk_elsewhere"])
    with pytest.raises(RuntimeError, match="not pycutlass_reduce_splitk_elsewhere"):
        fuzz_run.prepare(entry, pool=False)


def test_splitk_reference_and_tolerance():
    """The float64 reference (the reduction's epilogue; integer outputs rounded and saturated) and the pair's
    tolerance; ``check`` judges with the reduction's output type."""
    pytest.importorskip("torch")  # fuzz_run's reference helpers convert through torch
    import numpy as np

    import pycutlass as cutlass

    plan = fuzz_run.draw_plan(44, {"splitk80": 30})
    for entry, op in plan:
        reduction, = fuzz_run.fuzz_accept.companions(entry["cfg"])
        tol = fuzz_run.splitk_tolerance(op, reduction)
        assert fuzz_run.tolerance(op) <= tol <= 0.15
        accumulator = np.linspace(-300, 300, 64).reshape(8, 8)
        c = np.ones((8, 8))
        reference = fuzz_run.splitk_reference(reduction, accumulator, c, 1.0, 1.0,
                                              fuzz_run._activation_args(entry["cfg"]["reduction"]))
        if reduction.C.element is cutlass.DataType.int8:  # whole numbers within int8 (+-300 saturates)
            assert np.all((reference >= -128) & (reference <= 127) & (reference == np.rint(reference)))
        fuzz_run.check(reduction, reference, reference, tol=tol)
        poisoned = reference.copy()
        poisoned[0, 0] = np.nan
        with pytest.raises(AssertionError):
            fuzz_run.check(reduction, poisoned, reference, tol=tol)


def test_splitk90_pairs_an_sm90_producer_with_problems_its_l_mode_takes():
    """splitk90: an SM90 GEMM (Default tile scheduler, no bias, a plain LinearCombination, partials with 16-byte
    rows) and its reduction, both NVRTC for sm_90; problems split K into equal slices that start 16-byte aligned in
    a K-contiguous operand (what GemmSplitKParallel's SM90 arguments check), the reduced extent a multiple of the
    reduction's count."""
    import random

    import pycutlass as cutlass

    D = cutlass.DataType
    seen = collections.Counter()
    for entry, cfg, producer, reduction in _split_k_pairs(45, "splitk90", 12):
        assert (entry["backend"], entry["arch"]) == ("nvrtc", 90) and cfg["producer"] == "gemm90"
        assert producer.compute_capability == 90 and producer.tile_scheduler.name == "Default"
        assert producer.bias is None and not producer.array
        assert producer.epilogue_functor.kind == "LinearCombination"
        assert reduction.element_workspace is producer.C.element is not D.int8
        assert producer.C.alignment * producer.C.element.bits == 128 and reduction.C.layout is producer.C.layout
        seen[producer.tile_description.math_instruction.element_a.name] += 1
        rng = random.Random(entry["seed"])
        for attempt in (0, 0, 2):
            p = fuzz_run.draw_problem(cfg, producer, rng, attempt)
            assert 2 <= p["slices"] <= 5 and p["k"] % p["slices"] == 0
            chunk = p["k"] // p["slices"]
            for desc, k_contiguous in ((producer.A, cutlass.RowMajor), (producer.B, cutlass.ColumnMajor)):
                if desc.layout is k_contiguous:
                    assert chunk * desc.element.bits % 128 == 0, (p, desc)
            _assert_contiguous_extents_aligned("splitk90", producer, p["m"], p["n"], p["k"])
            assert (p["n"] if reduction.C.layout is cutlass.RowMajor else p["m"]) % reduction.count == 0
    assert len(seen) >= 2, seen


def test_compile_only_fills_the_cache_for_the_given_arch(monkeypatch, capsys):
    """--compile-only --arch 90 (no GPU here): every configuration compiles for sm_90, Sm80-family ones included,
    so a GPU host loads them from the carried cache; a failure exits 1 and is named."""
    import pycutlass as cutlass

    counts = ["--sm80", "3", "--sm90", "1", "--conv80", "1", "--conv90", "0", "--splitk80", "1", "--seed", "9"]
    targets, compiled = set(), []
    monkeypatch.setattr(fuzz_run, "select", lambda backend, arch: targets.add((backend, arch)))
    monkeypatch.setattr(cutlass.compiler, "add_module", lambda ops, jobs=None: compiled.extend(o.name for o in ops))
    assert fuzz_run.main(counts + ["--compile-only", "--arch", "90", "--jobs", "1"]) == 0
    assert targets == {("nvcc", 90), ("nvrtc", 90)}
    plan = fuzz_run.draw_plan(9, {"gemm80": 3, "gemm90": 1, "conv80": 1, "splitk80": 1}, arch=90)
    assert sorted(compiled) == sorted(name for entry, _ in plan for name in fuzz_run.entry_names(entry))
    assert "compiled 6 configurations; 0 operations failed" in capsys.readouterr().out

    monkeypatch.setattr(fuzz_run, "compile_all", lambda plan, jobs: {plan[0][1].name: "error: boom"})
    assert fuzz_run.main(counts + ["--compile-only", "--arch", "90"]) == 1
    assert f"COMPILE-FAIL {plan[0][1].name}: error: boom" in capsys.readouterr().out
