"""Results database files that cannot be used are typed errors, and reading one never writes (not even -wal/-shm),
so a database in a read-only folder can be inspected."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from pycutlass.cli import main
from pycutlass.errors import ArgumentError, ResultsDatabaseError
from pycutlass.tune.db import ResultsDB
from tests.cpu.test_tune_bundle_cli import synthetic_db

REPO = Path(__file__).resolve().parents[2]


def fingerprint(folder: Path) -> dict:
    """Every file of a folder with its bytes and modification time."""
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(folder.iterdir())}


@pytest.fixture
def read_only_db(tmp_path):
    """A results DB (WAL journal, closed cleanly) with runs, in a folder and file made read-only."""
    folder = tmp_path / "shared"
    folder.mkdir()
    synthetic_db(folder / "r.db")
    assert sorted(p.name for p in folder.iterdir()) == ["r.db"]
    (folder / "r.db").chmod(0o444)
    folder.chmod(0o555)
    yield folder / "r.db"
    folder.chmod(0o755)


def inspect_commands(db: Path, out: Path) -> list[list[str]]:
    commands = [["db", "info", str(db)], ["select", "--db", str(db), "--min-efficiency", "0.9"],
                ["db", "export", str(db), "runs", str(out / "runs.csv")], ["db", "correlate", str(db)]]
    try:
        import matplotlib  # noqa: F401

        commands.append(["heatmap", "--db", str(db), str(out / "h.svg")])
    except ImportError:
        pass
    return commands


def test_a_text_file_is_refused_by_every_command_and_left_alone(tmp_path):
    text = tmp_path / "notes.db"
    text.write_text("hello\n")
    for read_only in (False, True):
        with pytest.raises(ResultsDatabaseError, match="is not a database: it is a text file of 6 bytes"):
            ResultsDB(text, read_only=read_only)
    runner = CliRunner()
    for command in ([["sweep", "--space", "sm80-f16-small", "--db", str(text), "--compile-only"],
                     ["db", "merge", str(text), str(text)]] + inspect_commands(text, tmp_path)):
        out = runner.invoke(main, command)
        assert out.exit_code == 1, (command, out.output)
        assert "ResultsDatabaseError" in out.output and "not a database" in out.output, (command, out.output)
        assert out.output.count("\n") == 1 and "Traceback" not in out.output
    assert text.read_text() == "hello\n" and sorted(p.name for p in tmp_path.iterdir()) == ["notes.db"]


def test_a_directory_is_refused(tmp_path):
    for read_only in (False, True):
        with pytest.raises(ResultsDatabaseError, match="is a directory.*results.db"):
            ResultsDB(tmp_path, read_only=read_only)
    assert list(tmp_path.iterdir()) == []
    assert issubclass(ResultsDatabaseError, ArgumentError)


def test_inspecting_writes_nothing(read_only_db, tmp_path):
    """Every reading command works on a read-only file in a read-only folder, and adds or changes no file there
    (a WAL database opened with plain mode=ro leaves -wal and -shm behind, and fails where it cannot create them)."""
    before = fingerprint(read_only_db.parent)
    runner = CliRunner()
    for command in inspect_commands(read_only_db, tmp_path):
        out = runner.invoke(main, command)
        assert out.exit_code == 0, (command, out.output)
        assert fingerprint(read_only_db.parent) == before, command
    assert "runs            " in runner.invoke(main, ["db", "info", str(read_only_db)]).output
    with ResultsDB(read_only_db, read_only=True) as db:
        assert db.counts()["kernels"] == 6 and len(db.results()) == db.counts()["runs"] == 27
    with ResultsDB(tmp_path / "merged.db") as merged:  # merging reads its sources read-only too
        assert merged.merge(read_only_db)["runs"] == 27
    assert fingerprint(read_only_db.parent) == before


def test_an_immutable_reader_sees_what_a_writer_adds(tmp_path):
    path = tmp_path / "r.db"
    synthetic_db(path)
    reader = ResultsDB(path, read_only=True)
    runs = reader.counts()["runs"]
    writer = ResultsDB(path)
    writer.record_run(sweep="s2", device="d", kernel="k0", problem="p", harness="h", status="ok", seconds=1.0)
    writer.close()
    assert reader.counts()["runs"] == runs + 1
    reader.close()


def without_file_privileges(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """Run ``python -m pycutlass ARGS`` so that file permissions apply: as root, without the capabilities that
    override them (setpriv); skipped where that is not possible."""
    prefix = []
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None or subprocess.run([setpriv, "--bounding-set", "-dac_override,-dac_read_search", "true"],
                                             capture_output=True).returncode != 0:
            pytest.skip("running as root without setpriv: file permissions cannot be enforced")
        prefix = [setpriv, "--bounding-set", "-dac_override,-dac_read_search"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([*prefix, sys.executable, "-m", "pycutlass", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def test_read_only_folder_is_readable_and_refuses_writes_without_privileges(read_only_db, tmp_path):
    folder = read_only_db.parent
    before = fingerprint(folder)
    for command in inspect_commands(read_only_db, tmp_path):
        done = without_file_privileges(command, tmp_path)
        assert done.returncode == 0, (command, done.stderr)
    info = without_file_privileges(["db", "info", str(read_only_db)], tmp_path)
    assert "kernels         6" in info.stdout
    synthetic_db(tmp_path / "other.db", seed=1)
    refused = {
        "is not writable (a read-only file)": ["db", "merge", str(read_only_db), str(tmp_path / "other.db")],
        f"the folder {folder} is not writable": ["db", "merge", str(folder / "new.db"), str(tmp_path / "other.db")],
    }
    for message, command in refused.items():
        done = without_file_privileges(command, tmp_path)
        assert done.returncode == 1 and message in done.stderr, (command, done.stderr)
        assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1
    assert fingerprint(folder) == before


def test_export_creates_missing_folders(tmp_path):
    synthetic_db(tmp_path / "r.db")
    out = CliRunner().invoke(main, ["db", "export", str(tmp_path / "r.db"), "runs", str(tmp_path / "a/b/runs.csv")])
    assert out.exit_code == 0, out.output
    assert (tmp_path / "a/b/runs.csv").read_text().startswith("id,")
    with ResultsDB(tmp_path / "r.db", read_only=True) as db:
        db.export("kernels", tmp_path / "c/kernels.json")
    assert (tmp_path / "c/kernels.json").read_text().startswith("[")
