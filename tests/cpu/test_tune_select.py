"""Kernel-set selection (pycutlass.tune.select) checked against brute force on small random instances."""
from __future__ import annotations

import itertools
import json
import math
import random
import subprocess
import sys
from dataclasses import dataclass

import numpy as np
import pytest

from pycutlass.errors import ArgumentError
from pycutlass.tune import select
from pycutlass.tune.select import (Selection, generate_dispatch_python, greedy_select, pareto_curve,
                                   results_matrix, select_kernels, write_dispatch_table)

pytest.importorskip("scipy")

THRESHOLDS = (0.9, 0.95, 0.98, 1.0)
TOLERANCE = 1e-6  # HiGHS's absolute MIP gap: near-ties closer than this may go either way


def random_instance(rng: random.Random) -> list[tuple[str, str, float]]:
    """3-9 kernels x 2-10 problems, times within 25% of each other (so thresholds matter), about 20% missing,
    some exact ties; every problem keeps at least one kernel."""
    kernels = [f"k{i}" for i in range(rng.randint(3, 9))]
    problems = [f"p{j}" for j in range(rng.randint(2, 10))]
    results = []
    for problem in problems:
        ran = [k for k in kernels if rng.random() > 0.2] or [rng.choice(kernels)]
        base = rng.uniform(1e-5, 1e-3)
        for kernel in ran:
            factor = 1.0 if rng.random() < 0.15 else rng.uniform(1.0, 1.25)
            results.append((kernel, problem, base * factor))
    rng.shuffle(results)
    return results


def efficiencies(results) -> dict[str, dict[str, float]]:
    """problem -> kernel -> best time / time, computed independently of the module."""
    times: dict[str, dict[str, float]] = {}
    for kernel, problem, seconds in results:
        times.setdefault(problem, {})[kernel] = min(seconds, times.get(problem, {}).get(kernel, math.inf))
    return {p: {k: min(row.values()) / t for k, t in row.items()} for p, row in times.items()}


def assigned(eff, subset) -> dict[str, float] | None:
    """Each problem's best efficiency within ``subset``; None if some problem has no kernel of it."""
    best = {}
    for problem, row in eff.items():
        values = [row[k] for k in subset if k in row]
        if not values:
            return None
        best[problem] = max(values)
    return best


def log_sum(values) -> float:
    return sum(math.log(v) for v in values)


def brute_force_select(eff, threshold):
    """(minimum size, best summed log-efficiency among the minimum sets)."""
    kernels = sorted({k for row in eff.values() for k in row})
    for size in range(1, len(kernels) + 1):
        scores = []
        for subset in itertools.combinations(kernels, size):
            if all(any(row.get(k, 0) >= threshold for k in subset) for row in eff.values()):
                scores.append(log_sum(assigned(eff, subset).values()))
        if scores:
            return size, max(scores)
    raise AssertionError("no cover")


def brute_force_pareto(eff, size):
    """(best worst-case, best geometric mean) over sets of at most ``size`` kernels that run every problem."""
    kernels = sorted({k for row in eff.values() for k in row})
    worst, geomean = -1.0, -1.0
    for r in range(1, size + 1):
        for subset in itertools.combinations(kernels, r):
            best = assigned(eff, subset)
            if best is not None:
                worst = max(worst, min(best.values()))
                geomean = max(geomean, math.exp(log_sum(best.values()) / len(best)))
    return worst, geomean


def check_selection(selection: Selection, eff, threshold, *, minimal: bool = True):
    chosen = set(selection.kernels)
    assert len(chosen) == len(selection.kernels)
    assert set(selection.assignment) == set(eff)
    for problem, kernel in selection.assignment.items():
        assert kernel in chosen
        assert selection.efficiency[problem] == pytest.approx(eff[problem][kernel], abs=1e-12)
        assert selection.efficiency[problem] >= threshold
        assert eff[problem][kernel] == max(eff[problem][k] for k in chosen if k in eff[problem])
    served = [sum(1 for k in selection.assignment.values() if k == kernel) for kernel in selection.kernels]
    assert served == sorted(served, reverse=True)
    assert min(served) >= 1 or not minimal  # greedy may keep a kernel that a later pick made redundant


