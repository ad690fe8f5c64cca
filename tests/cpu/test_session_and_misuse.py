"""Sessions, targets, typed errors for misuse, interrupting compiles, progress and logging (no GPU needed)."""
from __future__ import annotations

import logging
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import pycutlass as cutlass
from pycutlass import ArgumentError, DescriptionError, Target, compiler
from pycutlass.compiler.jobs import _progress_bar
from pycutlass.compiler.manager import Compiler

REPO_ROOT = Path(__file__).resolve().parents[2]


def f16_gemm(stages=3, cc=80, **options):
    math = cutlass.MathInstruction([16, 8, 16], cutlass.float16, cutlass.float16, cutlass.float32,
                                   cutlass.OpClass.TensorOp, cutlass.MathOperation.multiply_add)
    tile = cutlass.TileDescription([128, 128, 32], stages, [2, 2, 1], math)
    A = cutlass.TensorDescription(cutlass.float16, cutlass.RowMajor, 8)
    B = cutlass.TensorDescription(cutlass.float16, cutlass.ColumnMajor, 8)
    C = cutlass.TensorDescription(cutlass.float16, cutlass.RowMajor, 8)
    epilogue = cutlass.LinearCombination(cutlass.float16, 8, cutlass.float32, cutlass.float32)
    return cutlass.GemmOperationUniversal(cc, tile, A, B, C, epilogue, **options)


# --- targets ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text,expected", [(90, "sm_90"), ("90", "sm_90"), ("sm_90", "sm_90"), ("sm90", "sm_90"),
                                           ("90a", "sm_90a"), ("sm_90a", "sm_90a"), ("compute_80", "sm_80"),
                                           (86, "sm_86"), (Target(89), "sm_89")])
def test_target_parses_the_usual_spellings(text, expected):
    target = Target.parse(text)
    assert target.name == expected and str(target) == expected
    assert target.shared_memory_per_block > 48 * 1024


@pytest.mark.parametrize("bad", [0, "sm_", "abc", "sm_9", "91", 75, "sm_75", True, None, 9.0, "80a"])
def test_target_rejects_what_it_cannot_read(bad):
    with pytest.raises(DescriptionError):
        Target.parse(bad)


def test_set_target_arch_takes_strings_and_rejects_nonsense():
    with cutlass.Session().activate() as session:
        compiler.set_target_arch("sm_90")
        assert Compiler.of(session).explicit_target == Target(90)
        compiler.set_target_arch("90a")
        assert Compiler.of(session).explicit_target == Target(90, "a")
        for bad in ("sm_90x", 0, "ninety", 75):
            with pytest.raises(ArgumentError, match="target|compute capability"):
                compiler.set_target_arch(bad)
        compiler.set_target_arch(None)
        assert Compiler.of(session).explicit_target is None


def test_a_target_that_cannot_run_the_family_is_an_error_not_an_empty_kernel():
    """set_target_arch(75) used to compile Sm80-family templates whose main loop had no mma.sync at all."""
    with cutlass.Session(cache_path=":memory:").activate():
        with pytest.raises(ArgumentError, match=r"compute capability 75 is not a supported target; choose one of "
                                                r"\[80, 86, 87, 89, 90\]"):
            compiler.set_target_arch(75)
    assert Target(80).can_run("sm80") and Target(90, "a").can_run("sm80")
    assert Compiler.of(cutlass.Session(target=80, cache_path=":memory:")).target_for(f16_gemm()) == Target(80)


# --- sessions ---------------------------------------------------------------------------------------------------------
def test_sessions_are_separate_and_activation_is_scoped():
    one, two = cutlass.Session(backend="nvrtc", cache_path=":memory:"), cutlass.Session(backend="nvcc")
    assert Compiler.of(one) is not Compiler.of(two) and Compiler.of(one) is Compiler.of(one)
    assert Compiler.of(one).backend.name == "nvrtc"
    default = cutlass.session.default()
    with one.activate():
        assert cutlass.session.current() is one
        with two.activate():
            assert cutlass.session.current() is two
        assert cutlass.session.current() is one
        seen = []
        worker = threading.Thread(target=lambda: seen.append(cutlass.session.current()))
        worker.start()
        worker.join()
        assert seen == [default]  # a new thread starts in the default session
    assert cutlass.session.current() is default


def test_session_rejects_unknown_options_and_backends():
    with pytest.raises(ArgumentError, match="unknown Session option"):
        cutlass.Session(bakend="nvcc")
    with pytest.raises(ArgumentError, match="'nvcc' or 'nvrtc'"):
        cutlass.Session(backend="clang")


