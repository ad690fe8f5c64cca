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


# ---------------------------------------------------------------------------------------------------------------
# Operation classes: f16 and bf16 kernels timed on the same shapes


def _typed_gemm(element, tile):
    import pycutlass as cutlass

    math_inst = cutlass.MathInstruction([16, 8, 16], element, element, cutlass.float32, cutlass.OpClass.TensorOp,
                                        cutlass.MathOperation.multiply_add)
    a = cutlass.TensorDescription(element, cutlass.RowMajor, 8)
    b = cutlass.TensorDescription(element, cutlass.ColumnMajor, 8)
    return cutlass.GemmOperationUniversal(80, cutlass.TileDescription(list(tile), 3, [2, 2, 1], math_inst), a, b, a,
                                          cutlass.LinearCombination(element, 8, cutlass.float32, cutlass.float32))


TILES = ((64, 64, 32), (128, 128, 32), (128, 64, 32))
SHAPES = ((16, 4096, 4096), (128, 4096, 4096), (1024, 4096, 4096), (4096, 4096, 4096))


def two_class_db(path):
    """A results DB as a sweep over f16 and bf16 kernels records it: every kernel on every shape. The bf16 kernels
    are twice as fast, so results of both classes pooled would have bf16 kernels "serve" the f16 problems."""
    import pycutlass as cutlass
    from pycutlass.tune.db import ResultsDB
    from pycutlass.tune.problems import GemmProblem

    db = ResultsDB(path)
    device = db.add_device({"name": "synthetic", "uuid": "GPU-0"})
    problems = [GemmProblem(*shape) for shape in SHAPES]
    for problem in problems:
        db.add_problem(problem)
    kernels = {}
    for element, speed in ((cutlass.float16, 1.0), (cutlass.bfloat16, 2.0)):
        for tile in TILES:
            op = _typed_gemm(element, tile)
            db.add_kernel(op, {"kind": "gemm", "threadblock_shape": list(tile)})
            kernels.setdefault(element.label, []).append(op.name)
            for problem in problems:
                # small tiles win small M, big tiles big M
                waste = math.ceil(problem.m / tile[0]) * tile[0] / problem.m
                seconds = 1e-5 * waste * (1 + 0.1 * (tile[0] < problem.m / 8)) / speed
                db.record_run(sweep="s", device=device, kernel=op.name, problem=problem.key, harness="h",
                              status="ok", seconds=seconds, flops=problem.flops)
    db.close()
    return kernels


def test_results_carry_their_class_and_selection_stays_within_it(tmp_path):
    from pycutlass.tune.db import ResultsDB
    from pycutlass.tune.select import MixedClassesError, select_per_class, split_classes

    kernels = two_class_db(tmp_path / "r.db")
    with ResultsDB(tmp_path / "r.db", read_only=True) as db:
        results = db.results()
    assert len(results) == 2 * len(TILES) * len(SHAPES)
    f16_class = "gemm A=f16/row/8 B=f16/col/8 C=f16/row/8 D=f16/row/8 acc=f32 epilogue=LinearCombination/f32"
    bf16_class = f16_class.replace("f16/", "bf16/")
    for kernel, problem, seconds in results:  # rows still unpack as triples
        assert seconds > 0
    assert {r.op_class for r in results if r[0] in kernels["float16"]} == {f16_class}
    assert {r.op_class for r in results if r[0] in kernels["bfloat16"]} == {bf16_class}

    # one answer asked for results of two classes: a typed error naming both
    for decide in (lambda: select_kernels(results, 0.98), lambda: greedy_select(results, 0.98),
                   lambda: pareto_curve(results), lambda: results_matrix(results)):
        with pytest.raises(MixedClassesError, match=r"hold 2: gemm A=b?f16/row/8 .*; gemm A=b?f16/row") as raised:
            decide()
        assert set(raised.value.classes) == {f16_class, bf16_class}

    groups = split_classes(results)
    assert list(groups) == [f16_class, bf16_class] or list(groups) == [bf16_class, f16_class]
    chosen = select_per_class(results, 0.98)
    greedy = select_per_class(results, 0.98, greedy=True)
    for op_class, dtype in ((f16_class, "float16"), (bf16_class, "bfloat16")):
        selection = chosen[op_class]
        assert selection.op_class == op_class and selection.to_dict()["op_class"] == op_class
        assert set(selection.kernels) <= set(kernels[dtype]), selection.kernels  # never a kernel of the other class
        assert set(selection.assignment.values()) <= set(kernels[dtype])
        assert len(selection.assignment) == len(SHAPES) and selection.worst >= 0.98
        assert set(greedy[op_class].kernels) <= set(kernels[dtype])
        # within the class the efficiencies are against the class's own best (the f16 ones are not 0.5)
        assert selection.worst >= 0.98


