"""Compile here, run there: bundle export / open / adopt with hash checks (real NVRTC compiles), and the tuning
command line (help, errors, db merge/export/info, select/heatmap on a synthetic results DB)."""
from __future__ import annotations

import json
import math
import random
import sys
import zipfile

import pytest
from click.testing import CliRunner

import pycutlass as cutlass
from pycutlass.cli import main
from pycutlass.compiler.manager import Compiler
from pycutlass.tune.bundle import Bundle, BundleError, export_bundle
from pycutlass.tune.db import ResultsDB
from pycutlass.tune.problems import GemmProblem, explicit_problems
from pycutlass.tune.space import SearchSpace
from pycutlass.tune.sweep import Sweep
from tests.tune_helpers import NamedOp

TWO_TILES = {"kind": "gemm", "compute_capability": 80, "dtypes": "f16_f32acc", "layouts": "rcr",
             "threadblock_shape": [[128, 128, 32], [64, 64, 32]], "warp_count": [[2, 2, 1]], "stages": [3]}


@pytest.fixture(scope="module")
def bundle_file(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bundle")
    session = cutlass.Session(backend="nvrtc", cache_path=str(folder / "cache.db"))
    sweep = Sweep(SearchSpace.from_dict(TWO_TILES), explicit_problems([(256, 512, 128), (1000, 3000, 520)]),
                  db=folder / "compile.db", session=session)
    return export_bundle(sweep, folder / "sweep.bundle", target=90, jobs=2), sweep


@pytest.mark.slow
def test_bundle_round_trip_runs_binaries_without_a_toolchain(bundle_file, monkeypatch):
    path, sweep = bundle_file
    opened = Bundle.open(path)
    assert opened.target == "sm_90" and len(opened.manifest["kernels"]) == 2
    assert [p.key for p in opened.problems()] == [p.key for p in sweep.problems]
    assert opened.space().fingerprint == sweep.space.fingerprint
    # On the GPU host: operations rebuilt from parameters, binaries adopted; nothing may compile there.
    session = cutlass.Session(cache_path=":memory:")
    monkeypatch.setattr(Compiler, "_add", lambda *a, **k: pytest.fail("a bundle run must not compile"))
    operations = opened.adopt_into(session)
    compiler = Compiler.of(session)
    for op, kernel in zip(operations, opened.manifest["kernels"]):
        found = compiler.compiled_for(op, cutlass.Target(90))
        assert found.sha256 == kernel["binary_sha256"] and found.binary == opened.binaries[found.sha256]


@pytest.mark.slow
def test_run_bundle_gives_each_worker_a_picklable_step_that_adopts_the_binaries(bundle_file, monkeypatch, tmp_path):
    """The benchmark workers run in fresh interpreters: run_bundle hands them a picklable ``prepare_session`` that
    adopts the bundle's binaries into the worker's session (the runner itself knows nothing of bundles)."""
    import pickle

    from pycutlass.tune import bundle as bundle_module, runner

    path, _ = bundle_file
    seen = {}
    monkeypatch.setattr(runner, "run_sweep", lambda sweep, **kwargs: seen.update(kwargs) or "summary")
    monkeypatch.setattr("pycutlass.compiler.target.detected_compute_capability", lambda device=0: None)
    assert bundle_module.run_bundle(path, tmp_path / "results.db", devices=[0], progress=False) == "summary"
    prepare = pickle.loads(pickle.dumps(seen["prepare_session"]))
    session = cutlass.Session(cache_path=":memory:")
    monkeypatch.setattr(Compiler, "_add", lambda *a, **k: pytest.fail("a bundle run must not compile"))
    prepare(session)
    opened = Bundle.open(path)
    compiler = Compiler.of(session)
    for op, kernel in zip(seen["operations"], opened.manifest["kernels"]):
        assert compiler.compiled_for(op, cutlass.Target(90)).sha256 == kernel["binary_sha256"]


@pytest.mark.slow
def test_bundle_hash_checks_catch_tampering(bundle_file, tmp_path):
    path, _ = bundle_file
    with zipfile.ZipFile(path) as archive:
        entries = {name: archive.read(name) for name in archive.namelist()}

    def rewrite(name, change):
        bad = tmp_path / f"bad-{name.replace('/', '_')}.bundle"
        with zipfile.ZipFile(bad, "w") as archive:
            for entry, data in entries.items():
                archive.writestr(entry, change(data) if entry == name else data)
        return bad

    binary = next(n for n in entries if n.startswith("binaries/"))
    with pytest.raises(BundleError, match="fails its hash check"):
        Bundle.open(rewrite(binary, lambda d: d[:-1] + bytes([d[-1] ^ 1])))
    with pytest.raises(BundleError, match="does not match its hash"):
        Bundle.open(rewrite("manifest.json", lambda d: d.replace(b'"sm_90"', b'"sm_80"')))
    # A consistent manifest whose kernel source no longer matches this pycutlass is refused when run.
    manifest = json.loads(entries["manifest.json"])
    manifest["kernels"][0]["source_sha256"] = "0" * 64
    data = json.dumps(manifest).encode()
    import hashlib

    forged = tmp_path / "forged.bundle"
    with zipfile.ZipFile(forged, "w") as archive:
        for entry, content in entries.items():
            archive.writestr(entry, data if entry == "manifest.json" else
                             hashlib.sha256(data).hexdigest().encode() if entry == "manifest.sha256" else content)
    with pytest.raises(BundleError, match="different source"):
        Bundle.open(forged).operations()
    not_zip = tmp_path / "plain.bundle"
    not_zip.write_text("hello")
    with pytest.raises(BundleError, match="not a readable pycutlass bundle"):
        Bundle.open(not_zip)


def test_bundle_needs_a_target(tmp_path):
    sweep = Sweep(SearchSpace.from_dict(TWO_TILES), db=tmp_path / "r.db")
    with pytest.raises(cutlass.ArgumentError, match="explicit target"):
        export_bundle(sweep, tmp_path / "x.bundle", target=None)


# --- the command line -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("command", [["sweep"], ["tune"], ["select"], ["heatmap"], ["bundle", "export"],
                                     ["bundle", "info"], ["db", "merge"], ["db", "export"], ["db", "info"],
                                     ["db", "correlate"]])