@pytest.mark.parametrize("option,value,allowed", [
    ("backend", "clang", "'nvcc' or 'nvrtc'"), ("backend", 3, "'nvcc' or 'nvrtc'"),
    ("target", "banana", r"cannot read 'banana' as a target.*\[80, 86, 87, 89, 90\]"),
    ("target", "sm_100", r"compute capability 100 is not a supported target; choose one of \[80, 86, 87, 89, 90\]"),
    ("target", 75, "compute capability 75 is not a supported target"), ("target", 9.0, "compute capability such as"),
    ("progress", "yes", "True, False or None"), ("cache_path", 123, "file path"), ("cache_path", "", "file path")])
def test_session_options_are_checked_when_the_session_is_made(option, value, allowed):
    with pytest.raises(ArgumentError, match=f"Session {option}.*{allowed}"):
        cutlass.Session(**{option: value})
    session = cutlass.Session()
    with pytest.raises(ArgumentError, match=allowed):
        session.set_option(option, value)
    assert option not in session.options


def test_session_options_that_are_allowed():
    from pycutlass.compiler.backends import NvrtcBackend

    session = cutlass.Session(backend=NvrtcBackend(), target=Target(90, "a"), progress=False,
                              cache_path=Path("/nonexistent/c.db"), device=0)
    assert Compiler.of(session).backend.name == "nvrtc" and Compiler.of(session).explicit_target == Target(90, "a")
    for target in (90, "90", "sm_90", "sm90", "90a", "compute_80", None):
        cutlass.Session(target=target, backend="nvcc", cache_path=":memory:", progress=None)


def test_newer_architectures_are_named_unsupported_not_unreadable():
    from pycutlass.description.target import _SHARED_MEMORY_PER_BLOCK
    from pycutlass.session import SUPPORTED_COMPUTE_CAPABILITIES

    assert tuple(_SHARED_MEMORY_PER_BLOCK) == SUPPORTED_COMPUTE_CAPABILITIES  # a fact for every supported target
    for text in (100, "100", "sm_100", "sm_100a", "sm120", "compute_103"):
        with pytest.raises(DescriptionError, match=r"is not a supported target; choose one of \[80, 86, 87, 89, 90\]"):
            Target.parse(text)
    with pytest.raises(DescriptionError, match=r"cannot read 'ninety' as a target.*\[80, 86, 87, 89, 90\]"):
        Target.parse("ninety")


@pytest.mark.parametrize("bias", ["diagonal", "row", True])
def test_an_sm80_gemm_with_a_bias_epilogue_is_a_description_error(bias):
    for cc in (80, 90):  # 90 with an Sm80 warp arrangement builds the Sm80 family too
        with pytest.raises(DescriptionError, match=r"Sm80 family builds no bias epilogue; allowed here: bias=None"):
            f16_gemm(cc=cc, bias=bias)
    assert f16_gemm(bias=None).name == f16_gemm().name


def test_add_module_returns_its_report_and_last_report_follows_the_session(tmp_path):
    with cutlass.Session(target=90, cache_path=":memory:").activate():
        report = compiler.add_module([])
        assert report.kernels == [] and len(report) == 0 and compiler.last_report() is report
    assert cutlass.compiler.last_report() is not report


def test_cache_namespace_is_reachable_after_import_pycutlass(tmp_path):
    code = ("import pycutlass, sys; c = pycutlass.cache.set_cache_path(sys.argv[1]); "
            "assert pycutlass.cache.get_cache() is c; print(c.path)")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "x.db")], capture_output=True, text=True,
                         cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(tmp_path / "x.db")


# --- misuse gets typed errors -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("call,match", [
    (lambda: compiler.add_module(f16_gemm()), "takes a list of operations"),
    (lambda: compiler.add_module([42]), "item 0 is 42, not an operation"),
    (lambda: compiler.add_module("gemm"), "takes a list of operations"),
    (lambda: compiler.add_module([f16_gemm()], jobs="x"), "jobs must be a positive integer"),
    (lambda: compiler.add_module([f16_gemm()], jobs=0), "jobs must be a positive integer"),
    (lambda: compiler.add_module([f16_gemm()], jobs=-1), "jobs must be a positive integer"),
    (lambda: compiler.add_module([f16_gemm()], jobs=True), "jobs must be a positive integer"),
    (lambda: f16_gemm().run(object()), "takes the arguments built for it"),
    (lambda: compiler.use("nvcc"), "backend must be a pycutlass compiler backend"),
])
def test_misuse_raises_typed_errors(call, match):
    with cutlass.Session(cache_path=":memory:").activate():
        with pytest.raises(ArgumentError, match=match):
            call()


@pytest.mark.parametrize("shape", [["128", 128, 32], [128.0, 128, 32], "128x128x32", [128, 128], [True, 1, 1]])
def test_tile_sizes_must_be_integers(shape):
    math = f16_gemm().tile_description.math_instruction
    with pytest.raises(DescriptionError, match="threadblock_shape must be 3"):
        cutlass.TileDescription(shape, 3, [2, 2, 1], math)


