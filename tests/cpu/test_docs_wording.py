"""The repository reads as a product: docs, code, tests, examples and benchmarks state what is, not when or in which
work period it was found, and the README's snippets and the examples' --help texts work as shown.

Work-period wording: numbered or ordinal "sessions", "this session" (but not "this session's dispatch" and the like,
which name a ``pycutlass.Session``), issue numbers, project seeds, paths outside the repository and dates. The
``Session`` class, "the current session", a Session object and SQLite sessions are fine.
"""
from __future__ import annotations

import ast
import builtins
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("docs", "README.md", "examples", "pycutlass", "tests", "benchmarks")
TEXT_SUFFIXES = {".md", ".py", ".toml", ".txt", ".j2", ".cuh", ".h", ".cfg", ".ini", ".rst"}
RESULTS = REPO_ROOT / "benchmarks" / "results"

_ORDINAL = ("first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth|"
            "fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth|previous|earlier|later|"
            "next|last|prior|latest")
# [\s#]+ lets a phrase run across a line break inside a comment block
WORK_PERIOD = re.compile("|".join([
    r"\bsessions?[\s#]+\d+",                                        # a numbered one
    rf"\b(?:{_ORDINAL})[\s#]+sessions?\b",                          # an ordinal one, "earlier sessions"
    r"\bthis[\s#]+session\b(?!'s\s+(?:dispatch|instance|memory)\b|\s+only\b)",
    r"\bissues?\s*#?\d+",                                           # issue numbers
    r"\bseeds?\s+00\d\b",                                           # the project's seeds
    r"\.\./shared\b",                                               # files outside the repository
]), re.IGNORECASE)
WORK_DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")
# RESULTS.md dates each stored measurement on purpose
DATES_ALLOWED = {RESULTS / "RESULTS.md"}
RESULT_NAME_PERIOD = re.compile(r"session\d*|seed\d+|issue\d+|-run\d+|-s\d+-|final|before|after", re.IGNORECASE)


def scanned_files():
    for top in SCANNED:
        path = REPO_ROOT / top
        candidates = [path] if path.is_file() else sorted(path.rglob("*"))
        for f in candidates:
            if f.is_file() and f.suffix in TEXT_SUFFIXES and f != Path(__file__).resolve() \
                    and "__pycache__" not in f.parts:
                yield f


def findings(pattern, files):
    for f in files:
        text = f.read_text(encoding="utf-8", errors="replace")
        for m in pattern.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            yield f"{f.relative_to(REPO_ROOT)}:{line}: {m.group(0)!r}"


def test_work_period_pattern_catches_what_it_should_and_spares_the_session_class():
    period = "session"  # the samples are assembled, so this file holds no diary line of its own
    caught = [f"Twelfth {period} (H100)", f"measured in {period} 15", f"{period}s 4 to 13", f"this {period}'s machine",
              "the earlier sessions", "see issue 7", "(issue #9)", "seed 000's flow", "Seed 003's autotuning",
              "`../shared/seeds/`", "the fifth\n# session's run"]
    spared = ["pycutlass.Session", "a session object", "Session(backend='nvrtc')", "the current session's dispatch",
              "this session's dispatch", "live in this session only", "one session", "sqlite3 session",
              "every session gets its own cache directory", "fuzz_run --seed 21", "seed 23 on an H100"]
    assert [s for s in caught if not WORK_PERIOD.search(s)] == []
    assert [s for s in spared if WORK_PERIOD.search(s)] == []


def test_no_work_period_wording():
    found = list(findings(WORK_PERIOD, scanned_files()))
    assert found == [], "state the fact as it is now (or move a measurement to benchmarks/results/RESULTS.md):\n" \
        + "\n".join(found)


def test_no_dates_of_work():
    found = list(findings(WORK_DATE, (f for f in scanned_files() if f not in DATES_ALLOWED)))
    assert found == [], "dates belong to the stored results (benchmarks/results/RESULTS.md):\n" + "\n".join(found)


def test_results_hold_one_summary_and_named_results_only():
    names = sorted(p.name for p in RESULTS.iterdir())
    assert "RESULTS.md" in names
    raw = [n for n in names if not n.endswith((".json", ".json.gz", ".db.gz", ".md"))]
    assert raw == [], f"raw logs and fuzz outputs do not belong in benchmarks/results/: {raw}"
    dated = [n for n in names if RESULT_NAME_PERIOD.search(n)]
    assert dated == [], f"result file names carrying a work period or a superseded run: {dated}"
    assert [p for p in RESULTS.iterdir() if p.is_dir()] == []


def test_results_md_names_every_result_file_and_only_existing_ones():
    text = (RESULTS / "RESULTS.md").read_text(encoding="utf-8")
    files = {p.name for p in RESULTS.iterdir()} - {"RESULTS.md"}
    named = set(re.findall(r"`([\w.-]+\.(?:json|json\.gz|db\.gz))`", text))
    named_in_commands = {Path(p).name for p in re.findall(r"--out (\S+)", text)}
    assert files - named == set(), "described nowhere in RESULTS.md"
    assert (named | named_in_commands) - files == set(), "RESULTS.md names files that do not exist"


def readme_python_blocks():
    text = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    return re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)


def defined_names(tree):
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
    return names


def test_readme_python_snippets_parse_and_import_the_classes_they_use():
    blocks = readme_python_blocks()
    assert len(blocks) >= 4
    known = set(dir(builtins))
    missing = []
    for i, block in enumerate(blocks):
        tree = ast.parse(block, filename=f"README.md python block {i}")
        known |= defined_names(tree)
        used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        # class-like names (and modules) must come from an import or assignment in this or an earlier snippet
        missing += [(i, name) for name in sorted(used - known) if name[0].isupper() or name in ("np", "cutlass")]
    assert missing == []


def test_readme_tuned_snippet_imports_its_names():
    (block,) = [b for b in readme_python_blocks() if "Tuned(" in b]
    tree = ast.parse(block)
    imported = {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                for alias in node.names}
    assert {"Tuned", "SearchSpace"} <= imported
    # and they are where the snippet says
    from pycutlass.tune.autotune import Tuned
    from pycutlass.tune.space import SearchSpace

    assert callable(Tuned) and hasattr(SearchSpace, "preset")


def argparse_examples():
    return sorted(p.name for p in (REPO_ROOT / "examples").glob("*.py") if "ArgumentParser(" in p.read_text())


@pytest.mark.parametrize("example", argparse_examples())
def test_example_help_describes_it_in_whole_sentences(example, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYCUTLASS_CACHE_DIR": str(tmp_path / "cache")}
    out = subprocess.run([sys.executable, str(REPO_ROOT / "examples" / example), "--help"], capture_output=True,
                         text=True, env=env, cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    description = " ".join(out.stdout.split("\n\n")[1].split())
    assert description.endswith("."), f"--help stops mid-sentence: {description!r}"
    assert not WORK_PERIOD.search(description), description
    assert list(tmp_path.iterdir()) == []                     # --help writes nothing