def test_select_matches_brute_force_on_random_instances():
    rng = random.Random(1234)
    for case in range(240):
        results = random_instance(rng)
        threshold = THRESHOLDS[case % len(THRESHOLDS)]
        eff = efficiencies(results)
        selection = select_kernels(results, threshold, solver="scipy")
        size, best_score = brute_force_select(eff, threshold)
        assert selection.optimal
        assert len(selection.kernels) == size, (case, results)
        check_selection(selection, eff, threshold)
        # the tie-break: among minimum sets, the best summed log-efficiency
        assert log_sum(selection.efficiency.values()) >= best_score - TOLERANCE, (case, results)

        greedy = greedy_select(results, threshold)
        check_selection(greedy, eff, threshold, minimal=False)
        assert len(greedy.kernels) >= size and not greedy.optimal and greedy.solver == "greedy"


def test_greedy_is_strictly_worse_on_a_crafted_instance():
    # wide covers {p1,p2,p4,p5}; the optimum is left {p1,p2,p3} + right {p4,p5,p6}. Greedy takes wide first
    # and then needs both others.
    covers = {"wide": {"p1", "p2", "p4", "p5"}, "left": {"p1", "p2", "p3"}, "right": {"p4", "p5", "p6"}}
    results = [(kernel, problem, 1.0 if problem in covered else 2.0)
               for kernel, covered in covers.items() for problem in ("p1", "p2", "p3", "p4", "p5", "p6")]
    exact, greedy = select_kernels(results, 0.98), greedy_select(results, 0.98)
    assert set(exact.kernels) == {"left", "right"} and exact.optimal
    assert set(greedy.kernels) == {"wide", "left", "right"}
    assert greedy.kernels[-1] == "wide"  # ties on p1, p2, p4, p5 go to the first name: wide serves nothing
    assert exact.worst == greedy.worst == 1.0


def test_tie_break_prefers_the_best_geometric_mean():
    # a and b each cover both problems at >= 0.9; b is faster on p2, so {b} beats {a} though both have size 1
    results = [("a", "p1", 1.0), ("a", "p2", 1.1), ("b", "p1", 1.05), ("b", "p2", 1.0), ("c", "p1", 5.0)]
    selection = select_kernels(results, 0.9)
    assert selection.kernels == ("b",)
    assert selection.geomean == pytest.approx(math.sqrt(1 / 1.05))


def test_duplicates_keep_the_minimum_and_selection_fields():
    results = [("a", (1, 2), 3.0), ("a", (1, 2), 1.0), ("b", (1, 2), 2.0), ("b", (4, 4), 1.0)]
    problems, kernels, seconds = results_matrix(results)
    assert problems == [(1, 2), (4, 4)] and kernels == ["a", "b"]
    assert seconds[0].tolist() == [1.0, 2.0] and seconds[1, 1] == 1.0 and np.isnan(seconds[1, 0])
    selection = select_kernels(results, 0.5)
    assert selection.kernels == ("b",) and selection.worst == 0.5
    assert selection.geomean == pytest.approx(math.sqrt(0.5))
    document = json.loads(json.dumps(selection.to_dict()))
    assert document["assignment"] == {"(1, 2)": "b", "(4, 4)": "b"} and document["optimal"] is True
    # at 1.0 both kernels are needed, ordered by problems served then name
    both = select_kernels(results, 1.0)
    assert both.kernels == ("a", "b") and both.assignment == {(1, 2): "a", (4, 4): "b"}


def test_pareto_curve_matches_brute_force():
    rng = random.Random(99)
    for case in range(40):
        results = random_instance(rng)
        eff = efficiencies(results)
        curve = pareto_curve(results, solver="scipy")
        assert curve[-1].worst == 1.0 and curve[-1].geomean == pytest.approx(1.0)
        sizes = [point.size for point in curve]
        assert sizes == list(range(sizes[0], sizes[0] + len(curve)))
        for point in curve:
            worst, geomean = brute_force_pareto(eff, point.size)
            assert point.optimal
            assert point.worst == pytest.approx(worst, abs=1e-12), (case, point.size, results)
            assert point.geomean == pytest.approx(geomean, rel=TOLERANCE), (case, point.size, results)
            assert len(point.worst_kernels) <= point.size and len(point.geomean_kernels) <= point.size
            assert min(assigned(eff, point.worst_kernels).values()) == pytest.approx(point.worst)
        assert sizes[0] == 1 or brute_force_pareto(eff, sizes[0] - 1)[0] < 0  # nothing smaller runs them all
        for before, after in itertools.pairwise(curve):
            assert after.worst >= before.worst and after.geomean >= before.geomean - TOLERANCE