def test_cli_help(command):
    result = CliRunner().invoke(main, [*command, "--help"])
    assert result.exit_code == 0 and "Usage" in result.output


def synthetic_db(path, kernels=6, problems=8, seed=0):
    """Runs with made-up times (a few missing pairs) and resources, as a GPU sweep would record them."""
    rng = random.Random(seed)
    db = ResultsDB(path)
    device = db.add_device({"name": "synthetic", "uuid": "GPU-0"})

    shapes = [GemmProblem(2 ** rng.randint(4, 12), 4096, 4096) for _ in range(problems)]
    shapes = list(dict.fromkeys(shapes))
    for p in shapes:
        db.add_problem(p)
    for i in range(kernels):
        db.add_kernel(NamedOp(f"k{i}"), {"kind": "gemm", "stages": 3 + i % 3})
        db.record_resources(f"k{i}", device, {"registers": 100 + 20 * i, "dynamic_smem": 40000 + 1000 * i,
                                              "threads": 128})
        for p in shapes:
            if rng.random() < 0.1 and i:
                continue
            db.record_run(sweep="s", device=device, kernel=f"k{i}", problem=p.key, harness="h", status="ok",
                          seconds=1e-4 * (1 + rng.random()) * (1 + 0.05 * i), flops=p.flops)
    db.close()
    return shapes


