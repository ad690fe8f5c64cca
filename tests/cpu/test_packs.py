"""Kernel packs on the CPU: building from a real sweep's results (compiling the selected kernels for real), the
manifest and its measurements, dispatch by class and shape, refusing damaged / foreign / mismatched packs, loading
without any compiler, wheels, the CLI and the torch dispatch's use of a pack. Launches run on the GPU host
(tests/gpu/test_packs.py)."""
from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import pycutlass
from pycutlass.errors import ArgumentError, NoGpuError
from pycutlass.pack import (CallQuery, PackCoverageError, PackDamagedError, PackSourceError, PackTargetError,
                            build_pack, build_wheel, load_pack)
from pycutlass.pack.format import MANIFEST, MANIFEST_HASH, sha256
from pycutlass.pack.launch import query_of
from pycutlass.runtime.tensors import describe
from pycutlass.tune.db import ResultsDB
from pycutlass.tune.select import select_kernels

ROOT = Path(__file__).resolve().parents[2]
# A real sweep: 204 Sm80-family f16 GEMM kernels x 28 problems (Llama-3-8B layers and squares), measured on an H100.
SWEEP = ROOT / "benchmarks" / "results" / "tune-sweep-h100.db.gz"
THRESHOLD = 0.9  # a small set (a few kernels): the compile stays short