def test_operation_compute_capability_must_be_an_integer():
    with pytest.raises(DescriptionError, match="compute capability '90' is not supported"):
        f16_gemm(cc="90")


# --- progress and logging --------------------------------------------------------------------------------------------
def test_progress_bar_policy():
    assert _progress_bar(1, 3, "nvcc", None) is None  # one unit: nothing to show
    assert _progress_bar(4, 4, "nvcc", False) is None
    bar = _progress_bar(4, 8, "nvrtc", True)
    assert bar is not None and bar.total == 8 and "nvrtc" in bar.desc
    bar.close()


@pytest.mark.slow
def test_compiles_log_under_pycutlass(caplog):
    ops = _trivial_ops()
    with caplog.at_level(logging.INFO, logger="pycutlass"), \
            cutlass.Session(target=90, cache_path=":memory:", backend="nvrtc").activate():
        report = compiler.add_module(ops, jobs=2)
    assert report.compiled == 2
    messages = [r.getMessage() for r in caplog.records if r.name.startswith("pycutlass")]
    assert any("compiling 1 operation(s) with nvrtc for sm_90" in m for m in messages), messages
    # stderr is no terminal here, so no bar shows: one line per finished unit instead, in order of finishing
    progress = [r.getMessage() for r in caplog.records if r.name == "pycutlass.progress"]
    assert [m.split(":")[0] for m in progress] == ["compiled 1/2", "compiled 2/2"], progress
    assert {m.split(": ")[1].split(" (")[0] for m in progress} == {op.name for op in ops}, progress
    assert all(re.search(r"\(\d+\.\d s\)$", m) for m in progress), progress
    assert any("add_module: 2 compiled" in m for m in messages), messages


def _trivial_ops(stages=(3, 4)):
    """Operations whose bodies are empty kernels: real worker processes and NVRTC compiles, in about a second."""
    ops = [f16_gemm(n) for n in stages]
    for op in ops:
        op.emit_body = (lambda name: lambda: f'extern "C" __global__ void {name}() {{}}\n'
                                             f'extern "C" __global__ void {name}_build() {{}}\n')(op.name)
        op.headers = lambda: []
    return ops


class _CacheThatCannotStore:
    """An in-memory cache whose store fails, as a full disk would: the compile ends with an exception."""

    def __init__(self):
        from pycutlass.cache.store import ArtifactCache

        self.inner = ArtifactCache(":memory:")

    def lookup(self, key):
        return self.inner.lookup(key)

    def claim(self, keys):
        return self.inner.claim(keys)

    def store(self, entries, binary, kind):
        raise OSError(28, "No space left on device")


def _require_nvcc() -> None:
    from pycutlass.compiler import toolchain

    try:
        toolchain.nvcc_path()
    except cutlass.ToolchainError:
        pytest.skip("nvcc is not installed")


def _compile_tmpdir(tmp_path):
    """An empty folder for the compilers' temporary files (TMPDIR), to check what they leave behind."""
    workdir = tmp_path / "tmp"
    workdir.mkdir()
    return workdir


@pytest.mark.slow
def test_a_compile_leaves_no_folder_whether_it_succeeds_or_raises(tmp_path, monkeypatch):
    import tempfile

    _require_nvcc()
    workdir = _compile_tmpdir(tmp_path)
    monkeypatch.setenv("TMPDIR", str(workdir))
    monkeypatch.setattr(tempfile, "tempdir", str(workdir))
    with cutlass.Session(target=80, cache_path=":memory:", backend="nvcc", progress=False).activate():
        assert compiler.add_module(_trivial_ops(), jobs=2).compiled == 2
        assert sorted(workdir.rglob("*")) == []
        # The empty kernel's unit finishes first and its store fails while nvcc still compiles the real GEMM's
        # unit: that compile is killed and its files (source, tmpxft) removed with the folder.
        with pytest.raises(OSError, match="No space left"):
            compiler.add_module([*_trivial_ops((5,)), f16_gemm(6)], jobs=2, cache=_CacheThatCannotStore())
    time.sleep(0.5)
    assert not _compiler_processes("pycutlass.compiler.worker", f"TMPDIR={workdir}")
    assert sorted(workdir.rglob("*")) == []


# --- interrupting a compile -------------------------------------------------------------------------------------------
_COMPILE_SCRIPT = """
import sys
import pycutlass as c
sys.path.insert(0, sys.argv[3])
from test_session_and_misuse import f16_gemm
with c.Session(target=90, cache_path=sys.argv[1], backend=sys.argv[2], progress=False).activate():
    print("START", flush=True)
    c.compiler.add_module([f16_gemm(stages) for stages in (3, 4, 5, 6)], jobs=2)  # two units of two, ~6 s each
print("FINISHED", flush=True)
"""