def test_pareto_max_size_and_to_dict():
    results = [(k, p, 1.0 if k == p.replace("p", "k") else 1.5) for k in ("k1", "k2", "k3")
               for p in ("p1", "p2", "p3")]
    curve = pareto_curve(results)
    assert [(p.size, round(p.worst, 6)) for p in curve] == [(1, 0.666667), (2, 0.666667), (3, 1.0)]
    assert len(pareto_curve(results, max_size=2)) == 2
    assert json.loads(json.dumps(curve[0].to_dict()))["size"] == 1
    only_pairs = [("a", "p1", 1.0), ("b", "p2", 1.0)]
    with pytest.raises(ArgumentError, match="fewer than 2"):
        pareto_curve(only_pairs, max_size=1)
    with pytest.raises(ArgumentError, match="max_size"):
        pareto_curve(only_pairs, max_size=0)


@pytest.mark.parametrize("results, message", [
    ([], "empty"),
    (iter(()), "empty"),
    ("abc", "iterable"),
    ([("a", "p", 0.0)], "finite number > 0"),
    ([("a", "p", -1.0)], "finite number > 0"),
    ([("a", "p", float("nan"))], "'a' on problem 'p'"),
    ([("a", "p", float("inf"))], "finite number > 0"),
    ([("a", "p", None)], "finite number > 0"),
    ([("a", "p", True)], "finite number > 0"),
    ([("a", "p")], r"results\[0\]"),
    ([(["a"], "p", 1.0)], "hashable"),
])
def test_bad_results(results, message):
    with pytest.raises(ArgumentError, match=message):
        select_kernels(results)


@pytest.mark.parametrize("threshold", [0, -0.5, 1.01, float("nan"), "0.9", True])
def test_bad_threshold(threshold):
    with pytest.raises(ArgumentError, match="min_efficiency"):
        select_kernels([("a", "p", 1.0)], threshold)
    with pytest.raises(ArgumentError, match="min_efficiency"):
        greedy_select([("a", "p", 1.0)], threshold)


def test_bad_solver_and_time_limit(monkeypatch):
    with pytest.raises(ArgumentError, match="'auto', 'scipy', 'highspy'"):
        select_kernels([("a", "p", 1.0)], solver="gurobi")
    with pytest.raises(ArgumentError, match="time_limit"):
        select_kernels([("a", "p", 1.0)], time_limit=0)
    monkeypatch.setattr(select.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ArgumentError, match="highspy package"):
        select_kernels([("a", "p", 1.0)], solver="highspy")
    assert select_kernels([("a", "p", 1.0)], solver="auto", time_limit=5).solver == "scipy"


def test_highspy_solver_agrees_with_scipy():
    pytest.importorskip("highspy")
    rng = random.Random(7)
    for _ in range(20):
        results = random_instance(rng)
        a, b = select_kernels(results, 0.95, solver="scipy"), select_kernels(results, 0.95, solver="highspy")
        assert len(a.kernels) == len(b.kernels) and b.optimal and b.solver == "highspy"
        assert b.geomean == pytest.approx(a.geomean, rel=TOLERANCE)


# ---------------------------------------------------------------------------------------------------------------
# Dispatch tables


@dataclass(frozen=True)
class Gemm:
    m: int
    n: int
    k: int
    dtype: str = "f16"


def gemm_results():
    """small_kernel wins shapes with m <= 64, big_kernel the others; each is poor on the other side."""
    results = []
    for m in (16, 48, 64, 1000, 4096):
        problem = Gemm(m, 4096, 4096)
        small = m <= 64
        results += [("small_kernel", problem, 1.0 if small else 3.0), ("big_kernel", problem, 3.0 if small else 1.0)]
    return results