def test_a_problem_of_one_class_is_never_served_by_a_kernel_of_another():
    f16, bf16 = "gemm f16", "gemm bf16"

    @dataclass(frozen=True)
    class TypedGemm:
        m: int
        op_class: str

    class Row(tuple):
        def __new__(cls, kernel, problem, seconds, op_class):
            row = super().__new__(cls, (kernel, problem, seconds))
            row.op_class = op_class
            return row

    results = [Row("fast_bf16", TypedGemm(16, f16), 1.0, bf16),  # a bf16 kernel timed on an f16 problem
               Row("f16_a", TypedGemm(16, f16), 3.0, f16), Row("f16_b", TypedGemm(16, f16), 2.0, f16),
               Row("fast_bf16", TypedGemm(16, bf16), 1.0, bf16)]
    groups = select.split_classes(results)
    assert [r[0] for r in groups[f16]] == ["f16_a", "f16_b"] and [r[0] for r in groups[bf16]] == ["fast_bf16"]
    assert select_kernels(groups[f16], 1.0).kernels == ("f16_b",)
    # problems that name their class, with kernels that do not: the problem's class decides
    plain = [("k1", {"m": 1, "op_class": f16}, 1.0), ("k2", {"m": 1, "op_class": bf16}, 1.0)]
    assert {key: [r[0] for r in rows] for key, rows in select.split_classes(plain).items()} == {
        f16: ["k1"], bf16: ["k2"]}


def test_dispatch_tables_answer_within_the_class(tmp_path):
    from pycutlass.tune.db import ResultsDB
    from pycutlass.tune.select import select_per_class

    from pycutlass.tune.db import Result
    from pycutlass.tune.problems import GemmProblem

    kernels = two_class_db(tmp_path / "r.db")
    problems = {problem.key: problem for problem in (GemmProblem(*shape) for shape in SHAPES)}
    with ResultsDB(tmp_path / "r.db", read_only=True) as db:  # problems as objects, as the command line has them
        results = [Result(k, problems[p], t, row.op_class) for row in db.results() for k, p, t in [row]]
    chosen = select_per_class(results, 0.98)
    document = json.loads(write_dispatch_table(chosen, tmp_path / "d.json", key_fn=lambda p: p.key).read_text())
    assert set(document["classes"]) == set(chosen)
    for op_class, entry in document["classes"].items():
        dtype = "bfloat16" if "bf16" in op_class else "float16"
        assert set(entry["table"].values()) <= set(kernels[dtype]) and len(entry["table"]) == len(SHAPES)
        assert entry["min_efficiency"] == 0.98
    # one class: the single-class document, naming its class
    [(only_class, only)] = list(chosen.items())[:1]
    single = json.loads(write_dispatch_table(only, tmp_path / "one.json", key_fn=lambda p: p.key).read_text())
    assert single["op_class"] == only_class and "table" in single and "classes" not in single

    source = generate_dispatch_python(chosen, ("m", "n", "k"))
    choose = load(source)
    for op_class, selection in chosen.items():
        dtype = "bfloat16" if "bf16" in op_class else "float16"
        for problem, kernel in selection.assignment.items():
            assert choose(op_class, problem.m, problem.n, problem.k) == kernel
        assert choose(op_class, 3000, 4096, 4096) in kernels[dtype]  # a miss: nearest within the class
    with pytest.raises(ValueError, match="no kernels for operation class 'gemm A=f32'"):
        choose("gemm A=f32", 16, 16, 16)
    with pytest.raises(ArgumentError, match="op_class"):
        generate_dispatch_python(chosen, ("op_class", "m"))
    single_source = generate_dispatch_python(chosen[only_class], ("m", "n", "k"))
    assert f"OP_CLASS = {only_class!r}" in single_source
    with pytest.raises(ArgumentError, match="Selection"):
        write_dispatch_table({}, tmp_path / "x.json")