def _compiler_processes(marker: str, environment: str | None = None) -> list[str]:
    """Command lines of running processes containing ``marker`` (and, given ``environment``, with an environment
    entry starting with that ``NAME=value``: this test's own, not another pycutlass compile on the machine)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if environment is not None and marker in cmdline:
                if not any(item.startswith(environment.encode())
                           for item in (entry / "environ").read_bytes().split(b"\0")):
                    continue
        except OSError:
            continue
        if marker in cmdline:
            found.append(cmdline[:200])
    return found


def _interruptible() -> None:
    """The child starts with SIGINT at its default, as a terminal or Jupyter gives it: a test run launched as a
    background job (``cmd &`` in a script) ignores SIGINT, and Python keeps an inherited SIG_IGN, so the interrupt
    would never arrive."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _wait_for_workers(proc, workdir: Path) -> None:
    """Wait for this test's own compile workers (a fixed sleep raced them on machines of other speeds), then let
    the compilers get going (and write their temporary files) before the interrupt."""
    deadline = time.monotonic() + 60
    while not _compiler_processes("pycutlass.compiler.worker", f"TMPDIR={workdir}"):
        if proc.poll() is not None:
            pytest.fail(f"the compile ended before a worker was seen (exit {proc.returncode}): "
                        f"{proc.stdout.read()[-500:]} {proc.stderr.read()[-2000:]}")
        assert time.monotonic() < deadline, "no compile worker within 60 s"
        time.sleep(0.05)
    time.sleep(1.5)


def _interrupt(proc, workdir: Path, signum, writes_files: bool = True) -> float:
    """Wait for the compile to be under way, send ``signum`` to the Python process only (as Jupyter interrupts),
    and return how long it took to exit; afterwards nothing of the compile runs or remains in ``workdir``."""
    try:
        _wait_for_workers(proc, workdir)
        if writes_files:  # nvcc writes the unit's source and its tmpxft files; NVRTC compiles in memory
            assert any(workdir.rglob("*.cu")) and any(workdir.rglob("tmpxft*")), sorted(workdir.rglob("*"))
        start = time.perf_counter()
        proc.send_signal(signum)
        proc.wait(timeout=30)
        elapsed = time.perf_counter() - start
    finally:
        if proc.poll() is None:
            proc.kill()
    time.sleep(0.5)
    assert not _compiler_processes("pycutlass.compiler.worker", f"TMPDIR={workdir}")
    assert not _compiler_processes(str(workdir))
    # The units' sources and nvcc's tmpxft files (~12 MB each) went into a folder the parent removed.
    assert sorted(workdir.rglob("*")) == []
    return elapsed


@pytest.mark.slow
@pytest.mark.parametrize("backend,signum", [("nvrtc", signal.SIGINT), ("nvcc", signal.SIGINT),
                                            ("nvcc", signal.SIGTERM)])
def test_interrupt_stops_compilers_within_two_seconds_and_leaves_no_files(tmp_path, backend, signum):
    if backend == "nvcc":
        _require_nvcc()
    db = tmp_path / "cache.db"
    workdir = _compile_tmpdir(tmp_path)  # also how the test finds the compilers' processes
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "TMPDIR": str(workdir)}
    proc = subprocess.Popen([sys.executable, "-c", _COMPILE_SCRIPT, str(db), backend, str(Path(__file__).parent)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True,
                            preexec_fn=_interruptible)
    assert proc.stdout.readline().strip() == "START"
    elapsed = _interrupt(proc, workdir, signum, writes_files=backend == "nvcc")
    stderr = proc.stderr.read()
    assert "FINISHED" not in proc.stdout.read()
    if signum == signal.SIGINT:
        assert "KeyboardInterrupt" in stderr  # the Python API re-raises it
    else:
        assert proc.returncode == 128 + signal.SIGTERM and "Traceback" not in stderr, stderr
    assert elapsed < 2.0, f"the interrupt took {elapsed:.1f} s"
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT COUNT(*) FROM claims").fetchone()[0] == 0  # no claim left behind


@pytest.mark.slow
def test_an_interrupted_command_line_compile_says_so_in_one_line(tmp_path):
    _require_nvcc()
    workdir = _compile_tmpdir(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "TMPDIR": str(workdir),
           "PYCUTLASS_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.Popen([sys.executable, "-m", "pycutlass", "sweep", "--space", "sm80-f16-small", "--db",
                             str(tmp_path / "r.db"), "--compile-only", "--target", "80", "--jobs", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True,
                            preexec_fn=_interruptible)
    elapsed = _interrupt(proc, workdir, signal.SIGINT)
    stderr = proc.stderr.read()
    assert proc.returncode == 130, stderr
    assert stderr.strip().splitlines()[-1] == "interrupted" and "Traceback" not in stderr, stderr
    assert elapsed < 2.0, f"the interrupt took {elapsed:.1f} s"