def test_cli_select_heatmap_db_commands(tmp_path):
    pytest.importorskip("matplotlib")
    synthetic_db(tmp_path / "a.db")
    runner = CliRunner()
    out = runner.invoke(main, ["select", "--db", str(tmp_path / "a.db"), "--min-efficiency", "0.9",
                               "--pareto", str(tmp_path / "pareto.png"), "--dispatch-json", str(tmp_path / "d.json"),
                               "--dispatch-py", str(tmp_path / "d.py")])
    assert out.exit_code == 0, out.output
    assert "kernels cover" in out.output and (tmp_path / "pareto.png").stat().st_size > 1000
    document = json.loads((tmp_path / "d.json").read_text())
    table = document["table"]
    assert set(table.values()) == set(document["kernels"]) and all(k.startswith("gemm ") for k in table)
    namespace = {}
    exec(compile((tmp_path / "d.py").read_text(), "d.py", "exec"), namespace)
    dispatch = next(v for k, v in namespace.items() if callable(v) and not k.startswith("_"))
    for key, kernel in table.items():  # the generated dispatcher agrees with the table on every problem
        m, n, k = (int(x) for x in key.split()[1].split("x"))
        assert dispatch(m, n, k) == kernel

    out = runner.invoke(main, ["heatmap", "--db", str(tmp_path / "a.db"), str(tmp_path / "h.svg"), "--select", "0.95"])
    assert out.exit_code == 0, out.output
    assert "<svg" in (tmp_path / "h.svg").read_text()[:2000]

    synthetic_db(tmp_path / "b.db", seed=1)
    out = runner.invoke(main, ["db", "merge", str(tmp_path / "all.db"), str(tmp_path / "a.db"), str(tmp_path / "b.db")])
    assert out.exit_code == 0, out.output
    again = runner.invoke(main, ["db", "merge", str(tmp_path / "all.db"), str(tmp_path / "a.db")])
    assert "0 rows added" in again.output
    out = runner.invoke(main, ["db", "info", str(tmp_path / "all.db")])
    assert "runs" in out.output
    out = runner.invoke(main, ["db", "export", str(tmp_path / "all.db"), "runs", str(tmp_path / "runs.csv")])
    assert out.exit_code == 0 and (tmp_path / "runs.csv").read_text().startswith("id,")
    out = runner.invoke(main, ["db", "correlate", str(tmp_path / "all.db"), "--scatter", str(tmp_path / "s.png")])
    assert out.exit_code == 0, out.output
    assert "registers" in out.output and (tmp_path / "s.png").exists()


def test_cli_errors_are_one_line(tmp_path):
    runner = CliRunner()
    out = runner.invoke(main, ["sweep", "--space", "no-such-preset", "--db", str(tmp_path / "r.db"), "--compile-only"])
    assert out.exit_code != 0 and "no-such-preset" in out.output and "Traceback" not in out.output
    out = runner.invoke(main, ["sweep", "--space", "sm80-f16-small", "--problems", "square:1:2", "--db",
                               str(tmp_path / "r.db")])
    assert out.exit_code != 0 and "square" in out.output
    empty = tmp_path / "empty.db"
    ResultsDB(empty).close()
    out = runner.invoke(main, ["select", "--db", str(empty)])
    assert out.exit_code != 0 and "no successful runs" in out.output
    out = runner.invoke(main, ["db", "export", str(empty), "nope", str(tmp_path / "x.csv")])
    assert out.exit_code != 0 and "unknown table" in out.output



def test_cli_checks_everything_before_creating_the_db(tmp_path, monkeypatch):
    """Usage mistakes and a missing GPU are reported before the results DB (or tune.db) is created."""
    from pycutlass.compiler.target import detected_compute_capability

    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "distributed", None)  # a scheduler must be checked before Dask is imported
    (tmp_path / "empty.toml").write_text("")
    runner = CliRunner()
    mistakes = {
        "--space is required": ["sweep", "--db", "r.db", "--compile-only"],
        "0 is not in the range x>=1": ["sweep", "--space", "sm80-f16-small", "--db", "r.db", "--jobs", "0"],
        "local cluster needs a positive number of workers": [
            "sweep", "--space", "sm80-f16-small", "--db", "r.db", "--compile-only", "--scheduler", "local:0"],
        "'bogus' is neither a local cluster nor a scheduler address; allowed: 'local' or 'local:N'": [
            "sweep", "--space", "sm80-f16-small", "--db", "r.db", "--compile-only", "--scheduler", "bogus"],
        "empty.toml is empty": ["sweep", "--space", "empty.toml", "--db", "r.db", "--compile-only"],
        "are timed on gemm problems, got a grouped_gemm problem": [
            "tune", "--space", "sm80-f16-small", "--problem", "grouped:count=4:m=64..256:n=512:k=512", "--db",
            "tune.db"],
        "--problems is required to benchmark": ["sweep", "--space", "sm80-f16-small", "--db", "r.db"],
        "'bogus' is not one of 'launch', 'kernel', 'events'": ["sweep", "--space", "sm80-f16-small", "--db", "r.db", "--timer",
                                                     "bogus"],
    }
    if detected_compute_capability() is None:
        mistakes["sweep` times kernels on a GPU"] = ["sweep", "--space", "sm80-f16-small", "--db", "r.db", "--problems",
                                           "square:256:512:256"]
        mistakes["tune` times kernels on a GPU"] = ["tune", "--space", "sm80-f16-small", "--problem", "gemm:64x64x64",
                                              "--db", "tune.db"]
    for message, command in mistakes.items():
        out = runner.invoke(main, command)
        assert out.exit_code != 0 and message in out.output, (command, out.output)
        assert "Traceback" not in out.output and isinstance(out.exception, SystemExit), (command, out.exception)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.toml"], command