def test_cli_reports_each_class_and_writes_per_class_files(tmp_path):
    pytest.importorskip("matplotlib")
    from click.testing import CliRunner

    from pycutlass.cli import main

    kernels = two_class_db(tmp_path / "r.db")
    runner = CliRunner()
    out = runner.invoke(main, ["select", "--db", str(tmp_path / "r.db"), "--min-efficiency", "0.98",
                               "--pareto", str(tmp_path / "pareto.png"), "--dispatch-json", str(tmp_path / "d.json"),
                               "--dispatch-py", str(tmp_path / "d.py")])
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    assert lines[0] == "2 operation classes; kernels compete only within their class"
    sections = [i for i, line in enumerate(lines) if line.startswith("class gemm ")]
    assert len(sections) == 2
    for start in sections:
        dtype = "bfloat16" if "A=bf16" in lines[start] else "float16"
        listed = [line.split()[0] for line in lines[start + 2:] if line.startswith("    ")]
        listed = listed[:next((i for i, line in enumerate(lines[start + 2:]) if not line.startswith("    ")),
                              len(listed))]
        assert listed and set(listed) <= set(kernels[dtype]), (dtype, listed)
    pngs = sorted(p.name for p in tmp_path.glob("pareto-*.png"))
    assert len(pngs) == 2 and any("bf16" in name for name in pngs)
    assert set(json.loads((tmp_path / "d.json").read_text())["classes"]) == {
        lines[i][len("class "):-1] for i in sections}
    assert "def select_kernel(op_class, m, n, k)" in (tmp_path / "d.py").read_text()

    out = runner.invoke(main, ["heatmap", "--db", str(tmp_path / "r.db"), str(tmp_path / "h.png"), "--select", "0.98"])
    assert out.exit_code == 0, out.output
    written = sorted(p.name for p in tmp_path.glob("h-*.png"))
    assert len(written) == 2 and not (tmp_path / "h.png").exists(), out.output
    out = runner.invoke(main, ["db", "info", str(tmp_path / "r.db")])
    assert sum(line.startswith("class gemm ") and line.endswith(": 3 kernels") for line in out.output.splitlines()) == 2


def test_cli_single_class_output_is_unchanged(tmp_path):
    """One class: no class sections, the one dispatch table as before (now naming its class), one heatmap file."""
    from click.testing import CliRunner

    from pycutlass.cli import main
    from pycutlass.tune.db import ResultsDB

    two_class_db(tmp_path / "r.db")
    with ResultsDB(tmp_path / "r.db") as db:  # keep the f16 kernels only
        db.db.execute("delete from runs where kernel like '%bf16%'")
    out = CliRunner().invoke(main, ["select", "--db", str(tmp_path / "r.db"), "--min-efficiency", "0.98",
                                    "--dispatch-json", str(tmp_path / "d.json")])
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    assert lines[0].split(" kernels cover ")[1].startswith(f"{len(SHAPES)} problems at >= 0.98 (worst ")
    assert all(not line.startswith("class ") for line in lines)
    assert all(line.startswith("  pycutlass_gemm_sm80_") for line in lines[1:-1])
    document = json.loads((tmp_path / "d.json").read_text())
    assert set(document) == {"min_efficiency", "kernels", "table", "op_class"}
    assert all(key.startswith("gemm ") for key in document["table"])


def test_old_rows_without_a_class_get_it_from_their_parameters(tmp_path):
    """Kernel rows written before the op_class column: the class comes from the space parameters."""
    from pycutlass.tune.db import UNKNOWN_CLASS, ResultsDB
    from pycutlass.tune.space import SearchSpace

    db = ResultsDB(tmp_path / "r.db")
    built = {}
    for dtypes in ("f16_f32acc", "bf16"):
        space = SearchSpace(compute_capability=[80], dtypes=[dtypes], layouts=["rcr"],
                            threadblock_shape=[[128, 128, 32]], warp_count=[[2, 2, 1]], stages=[3])
        point = space.build()
        op = point.operations[0]
        built[dtypes] = op
        db.add_kernel(op, point.params_of(op))
    db.db.execute("update kernels set op_class = null")
    classes = db.kernel_classes()
    assert classes[built["f16_f32acc"].name].startswith("gemm A=f16/row/8 B=f16/col/8")
    assert classes[built["bf16"].name].startswith("gemm A=bf16/row/8 B=bf16/col/8")
    from tests.tune_helpers import NamedOp

    db.add_kernel(NamedOp("stand-in"), {"kind": "gemm"})
    assert db.kernel_classes()["stand-in"] == UNKNOWN_CLASS
    db.db.execute("alter table kernels drop column op_class")  # a DB written before the column existed
    db.close()
    with ResultsDB(tmp_path / "r.db", read_only=True) as old:
        assert old.kernel_classes() == {**classes, "stand-in": UNKNOWN_CLASS}


def test_cli_tune_refuses_a_space_of_two_classes(tmp_path):
    """One answer per problem is asked for: candidates of two classes are refused, naming both, and nothing is
    written."""
    from click.testing import CliRunner

    from pycutlass.cli import main

    (tmp_path / "space.toml").write_text(
        'compute_capability = 80\ndtypes = ["f16_f32acc", "bf16"]\nlayouts = "rcr"\n'
        'threadblock_shape = [[128, 128, 32]]\nwarp_count = [2, 2, 1]\nstages = [3]\n')
    out = CliRunner().invoke(main, ["tune", "--space", str(tmp_path / "space.toml"), "--problem", "gemm:64x64x64",
                                    "--db", str(tmp_path / "t.db")])
    assert out.exit_code != 0 and "Traceback" not in out.output
    assert "MixedClassesError" in out.output and "A=f16/row/8" in out.output and "A=bf16/row/8" in out.output
    assert not (tmp_path / "t.db").exists()