@pytest.fixture(scope="module")
def sweep_db(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("sweep") / "sweep.db"
    path.write_bytes(gzip.decompress(SWEEP.read_bytes()))
    return path


@pytest.fixture(scope="module")
def pack_path(sweep_db, tmp_path_factory) -> Path:
    return build_pack(sweep_db, tmp_path_factory.mktemp("pack") / "llama.pack", target=90,
                      min_efficiency=THRESHOLD)


def _rewrite(source: Path, dest: Path, *, manifest=None, rehash: bool = True, binaries=None) -> Path:
    """A copy of a pack with its manifest (and hash) or binaries replaced."""
    with zipfile.ZipFile(source) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    if manifest is not None:
        members[MANIFEST] = json.dumps(manifest).encode()
        if rehash:
            members[MANIFEST_HASH] = sha256(members[MANIFEST]).encode()
    members.update(binaries or {})
    with zipfile.ZipFile(dest, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return dest


def _manifest(path: Path) -> dict:
    with zipfile.ZipFile(path) as archive:
        return json.loads(archive.read(MANIFEST))


# --- building -----------------------------------------------------------------------------------------------------
def test_build_selects_the_minimum_set_and_keeps_the_measurements(sweep_db, pack_path):
    with ResultsDB(sweep_db, read_only=True) as db:
        results = db.results()
        expected = select_kernels(results, THRESHOLD)
        seconds = {(k, p): s for k, p, s in db.results(include_baselines=True)}
    manifest = _manifest(pack_path)
    [(op_class, found)] = manifest["classes"].items()
    assert op_class == results[0].op_class
    assert sorted(manifest["kernels"]) == sorted(expected.kernels)
    assert len(found["entries"]) == len(expected.assignment) == 28
    for entry in found["entries"]:
        key = f"gemm {entry['m']}x{entry['n']}x{entry['k']}"
        assert entry["kernel"] == expected.assignment[key]
        assert entry["efficiency"] == pytest.approx(expected.efficiency[key], abs=1e-4) and entry["efficiency"] >= 0.9
        assert entry["us"] == pytest.approx(seconds[(entry["kernel"], key)] * 1e6, abs=1e-3)
        torch_us = seconds[("torch.matmul[float16->float16]", key)] * 1e6
        assert entry["torch_us"] == pytest.approx(torch_us, abs=1e-3)
        assert entry["vs_torch"] == pytest.approx(torch_us / entry["us"], rel=1e-3)
    assert found["summary"]["worst_efficiency"] == pytest.approx(expected.worst, abs=1e-4)
    assert manifest["source"]["device"]["name"] == "NVIDIA H100 80GB HBM3"
    assert manifest["target"] == {"compute_capability": 90}
    with zipfile.ZipFile(pack_path) as archive:
        for name, kernel in manifest["kernels"].items():
            assert kernel["target"] == "sm_90"  # Sm80-family templates built for the Hopper GPU's own SASS
            binary = archive.read(f"binaries/{kernel['binary_sha256']}.cubin")
            assert sha256(binary) == kernel["binary_sha256"] and len(binary) == kernel["binary_bytes"]


def test_build_refuses_what_it_cannot_pack(sweep_db, tmp_path):
    empty = tmp_path / "empty.db"
    ResultsDB(empty).close()
    with pytest.raises(ArgumentError, match="no successful run"):
        build_pack(empty, tmp_path / "x.pack", target=90)
    with pytest.raises(ArgumentError, match="no successful run on device"):
        build_pack(sweep_db, tmp_path / "x.pack", target=90, device="elsewhere")
    with pytest.raises(ArgumentError, match="is a directory"):
        build_pack(sweep_db, tmp_path, target=90, min_efficiency=THRESHOLD)
    with pytest.raises(ArgumentError, match="not a supported target|compute capability"):
        build_pack(sweep_db, tmp_path / "x.pack", target=100, min_efficiency=THRESHOLD)
    assert not list(tmp_path.glob("*.pack*"))


# --- choosing -----------------------------------------------------------------------------------------------------
def _call(pack, m, n, k, *, dtype=np.float16, b_row=False, activation=None):
    a = np.zeros((m, k), dtype)
    b = np.zeros((k, n), dtype) if b_row else np.zeros((n, k), dtype).T
    d = np.zeros((m, n), dtype)
    query, problem = query_of(describe(a, "a"), describe(b, "b"), describe(d, "out"), None, None, activation, False)
    return query, problem


def test_a_seen_shape_takes_its_entry_and_an_unseen_one_the_nearest(pack_path):
    pack = load_pack(pack_path)
    entries = {(e["m"], e["n"], e["k"]): e["kernel"]
               for e in next(iter(_manifest(pack_path)["classes"].values()))["entries"]}
    query, problem = _call(pack, 16, 4096, 4096)
    assert query == CallQuery("float16", "float16", "float16", "row", "col", (8, 8, 8), "linear_combination", None,
                              False)
    entry, how, _ = pack.choose(query, problem)
    assert (how, entry.kernel) == ("exact", entries[(16, 4096, 4096)])
    # 300 rows: the same layer (N, K) at the nearest batch size in log2 (512, not 128), not another layer
    entry, how, _ = pack.choose(*_call(pack, 300, 4096, 4096))
    assert (how, entry.kernel, entry.problem) == ("nearest", entries[(512, 4096, 4096)], (512, 4096, 4096, 1))
    exact = load_pack(pack_path, policy="exact")
    with pytest.raises(PackCoverageError, match="no entry for 300x4096x4096"):
        exact.kernel_for(*_call(exact, 300, 4096, 4096))


def test_calls_of_other_classes_are_refused_naming_what_the_pack_holds(pack_path):
    pack = load_pack(pack_path)
    for query in (_call(pack, 64, 4096, 4096, dtype=np.float32)[0],  # another type
                  _call(pack, 64, 4096, 4096, b_row=True)[0],  # B row-major: another layout
                  _call(pack, 64, 4096, 4090)[0],  # K = 4090: 2-element accesses at most, the kernels need 8
                  _call(pack, 64, 4096, 4096, activation="relu")[0]):  # another epilogue
        with pytest.raises(PackCoverageError, match="holds no kernel for .*; it holds: float16/row x float16/col"):
            pack.kernel_for(query, (64, 4096, 4096))
    with pytest.raises(ArgumentError, match="do not form"):
        query_of(describe(np.zeros((4, 8), np.float16), "a"), describe(np.zeros((4, 8), np.float16), "b"),
                 describe(np.zeros((4, 8), np.float16), "out"), None, None, None, False)


# --- refusing -----------------------------------------------------------------------------------------------------
def test_damaged_or_altered_packs_are_refused(pack_path, tmp_path):
    manifest = _manifest(pack_path)
    altered = dict(manifest, created="yesterday")
    with pytest.raises(PackDamagedError, match="does not match its recorded hash"):
        load_pack(_rewrite(pack_path, tmp_path / "altered.pack", manifest=altered, rehash=False))
    name, kernel = sorted(manifest["kernels"].items())[0]
    swapped = _rewrite(pack_path, tmp_path / "swapped.pack",
                       binaries={f"binaries/{kernel['binary_sha256']}.cubin": b"\x7fELF not the kernel"})
    pack = load_pack(swapped)  # the manifest is intact: kernels are checked when first used
    with pytest.raises(PackDamagedError, match=f"binary of {name} fails its hash check"):
        pack.operation(name)
    (tmp_path / "text.pack").write_text("not a zip")
    with pytest.raises(PackDamagedError, match="not a readable pycutlass pack"):
        load_pack(tmp_path / "text.pack")
    with pytest.raises(PackDamagedError, match="is missing"):
        load_pack(tmp_path / "absent.pack")
    with pytest.raises(PackDamagedError, match="format 'other/1'"):
        load_pack(_rewrite(pack_path, tmp_path / "other.pack", manifest=dict(manifest, format="other/1")))


def test_a_pack_for_another_gpu_is_refused(pack_path):
    pack = load_pack(pack_path)
    pack.check_compute_capability(90)
    for other in (80, 86, 89, 100):
        with pytest.raises(PackTargetError, match=f"sm_{other}, which cannot run them: build the pack with "
                                                  f"--target {other}"):
            pack.check_compute_capability(other)


def test_kernels_emitting_another_source_are_refused(pack_path, tmp_path):
    manifest = _manifest(pack_path)
    name = sorted(manifest["kernels"])[0]
    # a pack from a pycutlass whose emitter differs: each kernel's source is then emitted and compared
    other = json.loads(json.dumps(manifest))
    other["emitter"] = "0" * 64
    pack = load_pack(_rewrite(pack_path, tmp_path / "other-emitter.pack", manifest=other))
    assert pack.operation(name).name == name  # same source: accepted
    other["kernels"][name]["source_sha256"] = "1" * 64
    pack = load_pack(_rewrite(pack_path, tmp_path / "other-source.pack", manifest=other))
    with pytest.raises(PackSourceError, match=f"{name} emits a different source"):
        pack.operation(name)


# --- loading without a compiler -----------------------------------------------------------------------------------
_NO_COMPILER = r"""
import sys
sys.modules["cuda.bindings.nvrtc"] = None  # importing NVRTC fails: no compiler can run in this process
import pycutlass
from pycutlass.compiler.manager import Compiler
from pycutlass.description.target import Target

def refuse(*args, **kwargs):
    raise AssertionError("a compile was attempted")

Compiler._add = refuse
pack = pycutlass.load_pack(sys.argv[1])
for name in sorted(pack.kernels_meta):
    operation = pack.operation(name)
    kernel = Compiler.of(pack.session).compiled_for(operation, Target(90))
    assert kernel.key.startswith("adopted:") and kernel.sha256 == pack.kernels_meta[name]["binary_sha256"], kernel
print("ready", len(pack.kernels_meta))
"""


def test_a_pack_loads_every_kernel_with_no_compiler(pack_path, tmp_path):
    env = dict(os.environ, PYCUTLASS_CACHE_DIR=str(tmp_path / "empty-cache"))
    env["PATH"] = os.pathsep.join(d for d in env["PATH"].split(os.pathsep) if d and not (Path(d) / "nvcc").exists())
    env.pop("CUDA_HOME", None)
    done = subprocess.run([sys.executable, "-c", _NO_COMPILER, str(pack_path)], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["ready", str(len(_manifest(pack_path)["kernels"]))]
    assert not (tmp_path / "empty-cache").exists()  # loading writes nothing


# --- wheels -------------------------------------------------------------------------------------------------------
def test_a_pack_wheel_installs_and_is_found_by_name(pack_path, tmp_path):
    wheel = build_wheel(pack_path, name="llama-test-kernels", out_dir=tmp_path / "dist", version="1.2.0")
    assert wheel.name == "llama_test_kernels-1.2.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        assert archive.read("llama_test_kernels/kernels.pack") == pack_path.read_bytes()
        assert "[pycutlass.packs]\nllama-test-kernels = llama_test_kernels:pack_path" in \
            archive.read("llama_test_kernels-1.2.0.dist-info/entry_points.txt").decode()
    assert "llama_test_kernels-1.2.0.dist-info/RECORD" in names
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], check=True,
                   timeout=300)
    script = ("import pycutlass; found = pycutlass.packs(); print(sorted(found)); "
              "pack = pycutlass.load_pack('llama-test-kernels'); print(len(pack.kernels_meta), pack.path.name)")
    done = subprocess.run([python, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "'llama-test-kernels'" in lines[0]
    assert lines[1] == f"{len(_manifest(pack_path)['kernels'])} kernels.pack"


def test_wheel_and_load_arguments_are_checked(pack_path, tmp_path):
    with pytest.raises(ArgumentError, match="wheel name"):
        build_wheel(pack_path, name="no spaces", out_dir=tmp_path)
    with pytest.raises(ArgumentError, match="wheel version"):
        build_wheel(pack_path, name="ok", version="latest", out_dir=tmp_path)
    with pytest.raises(ArgumentError, match="no installed pack of that name"):
        load_pack("surely-not-installed")
    with pytest.raises(ArgumentError, match="takes a .pack path"):
        load_pack(42)
    with pytest.raises(ArgumentError, match="policy"):
        load_pack(pack_path, policy="closest")
    assert not list(tmp_path.iterdir())


# --- the command line ---------------------------------------------------------------------------------------------
def test_cli_build_info_wheel_and_verify(sweep_db, pack_path, tmp_path):
    from pycutlass.cli import main

    runner = CliRunner()
    out = tmp_path / "cli.pack"
    done = runner.invoke(main, ["pack", "build", "--db", str(sweep_db), "--select", str(THRESHOLD), "--target", "90",
                                str(out)])
    assert done.exit_code == 0, done.output
    assert "kernels for sm_90, 1 operation classes" in done.output and "measured on NVIDIA H100" in done.output
    assert _manifest(out)["kernels"].keys() == _manifest(pack_path)["kernels"].keys()
    done = runner.invoke(main, ["pack", "info", "--json", str(out)])
    info = json.loads(done.output)
    [(name, found)] = info["classes"].items()
    assert found["problems"] == 28 and len(found["kernels"]) == info["kernels"] and "16x4096x4096" in found["shapes"]
    done = runner.invoke(main, ["pack", "wheel", str(out), "--name", "cli-pack", "--out-dir", str(tmp_path)])
    assert done.exit_code == 0 and (tmp_path / "cli_pack-0.1.0-py3-none-any.whl").is_file()
    done = runner.invoke(main, ["pack", "build", "--target", "90", str(tmp_path / "y.pack")])
    assert done.exit_code != 0 and "give either --db" in done.output
    done = runner.invoke(main, ["pack", "build", "--space", "sm90-f16-small", "--target", "90",
                                str(tmp_path / "z.pack")])
    assert done.exit_code != 0 and "--space needs --problems" in done.output
    if pycutlass.compiler.target.detected_compute_capability(0) is None:
        done = runner.invoke(main, ["pack", "verify", str(out)])
        assert done.exit_code == 1 and "NoGpuError" in done.output
        done = runner.invoke(main, ["pack", "build", "--space", "sm90-f16-small", "--problems", "gemm:64x64x64",
                                    "--target", "90", str(tmp_path / "z.pack")])
        assert done.exit_code == 1 and "NoGpuError" in done.output  # before compiling anything
    assert not (tmp_path / "z.pack").exists()
    done = runner.invoke(main, ["pack", "list"])
    assert done.exit_code == 0


def test_verify_needs_a_gpu(pack_path):
    if pycutlass.compiler.target.detected_compute_capability(0) is not None:
        pytest.skip("a GPU is present (tests/gpu/test_packs.py verifies)")
    with pytest.raises(NoGpuError):
        load_pack(pack_path).verify()


# --- torch --------------------------------------------------------------------------------------------------------
def test_the_torch_dispatch_takes_kernels_from_a_pack_and_counts_what_it_cannot_serve(pack_path):
    pytest.importorskip("torch")
    from pycutlass.torch.dispatch import Dispatch
    from pycutlass.torch.kernels import GemmClass

    session = pycutlass.Session(target=90)
    dispatch = Dispatch.of(session)
    pack = load_pack(pack_path, session=session)
    dispatch.use_packs([pack])
    cls = GemmClass("float16", True, False, 8, "identity", False, False, 90)
    entries = {(e["m"], e["n"], e["k"]): e for e in next(iter(_manifest(pack_path)["classes"].values()))["entries"]}
    # this sweep measured cuBLAS faster than the Sm80-family kernels on the decode shapes: torch serves them
    assert entries[(16, 4096, 4096)]["vs_torch"] < 1
    assert dispatch._choose(cls, (16, 4096, 4096), "", "") == "torch"
    dispatch.configure(prefer_faster=False)
    operation = dispatch._choose(cls, (16, 4096, 4096), "", "")
    assert operation.name == entries[(16, 4096, 4096)]["kernel"]
    assert pack.stats["exact"] == 2
    for other in (GemmClass("bfloat16", True, False, 8, "identity", False, False, 90),
                  GemmClass("float16", True, False, 8, "relu", False, False, 90)):
        assert dispatch._choose(other, (16, 4096, 4096), "", "") is None  # torch runs it
    assert sum(count for why, count in dispatch.fallbacks.items() if "no loaded pack covers" in why) == 2
    dispatch.configure(fallback=False)
    with pytest.raises(ArgumentError, match="no loaded pack covers"):
        dispatch._choose(GemmClass("bfloat16", True, False, 8, "identity", False, False, 90), (16, 16, 16), "", "")
    assert not dispatch._candidates  # nothing drawn, nothing compiled: _choose never reached the candidates


def test_where_tuning_kept_torch_the_pack_says_so(pack_path, tmp_path):
    pytest.importorskip("torch")
    from pycutlass.pack import PackChoice, write_pack
    from pycutlass.torch.dispatch import Dispatch
    from pycutlass.torch.kernels import GemmClass
    from pycutlass.tune.db import operation_class
    from pycutlass.tune.space import build_operation

    name, kernel = sorted(_manifest(pack_path)["kernels"].items())[0]
    operation = build_operation(kernel["params"])
    choices = [PackChoice((64, 4096, 4096, 1), operation, kernel["params"], {}, {"us": 20.0, "vs_torch": 1.25}),
               PackChoice((128, 4096, 4096, 1), operation, kernel["params"], {}, {"us": 30.0, "vs_torch": 0.9}),
               PackChoice((4096, 4096, 4096, 1), None, None, {}, {"us": 410.0, "torch_us": 400.0})]
    path = write_pack(tmp_path / "model.pack", {operation_class(operation): choices}, target=90,
                      source={"from": "a test"})
    manifest = _manifest(path)
    assert list(manifest["kernels"]) == [name]
    entries = {(e["m"], e["kernel"]) for e in next(iter(manifest["classes"].values()))["entries"]}
    assert entries == {(64, name), (128, name), (4096, "torch")}
    pack = load_pack(path)
    query, problem = _call(pack, 4096, 4096, 4096)
    assert pack.choose(query, problem)[0].kernel == "torch"
    assert pack.kernel_for(query, problem)[0].name == name  # pack.gemm cannot run torch: the nearest kernel
    session = pycutlass.Session(target=90)
    dispatch = Dispatch.of(session)
    dispatch.use_packs([load_pack(path, session=session)])
    cls = GemmClass("float16", True, False, 8, "identity", False, False, 90)
    assert dispatch._choose(cls, (4096, 4096, 4096), "", "") == "torch"
    assert dispatch._choose(cls, (64, 4096, 4096), "", "").name == name
    assert dispatch._choose(cls, (128, 4096, 4096), "", "") == "torch"  # measured: torch 10% faster there
    dispatch.configure(prefer_faster=False)
    assert dispatch._choose(cls, (128, 4096, 4096), "", "").name == name


def _symbols(binary: bytes) -> list[tuple]:
    """(name, info, other, section, value, size) per symbol."""
    import struct

    offset = struct.unpack_from("<Q", binary, 0x28)[0]
    size, count = struct.unpack_from("<HH", binary, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", binary, offset + i * size) for i in range(count)]
    [table] = [s for s in sections if s[1] == 2]
    strings = sections[table[6]][4]
    found = []
    for i in range(table[5] // 24):
        name, *rest = struct.unpack_from("<IBBHQQ", binary, table[4] + 24 * i)
        found.append((binary[strings + name:binary.index(b"\0", strings + name)].decode(), *rest))
    return found


def test_pack_binaries_drop_only_unreferenced_local_data_symbols(pack_path, compiler_state):
    from pycutlass.compiler.elf import slim_cubin
    from pycutlass.description.target import Target
    from pycutlass.kinds import GemmOperationUniversal  # noqa: F401  (the kinds register their classes)
    from pycutlass.tune.space import build_operation

    manifest = _manifest(pack_path)
    name, kernel = sorted(manifest["kernels"].items())[0]
    compiled = compiler_state.compiled_for(build_operation(kernel["params"]), Target(90))
    with zipfile.ZipFile(pack_path) as archive:
        packed = archive.read(f"binaries/{kernel['binary_sha256']}.cubin")
    assert kernel["compiled_sha256"] == compiled.sha256 and packed == slim_cubin(compiled.binary)
    before, after = _symbols(compiled.binary), _symbols(packed)
    assert len(before) == len(after) and len(packed) == len(compiled.binary)  # indices and layout kept
    for old, new in zip(before, after):
        local_object = old[1] >> 4 == 0 and old[1] & 0xF == 1
        assert new == old or (local_object and new == ("", 0, 0, 0, 0, 0))
    assert any(s[1] >> 4 == 1 and s[1] & 0xF == 2 for s in after)  # the kernels (global functions) are kept
    # (NVRTC's SM90 cubins carry thousands of such symbols; this Sm80-family nvcc cubin may carry none)
    assert slim_cubin(b"not an ELF file") == b"not an ELF file"


def test_a_negated_torch_view_never_shares_a_seen_calls_signature():
    torch = pytest.importorskip("torch")
    from pycutlass.pack.launch import _signature

    t = torch.zeros(8, 16, dtype=torch.float16)
    assert _signature(t) == _signature(torch.ones(8, 16, dtype=torch.float16))
    assert _signature(t._neg_view()) != _signature(t)  # so it takes the full path, which refuses it