def test_cli_timer_option_reaches_the_harness():
    from pycutlass.cli.tune import _bench_config

    assert _bench_config(50, 0, 1, True, 2.0).timer == "launch"
    assert _bench_config(50, 0, 1, True, 2.0, "kernel").timer == "kernel"
    assert _bench_config(50, 0, 1, True, 2.0, "events").timer == "events"


def test_cli_settle_option_reaches_the_harness_and_is_checked(tmp_path, monkeypatch):
    from pycutlass.cli.tune import _SETTLE_MS, _bench_config
    from pycutlass.tune.bench import DEFAULT_SETTLE_MS

    assert _SETTLE_MS == DEFAULT_SETTLE_MS and _bench_config(50, 0, 1, True, 2.0).settle_ms == DEFAULT_SETTLE_MS
    assert _bench_config(50, 0, 1, True, 2.0, "launch", 0.0).settle_ms == 0
    monkeypatch.chdir(tmp_path)
    out = CliRunner().invoke(main, ["sweep", "--space", "sm80-f16-small", "--db", "r.db", "--settle-ms", "-5"])
    assert out.exit_code != 0 and "--settle-ms" in out.output and "Traceback" not in out.output
    assert not list(tmp_path.iterdir())


def test_resource_correlation_ranks_a_planted_predictor(tmp_path):
    """Times that grow with registers: the report must find registers as the strongest predictor."""
    from pycutlass.tune.resources import correlation_report, resource_points

    db = ResultsDB(tmp_path / "r.db")
    device = db.add_device({"name": "synthetic"})
    rng = random.Random(3)

    problems = [GemmProblem(m, 4096, 4096) for m in (16, 256, 4096)]
    for p in problems:
        db.add_problem(p)
    for i in range(12):
        registers = 64 + 16 * i
        db.add_kernel(NamedOp(f"k{i}"), {})
        db.record_resources(f"k{i}", device, {"registers": registers, "dynamic_smem": rng.randint(1, 9) * 8192})
        for p in problems:
            db.record_run(sweep="s", device=device, kernel=f"k{i}", problem=p.key, harness="h", status="ok",
                          seconds=1e-4 * (1 + registers / 256) * (1 + 0.01 * rng.random()))
    report = correlation_report(resource_points(db))
    top = [r for r in report if r["class"] == "all"][0]
    assert top["resource"] == "registers" and top["spearman"] > 0.9 and not math.isnan(top["spearman"])