def test_dispatch_table_json(tmp_path):
    selection = select_kernels(gemm_results(), 0.98)
    table = selection.dispatch_table()
    assert table["Gemm(m=16, n=4096, k=4096, dtype='f16')"] == "small_kernel"
    by_m = selection.dispatch_table(key_fn=lambda problem: problem.m)
    assert by_m == {"16": "small_kernel", "48": "small_kernel", "64": "small_kernel",
                    "1000": "big_kernel", "4096": "big_kernel"}
    path = write_dispatch_table(selection, tmp_path / "dispatch.json", key_fn=lambda problem: problem.m)
    document = json.loads(path.read_text())
    assert document["table"] == by_m and document["min_efficiency"] == 0.98
    assert sorted(document["kernels"]) == ["big_kernel", "small_kernel"]
    # problems sharing a key get the kernel best over all of them: both ran all five shapes, small_kernel is
    # at 1/3 on two of them, big_kernel on three
    assert selection.dispatch_table(key_fn=lambda problem: problem.dtype) == {"f16": "small_kernel"}


def load(source: str, name: str = "select_kernel"):
    namespace: dict = {}
    exec(compile(source, "<dispatch>", "exec"), namespace)
    return namespace[name]


def test_generated_python_exact_policy():
    selection = select_kernels(gemm_results(), 0.98)
    source = generate_dispatch_python(selection, ("m", "n", "k"))
    assert "pycutlass" not in source.split('"""', 2)[2]  # standalone: only the docstring names it
    choose = load(source)
    assert choose(16, 4096, 4096) == "small_kernel" and choose(4096, 4096, 4096) == "big_kernel"
    assert choose(20, 4096, 4096) == "small_kernel"  # a miss: nearest in log2 space (16)
    assert choose(2000, 4096, 4096) == "big_kernel"
    # tuples by position, and a one-field key
    tuples = select_kernels([(kernel, (p.m,), t) for kernel, p, t in gemm_results()], 0.98)
    one = load(generate_dispatch_python(tuples, ["m"], function_name="pick"), "pick")
    assert one(48) == "small_kernel" and one(5000) == "big_kernel"


def test_generated_python_pow2_policy():
    selection = select_kernels(gemm_results(), 0.98)
    source = generate_dispatch_python(selection, ("m", "n", "k"), policy="pow2")
    assert "(64, 4096, 4096): 'small_kernel'" in source  # 48 and 64 share the bucket 64
    assert "(1024, 4096, 4096): 'big_kernel'" in source
    choose = load(source)
    assert choose(33, 4000, 4096) == "small_kernel" and choose(600, 4096, 4096) == "big_kernel"
    assert choose(1, 1, 1) == "small_kernel" and choose(10**6, 4096, 4096) == "big_kernel"


def test_generated_python_rejects_bad_input():
    selection = select_kernels(gemm_results(), 0.98)
    with pytest.raises(ArgumentError, match="policy"):
        generate_dispatch_python(selection, ("m",), policy="nearest")
    with pytest.raises(ArgumentError, match="identifier"):
        generate_dispatch_python(selection, ("m", "class"))
    with pytest.raises(ArgumentError, match="non-empty"):
        generate_dispatch_python(selection, "m")
    with pytest.raises(ArgumentError, match="no field batch"):
        generate_dispatch_python(selection, ("m", "batch"))
    with pytest.raises(ArgumentError, match="integers"):
        generate_dispatch_python(selection, ("m", "dtype"))
    tuples = select_kernels([("a", (1, 2), 1.0)], 0.98)
    with pytest.raises(ArgumentError, match="one per key field"):
        generate_dispatch_python(tuples, ("m",))


def test_import_is_light_and_creates_no_files(tmp_path):
    code = ("import os, sys; import pycutlass.tune.select, pycutlass.tune.plots; "
            "assert 'matplotlib' not in sys.modules and 'scipy' not in sys.modules, sorted(sys.modules); "
            "assert os.listdir('.') == []")
    subprocess.run([sys.executable, "-c", code], cwd=tmp_path, check=True)


def test_solver_without_a_solution_falls_back_to_greedy(monkeypatch):
    # what a time limit that runs out before HiGHS finds any set looks like
    monkeypatch.setattr(select, "_solve", lambda model, solver, time_limit: select._Solution(None, False))
    results = random_instance(random.Random(3))
    fallback = select_kernels(results, 0.95, time_limit=0.01)
    assert not fallback.optimal
    assert fallback.kernels == greedy_select(results, 0.95).kernels
    assert not any(point.optimal for point in pareto_curve(results, time_limit=0.01))