@pytest.mark.slow
def test_cli_compile_only_sweep_from_a_space_file(tmp_path, monkeypatch):
    monkeypatch.setenv("PYCUTLASS_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "space.toml").write_text(
        'compute_capability = 80\ndtypes = "f16_f32acc"\nlayouts = "rcr"\n'
        'threadblock_shape = [[128, 128, 32], [64, 64, 32]]\nwarp_count = [2, 2, 1]\nstages = [3, 12]\n')
    runner = CliRunner()
    args = ["sweep", "--space", str(tmp_path / "space.toml"), "--problems", "square:256:512:256", "--db",
            str(tmp_path / "r.db"), "--compile-only", "--target", "90", "--jobs", "2"]
    first = runner.invoke(main, args)
    assert first.exit_code == 0, first.output
    assert "2 ready (2 compiled, 0 cached)" in first.output and "pruned" in first.output
    # stderr is not a terminal: a line per compiled unit shows progress instead of a bar
    assert "pycutlass: compiled 1/2: " in first.stderr and "pycutlass: compiled 2/2: " in first.stderr, first.stderr
    again = runner.invoke(main, args)
    assert "2 ready (0 compiled, 2 cached)" in again.output, again.output
    with ResultsDB(tmp_path / "r.db", read_only=True) as db:
        assert db.counts()["problems"] == 2 and db.counts()["compile_status"] == 2


def _has_gpu() -> bool:
    from pycutlass.compiler.target import detected_compute_capability

    return detected_compute_capability(0) is not None


@pytest.mark.parametrize("command", [
    ["sweep", "--space", "sm80-f16-small", "--problems", "square:256:512:256", "--db", "{tmp}/r.db"],
    ["tune", "--space", "sm80-f16-small", "--problem", "gemm:256x512x256", "--db", "{tmp}/r.db"]])
def test_benchmarking_without_a_gpu_fails_before_compiling(tmp_path, monkeypatch, command):
    if _has_gpu():
        pytest.skip("this machine has a GPU")
    monkeypatch.setenv("PYCUTLASS_CACHE_DIR", str(tmp_path / "cache"))
    out = CliRunner().invoke(main, [arg.format(tmp=tmp_path) for arg in command])
    assert out.exit_code == 1 and "NoGpuError" in out.output and "--compile-only" in out.output, out.output
    assert "Traceback" not in out.output
    assert not (tmp_path / "cache").exists()  # nothing was compiled (nor cached)


def test_a_target_that_cannot_run_the_family_fails_before_compiling(tmp_path, monkeypatch):
    """The check `sweep --target` makes, for `bundle export` too: SM90 kernels need sm_90a."""
    monkeypatch.setenv("PYCUTLASS_CACHE_DIR", str(tmp_path / "cache"))
    runner = CliRunner()
    for command in (["sweep", "--space", "sm90-f16-small", "--db", str(tmp_path / "r.db"), "--compile-only"],
                    ["bundle", "export", "--space", "sm90-f16-small", str(tmp_path / "x.bundle")]):
        out = runner.invoke(main, [*command, "--target", "80"])
        assert out.exit_code == 1 and "DescriptionError" in out.output, out.output
        assert "sm90 template family" in out.output and "target sm_80 cannot run it" in out.output, out.output
        assert not (tmp_path / "cache").exists() and not (tmp_path / "x.bundle").exists()
    # the Python API: an explicit target is checked before anything compiles, with the same typed error
    sweep = Sweep(SearchSpace.preset("sm90-f16-small"), db=tmp_path / "api.db",
                  session=cutlass.Session(cache_path=str(tmp_path / "api-cache.db")))
    with pytest.raises(cutlass.DescriptionError, match="target sm_80 cannot run it"):
        export_bundle(sweep, tmp_path / "api.bundle", target=80)
    with pytest.raises(cutlass.DescriptionError, match="target sm_80 cannot run it"):
        Compiler.of(sweep.session).add_module(sweep.operations[:1], target=80)
    assert not (tmp_path / "api-cache.db").exists()


def test_an_unsupported_target_is_named_so_with_the_supported_ones(tmp_path):
    runner = CliRunner()
    for target in ("100", "sm_100"):
        for command in (["sweep", "--space", "sm80-f16-small", "--db", str(tmp_path / "r.db"), "--compile-only"],
                        ["bundle", "export", "--space", "sm80-f16-small", str(tmp_path / "x.bundle")]):
            out = runner.invoke(main, [*command, "--target", target])
            assert out.exit_code == 1 and "Traceback" not in out.output, out.output
            assert "compute capability 100 is not a supported target; choose one of [80, 86, 87, 89, 90]" \
                in out.output, out.output
