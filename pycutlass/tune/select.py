"""Kernel-set selection: the fewest kernels that serve every problem within an efficiency threshold.

Input is an iterable of ``(kernel, problem, seconds)`` triples (any hashable kernel and problem). The efficiency
of a kernel on a problem is ``best_time(problem) / time(kernel, problem)``; a pair that was never measured (or
failed) cannot serve that problem.

- ``select_kernels``  the exact minimum set (a set-cover integer program solved with HiGHS), ties broken by the
                      highest geometric-mean efficiency
- ``greedy_select``   the classic greedy set cover, to compare against
- ``pareto_curve``    for each set size, the best worst-case and the best geometric-mean efficiency (exact)
- dispatch tables     ``Selection.dispatch_table``, ``write_dispatch_table``, ``generate_dispatch_python``
- operation classes   ``split_classes``, ``select_per_class``: kernels compete only within their class

A result may carry an operation class (an ``op_class`` attribute, as the rows of ``ResultsDB.results`` do; a
problem may carry one the same way): an f16 kernel never serves a bf16 problem. The functions that give one answer
(``select_kernels``, ``greedy_select``, ``pareto_curve``, ``results_matrix``) refuse results of several classes with
``MixedClassesError``; split them with ``split_classes`` and decide each class on its own.

scipy (or highspy) is imported only when a solver runs. docs/kernel-selection.md has the formulation.
"""
from __future__ import annotations

import importlib.util
import json
import keyword
import math
import numbers
import operator
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ArgumentError

SOLVERS = ("auto", "scipy", "highspy")
BUCKET_POLICIES = ("exact", "pow2")


# ---------------------------------------------------------------------------------------------------------------
# Operation classes


class MixedClassesError(ArgumentError):
    """Results of several operation classes were given where one answer is asked for; ``classes`` names them."""

    def __init__(self, message: str, classes: Sequence):
        super().__init__(message)
        self.classes = tuple(classes)


def _class_attribute(value: Any) -> str | None:
    if isinstance(value, Mapping):
        found = value.get("op_class")
    else:
        found = getattr(value, "op_class", None)
    return found if isinstance(found, str) else None


def result_class(item: Any) -> str | None:
    """A result's operation class: the row's ``op_class`` (``ResultsDB.results`` rows carry it), else its
    kernel's, else its problem's; None when nothing names one."""
    found = getattr(item, "op_class", None)
    found = found if isinstance(found, str) else None
    if found is None and isinstance(item, tuple) and len(item) == 3:
        found = _class_attribute(item[0]) or _class_attribute(item[1])
    return found


def split_classes(results: Iterable) -> dict:
    """``{operation class: [results of that class]}`` in first-seen order (one ``None`` key when no result names
    a class). A result whose problem names another class than its kernel is left out: a kernel competes only on
    problems of its own class."""
    if isinstance(results, (str, bytes)) or not isinstance(results, Iterable):
        raise ArgumentError(f"results must be an iterable of (kernel, problem, seconds) triples, "
                            f"not {type(results).__name__}")
    groups: dict = {}
    for item in results:
        op_class = result_class(item)
        if op_class is not None and isinstance(item, tuple) and len(item) == 3:
            wanted = _class_attribute(item[1])
            if wanted is not None and wanted != op_class:
                continue
        groups.setdefault(op_class, []).append(item)
    return groups


def _one_class(results: Iterable, what: str) -> tuple[list, str | None]:
    """The results as a list and their single class; MixedClassesError when they hold several."""
    groups = split_classes(results)
    if len(groups) > 1:
        named = [str(name) for name in groups]
        raise MixedClassesError(
            f"{what} answers for one operation class, and the results hold {len(groups)}: "
            f"{'; '.join(named)}. A kernel competes only with kernels of its class: split the results with "
            f"split_classes() (or select_per_class()) and decide each class on its own", named)
    if not groups:
        return [], None
    [(op_class, items)] = groups.items()
    return items, op_class


# ---------------------------------------------------------------------------------------------------------------
# Results


@dataclass(frozen=True)
class _Table:
    """Validated results: problems and kernels in first-seen order, seconds[p, k] (NaN = not measured) and the
    efficiency matrix derived from it."""

    problems: tuple
    kernels: tuple
    seconds: np.ndarray
    efficiency: np.ndarray


def _valid_seconds(kernel: Any, problem: Any, seconds: Any) -> float:
    if isinstance(seconds, bool) or not isinstance(seconds, numbers.Real):
        raise ArgumentError(f"seconds for kernel {kernel!r} on problem {problem!r} is {seconds!r}; "
                            f"it must be a finite number > 0")
    value = float(seconds)
    if not math.isfinite(value) or value <= 0:
        raise ArgumentError(f"seconds for kernel {kernel!r} on problem {problem!r} is {value!r}; "
                            f"it must be a finite number > 0")
    return value


def _table(results: Iterable[tuple[Hashable, Hashable, float]], what: str = "selection") -> _Table:
    results, _ = _one_class(results, what)
    best: dict[tuple, float] = {}
    problem_index: dict = {}
    kernel_index: dict = {}
    for position, item in enumerate(results):
        try:
            kernel, problem, seconds = item
            hash(kernel), hash(problem)
        except (TypeError, ValueError):
            raise ArgumentError(f"results[{position}] is {item!r}; each result must be a (kernel, problem, "
                                f"seconds) triple with hashable kernel and problem") from None
        value = _valid_seconds(kernel, problem, seconds)
        kernel_index.setdefault(kernel, len(kernel_index))
        problem_index.setdefault(problem, len(problem_index))
        key = (problem_index[problem], kernel_index[kernel])
        best[key] = min(value, best.get(key, math.inf))  # a pair measured twice keeps its best time
    if not best:
        raise ArgumentError("results is empty; give at least one (kernel, problem, seconds) triple")
    seconds = np.full((len(problem_index), len(kernel_index)), np.nan)
    for (p, k), value in best.items():
        seconds[p, k] = value
    return _Table(tuple(problem_index), tuple(kernel_index), seconds, efficiency_matrix(seconds))


def results_matrix(results: Iterable[tuple[Hashable, Hashable, float]]) -> tuple[list, list, np.ndarray]:
    """``(problems, kernels, seconds)``: both lists in first-seen order and a ``len(problems) x len(kernels)``
    array of seconds, NaN where a kernel was not measured on a problem (a pair listed twice keeps its minimum)."""
    table = _table(results, "results_matrix")
    return list(table.problems), list(table.kernels), table.seconds.copy()


def efficiency_matrix(seconds: np.ndarray) -> np.ndarray:
    """Each row divided into its best time: 1.0 for the fastest kernel of a problem, NaN where not measured."""
    seconds = np.asarray(seconds, dtype=float)
    if seconds.ndim != 2:
        raise ArgumentError(f"seconds must be a 2-D problems x kernels array, not {seconds.ndim}-D")
    with np.errstate(all="ignore"):
        best = np.nanmin(np.where(np.isnan(seconds), np.inf, seconds), axis=1, keepdims=True)
        return best / seconds


# ---------------------------------------------------------------------------------------------------------------
# Argument checks


def _check_threshold(min_efficiency: Any) -> float:
    if isinstance(min_efficiency, bool) or not isinstance(min_efficiency, numbers.Real) \
            or not 0 < float(min_efficiency) <= 1:
        raise ArgumentError(f"min_efficiency is {min_efficiency!r}; it must be a number in (0, 1] "
                            f"(1.0 keeps only each problem's fastest kernels)")
    return float(min_efficiency)


def _check_time_limit(time_limit: Any) -> float | None:
    if time_limit is None:
        return None
    if isinstance(time_limit, bool) or not isinstance(time_limit, numbers.Real) \
            or not (math.isfinite(time_limit) and time_limit > 0):
        raise ArgumentError(f"time_limit is {time_limit!r}; it must be None or a number of seconds > 0")
    return float(time_limit)


def _check_solver(solver: Any) -> str:
    """The backend to use: "scipy" or "highspy" ("auto" = highspy when importable)."""
    if solver not in SOLVERS:
        raise ArgumentError(f"solver is {solver!r}; it must be one of {', '.join(map(repr, SOLVERS))}")
    if solver == "scipy":
        return solver
    if importlib.util.find_spec("highspy") is not None:
        return "highspy"
    if solver == "highspy":
        raise ArgumentError("solver='highspy' needs the highspy package, which is not installed; "
                            "install it or use solver='scipy' (HiGHS inside scipy)")
    return "scipy"


# ---------------------------------------------------------------------------------------------------------------
# Mixed-integer programs (minimize cost @ x, row_lower <= A x <= row_upper, lower <= x <= upper)


@dataclass(frozen=True)
class _Milp:
    cost: np.ndarray
    integral: np.ndarray  # bool per variable
    upper: np.ndarray  # every variable is >= 0
    rows: np.ndarray  # COO triplets of A
    cols: np.ndarray
    values: np.ndarray
    row_lower: np.ndarray
    row_upper: np.ndarray


@dataclass(frozen=True)
class _Solution:
    x: np.ndarray | None  # None: no feasible point found (within the time limit)
    optimal: bool


def _solve_scipy(model: _Milp, time_limit: float | None) -> _Solution:
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import csc_array

    matrix = csc_array((model.values, (model.rows, model.cols)), shape=(len(model.row_lower), len(model.cost)))
    # mip_rel_gap=0: the tie-break objectives must be solved to optimality, not to HiGHS's default 0.01%
    options: dict[str, Any] = {"mip_rel_gap": 0.0, "presolve": True}
    if time_limit is not None:
        options["time_limit"] = time_limit
    result = milp(model.cost, integrality=model.integral.astype(int), bounds=Bounds(0, model.upper),
                  constraints=LinearConstraint(matrix, model.row_lower, model.row_upper), options=options)
    return _Solution(None if result.x is None else np.asarray(result.x), result.status == 0)


def _solve_highspy(model: _Milp, time_limit: float | None) -> _Solution:
    import highspy

    order = np.lexsort((model.rows, model.cols))  # HiGHS takes the matrix column-wise
    starts = np.concatenate(([0], np.cumsum(np.bincount(model.cols, minlength=len(model.cost)))))
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = len(model.cost), len(model.row_lower)
    lp.col_cost_ = model.cost.astype(float)
    lp.col_lower_ = np.zeros(len(model.cost))
    lp.col_upper_ = model.upper.astype(float)
    lp.row_lower_ = model.row_lower.astype(float)
    lp.row_upper_ = model.row_upper.astype(float)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = starts.astype(np.int32)
    lp.a_matrix_.index_ = model.rows[order].astype(np.int32)
    lp.a_matrix_.value_ = model.values[order].astype(float)
    lp.integrality_ = [highspy.HighsVarType.kInteger if flag else highspy.HighsVarType.kContinuous
                       for flag in model.integral]
    solver = highspy.Highs()
    solver.setOptionValue("output_flag", False)
    solver.setOptionValue("mip_rel_gap", 0.0)
    if time_limit is not None:
        solver.setOptionValue("time_limit", time_limit)
    solver.passModel(lp)
    solver.run()
    status = solver.getModelStatus()
    feasible = solver.getInfo().primal_solution_status == 2  # kSolutionStatusFeasible
    x = np.asarray(solver.getSolution().col_value) if feasible else None
    return _Solution(x, status == highspy.HighsModelStatus.kOptimal and x is not None)


def _solve(model: _Milp, solver: str, time_limit: float | None) -> _Solution:
    return (_solve_highspy if solver == "highspy" else _solve_scipy)(model, time_limit)


def _cover_model(eligible: np.ndarray) -> _Milp:
    """Set cover: binary x_k, minimize sum x_k, every problem has an eligible kernel."""
    rows, cols = np.nonzero(eligible)
    n_problems, n_kernels = eligible.shape
    return _Milp(cost=np.ones(n_kernels), integral=np.ones(n_kernels, bool), upper=np.ones(n_kernels),
                 rows=rows, cols=cols, values=np.ones(len(rows)),
                 row_lower=np.ones(n_problems), row_upper=np.full(n_problems, np.inf))


def _assignment_model(efficiency: np.ndarray, eligible: np.ndarray, max_kernels: int) -> _Milp:
    """At most ``max_kernels`` kernels (binary x_k); each problem assigned (y_kp, continuous: with x fixed the
    assignment is integral anyway) to one eligible chosen kernel; maximize the sum of log-efficiencies."""
    n_problems, n_kernels = eligible.shape
    pair_problem, pair_kernel = np.nonzero(eligible)
    n_pairs = len(pair_problem)
    y = n_kernels + np.arange(n_pairs)  # variable index of each pair
    # rows: [0, P) sum_k y_kp = 1 | [P, P + pairs) y_kp - x_k <= 0 | last: sum_k x_k <= max_kernels
    link = n_problems + np.arange(n_pairs)
    budget = n_problems + n_pairs
    rows = np.concatenate((pair_problem, link, link, np.full(n_kernels, budget)))
    cols = np.concatenate((y, y, pair_kernel, np.arange(n_kernels)))
    values = np.concatenate((np.ones(n_pairs), np.ones(n_pairs), -np.ones(n_pairs), np.ones(n_kernels)))
    row_lower = np.concatenate((np.ones(n_problems), np.full(n_pairs, -np.inf), [-np.inf]))
    row_upper = np.concatenate((np.ones(n_problems), np.zeros(n_pairs), [max_kernels]))
    cost = np.concatenate((np.zeros(n_kernels), -np.log(efficiency[pair_problem, pair_kernel])))
    integral = np.concatenate((np.ones(n_kernels, bool), np.zeros(n_pairs, bool)))
    return _Milp(cost, integral, np.ones(n_kernels + n_pairs), rows, cols, values, row_lower, row_upper)


def _undominated(scores: np.ndarray) -> np.ndarray:
    """Kernel columns worth keeping: a column that another kept one matches or beats on every problem can be
    swapped for it in any solution without loss, so dropping it keeps the optimum exact and the model small.
    Columns are visited by decreasing total, so every dominator comes before what it dominates."""
    order = np.argsort(-scores.sum(axis=0), kind="stable")
    kept: list[int] = []
    for column in order:
        if not kept or not (scores[:, kept] >= scores[:, [column]]).all(axis=0).any():
            kept.append(int(column))
    return np.array(sorted(kept), dtype=int)


def _chosen(x: np.ndarray, columns: np.ndarray) -> list[int]:
    return [int(columns[i]) for i in np.flatnonzero(x[:len(columns)] > 0.5)]


def _min_cover(eligible: np.ndarray, solver: str, time_limit: float | None) -> tuple[list[int] | None, bool]:
    columns = _undominated(eligible.astype(float))  # for coverage only eligibility matters
    solution = _solve(_cover_model(eligible[:, columns]), solver, time_limit)
    return (None if solution.x is None else _chosen(solution.x, columns)), solution.optimal


def _best_assignment(efficiency: np.ndarray, eligible: np.ndarray, max_kernels: int, solver: str,
                     time_limit: float | None) -> tuple[list[int] | None, bool]:
    columns = _undominated(np.where(eligible, efficiency, 0.0))
    model = _assignment_model(efficiency[:, columns], eligible[:, columns], max_kernels)
    solution = _solve(model, solver, time_limit)
    return (None if solution.x is None else _chosen(solution.x, columns)), solution.optimal


# ---------------------------------------------------------------------------------------------------------------
# Selections


def _name_order(value: Any) -> str:
    return str(value)


@dataclass(frozen=True)
class Selection:
    """A kernel set and the kernel each problem runs.

    ``kernels`` is ordered by how many problems each serves (most first), then by name; ``assignment`` maps
    every problem to the fastest kernel of the set on it and ``efficiency`` to that kernel's efficiency;
    ``efficiency_by_kernel`` holds every selected kernel's efficiency on every problem it ran (used to merge
    problems that share a dispatch key). ``optimal`` says the solver proved the set minimum and its tie-break
    best; ``solver`` is "scipy", "highspy" or "greedy"; ``op_class`` is the results' operation class (None when
    they named none)."""

    kernels: tuple
    assignment: dict
    efficiency: dict
    min_efficiency: float
    optimal: bool
    solver: str
    efficiency_by_kernel: dict = field(repr=False)
    op_class: str | None = None

    @property
    def worst(self) -> float:
        return min(self.efficiency.values())

    @property
    def geomean(self) -> float:
        return math.exp(sum(math.log(value) for value in self.efficiency.values()) / len(self.efficiency))

    def to_dict(self) -> dict:
        """JSON-able: kernels and problems as their str()."""
        return {
            "kernels": [str(kernel) for kernel in self.kernels],
            "assignment": {str(p): str(k) for p, k in self.assignment.items()},
            "efficiency": {str(p): value for p, value in self.efficiency.items()},
            "min_efficiency": self.min_efficiency,
            "worst": self.worst,
            "geomean": self.geomean,
            "optimal": self.optimal,
            "solver": self.solver,
            **({"op_class": self.op_class} if self.op_class is not None else {}),
        }

    def dispatch_table(self, key_fn: Callable[[Any], Any] | None = None) -> dict[str, str]:
        """``{key: kernel name}`` with key = str(key_fn(problem)) (str(problem) by default). Problems that share
        a key get the selected kernel best over all of them (see ``_merge_kernel``)."""
        key_of = (lambda problem: str(problem)) if key_fn is None else (lambda problem: str(key_fn(problem)))
        return {key: str(kernel) for key, kernel in self._grouped(key_of).items()}

    def _grouped(self, key_of: Callable[[Any], Any]) -> dict:
        groups: dict = {}
        for problem in self.assignment:
            groups.setdefault(key_of(problem), []).append(problem)
        return {key: _merge_kernel(self, problems) for key, problems in groups.items()}


def _merge_kernel(selection: Selection, problems: list) -> Any:
    """The kernel for problems that share a dispatch key: the selected kernel that ran the most of them, then
    the highest summed log-efficiency over them, then the first by name."""
    def score(kernel: Any) -> tuple:
        ran = [selection.efficiency_by_kernel[p][kernel] for p in problems
               if kernel in selection.efficiency_by_kernel[p]]
        return (-len(ran), -sum(math.log(value) for value in ran), str(kernel))

    return min(selection.kernels, key=score)


def _selection(table: _Table, chosen: Iterable[int], min_efficiency: float, optimal: bool,
               solver: str, op_class: str | None = None) -> Selection:
    chosen = list(chosen)
    assignment, efficiency, by_kernel = {}, {}, {}
    served: dict[int, int] = dict.fromkeys(chosen, 0)
    for p, problem in enumerate(table.problems):
        ran = {k: float(table.efficiency[p, k]) for k in chosen if not np.isnan(table.efficiency[p, k])}
        best = min(ran, key=lambda k: (-ran[k], str(table.kernels[k])))  # fastest; equal times: first by name
        served[best] += 1
        assignment[problem] = table.kernels[best]
        efficiency[problem] = ran[best]
        by_kernel[problem] = {table.kernels[k]: value for k, value in ran.items()}
    order = sorted(chosen, key=lambda k: (-served[k], str(table.kernels[k])))
    return Selection(tuple(table.kernels[k] for k in order), assignment, efficiency, min_efficiency, optimal,
                     solver, by_kernel, op_class)


def _eligible(table: _Table, threshold: float) -> np.ndarray:
    return np.nan_to_num(table.efficiency, nan=0.0) >= threshold


def select_kernels(results: Iterable[tuple[Hashable, Hashable, float]], min_efficiency: float = 0.98, *,
                   solver: str = "auto", time_limit: float | None = None) -> Selection:
    """The minimum set of kernels that runs every problem at ``min_efficiency`` or better, solved exactly.

    First the set cover (binary x_k, minimize sum x_k, each problem has an eligible chosen kernel); then, with
    the size fixed, the set whose assignment maximizes the summed log-efficiency (the geometric mean). Each
    problem then runs the fastest kernel of the set. ``solver``: "scipy" (``scipy.optimize.milp``), "highspy",
    or "auto" (highspy when installed). ``time_limit`` bounds each solver call, in seconds; when it stops a
    solve early the best set found is returned with ``optimal=False`` (the greedy set if none was found)."""
    min_efficiency = _check_threshold(min_efficiency)
    backend, time_limit = _check_solver(solver), _check_time_limit(time_limit)
    results, op_class = _one_class(results, "select_kernels")
    table = _table(results)
    eligible = _eligible(table, min_efficiency)
    cover, optimal = _min_cover(eligible, backend, time_limit)
    if cover is None:
        return _greedy(table, min_efficiency, solver=backend, optimal=False, op_class=op_class)
    best, tie_break_optimal = _best_assignment(table.efficiency, eligible, len(cover), backend, time_limit)
    if best is not None and len(best) <= len(cover):
        cover, optimal = best, optimal and tie_break_optimal
    else:
        optimal = False
    return _selection(table, cover, min_efficiency, optimal, backend, op_class)


def select_per_class(results: Iterable[tuple[Hashable, Hashable, float]], min_efficiency: float = 0.98, *,
                     greedy: bool = False, **options) -> dict:
    """``{operation class: Selection}``: ``select_kernels`` (or ``greedy_select``) within each class of
    ``split_classes(results)``, so no kernel covers a problem of another class."""
    _check_threshold(min_efficiency)
    groups = split_classes(results)
    if not groups:
        raise ArgumentError("results is empty; give at least one (kernel, problem, seconds) triple")
    if greedy:
        return {op_class: greedy_select(items, min_efficiency) for op_class, items in groups.items()}
    return {op_class: select_kernels(items, min_efficiency, **options) for op_class, items in groups.items()}


def _greedy(table: _Table, min_efficiency: float, *, solver: str = "greedy", optimal: bool = False,
            op_class: str | None = None) -> Selection:
    eligible = _eligible(table, min_efficiency)
    uncovered = np.ones(len(table.problems), bool)
    chosen: list[int] = []
    names = np.array([str(kernel) for kernel in table.kernels])
    by_name = np.argsort(names, kind="stable")
    scores = np.where(eligible, table.efficiency, 0.0)
    while uncovered.any():
        newly = eligible & uncovered[:, None]
        counts = newly.sum(axis=0)
        means = np.where(newly, scores, 0.0).sum(axis=0) / np.maximum(counts, 1)
        # most newly covered problems, then the highest mean efficiency on them, then the first by name
        best = int(by_name[np.lexsort((-means[by_name], -counts[by_name]))[0]])
        chosen.append(best)
        uncovered &= ~eligible[:, best]
    return _selection(table, chosen, min_efficiency, optimal, solver, op_class)


def greedy_select(results: Iterable[tuple[Hashable, Hashable, float]], min_efficiency: float = 0.98) -> Selection:
    """The classic greedy set cover, for comparison with ``select_kernels``: repeatedly take the kernel that
    covers the most uncovered problems (ties: the higher mean efficiency on them). ``optimal`` is False."""
    min_efficiency = _check_threshold(min_efficiency)
    results, op_class = _one_class(results, "greedy_select")
    return _greedy(_table(results), min_efficiency, op_class=op_class)


# ---------------------------------------------------------------------------------------------------------------
# Pareto curve


@dataclass(frozen=True)
class ParetoPoint:
    """With ``size`` kernels at most: the best achievable worst-case efficiency (``worst``, reached by
    ``worst_kernels``, which among such sets has the best geometric mean) and, separately, the best achievable
    geometric-mean efficiency (``geomean``, reached by ``geomean_kernels``). ``optimal``: every solve proved."""

    size: int
    worst: float
    geomean: float
    worst_kernels: tuple
    geomean_kernels: tuple
    optimal: bool

    def to_dict(self) -> dict:
        return {"size": self.size, "worst": self.worst, "geomean": self.geomean,
                "worst_kernels": [str(k) for k in self.worst_kernels],
                "geomean_kernels": [str(k) for k in self.geomean_kernels], "optimal": self.optimal}


def pareto_curve(results: Iterable[tuple[Hashable, Hashable, float]], *, max_size: int | None = None,
                 solver: str = "auto", time_limit: float | None = None) -> list[ParetoPoint]:
    """One point per set size, from the fewest kernels that run every problem at all up to the size that runs
    each problem at efficiency 1.0 (or ``max_size``).

    Worst case: the minimum cover size is monotone in the threshold, so for each size a bisection over the
    sorted distinct efficiencies finds the highest threshold coverable (O(log(pairs)) set-cover solves per size,
    memoized), then one assignment solve picks the best-geomean set at it. Geometric mean: one assignment solve
    (max summed log-efficiency, at most ``size`` kernels) per size. Every solve is an NP-hard integer program
    that HiGHS handles quickly for hundreds of kernels and problems; ``time_limit`` bounds each solver call."""
    backend, time_limit = _check_solver(solver), _check_time_limit(time_limit)
    if max_size is not None and (isinstance(max_size, bool) or not isinstance(max_size, numbers.Integral)
                                 or max_size < 1):
        raise ArgumentError(f"max_size is {max_size!r}; it must be None or an integer >= 1")
    table = _table(results, "pareto_curve")
    thresholds = np.unique(table.efficiency[~np.isnan(table.efficiency)])  # ascending, ends at 1.0
    covers: dict[int, tuple[list[int], bool]] = {}

    def cover_at(index: int) -> tuple[list[int], bool]:
        if index not in covers:
            chosen, optimal = _min_cover(_eligible(table, thresholds[index]), backend, time_limit)
            if chosen is None:  # out of time without a solution: the greedy cover bounds the size
                chosen = [table.kernels.index(k) for k in _greedy(table, thresholds[index]).kernels]
            covers[index] = (chosen, optimal)
        return covers[index]

    smallest, largest = len(cover_at(0)[0]), len(cover_at(len(thresholds) - 1)[0])
    if max_size is not None and max_size < smallest:
        raise ArgumentError(f"max_size is {max_size}; no set of fewer than {smallest} kernels runs every problem")
    last_size = largest if max_size is None else min(largest, max_size)
    points, low = [], 0
    for size in range(smallest, last_size + 1):
        high = len(thresholds) - 1
        while low < high:  # the highest threshold index whose minimum cover has at most `size` kernels
            middle = (low + high + 1) // 2
            if len(cover_at(middle)[0]) <= size:
                low = middle
            else:
                high = middle - 1
        worst_set, proved = _best_set(table, _eligible(table, thresholds[low]), size, cover_at(low)[0],
                                      backend, time_limit)
        geomean_set, geomean_proved = _best_set(table, ~np.isnan(table.efficiency), size, worst_set,
                                                backend, time_limit)
        worst_selection = _selection(table, worst_set, float(thresholds[low]), proved, backend)
        geomean_selection = _selection(table, geomean_set, 0.0, geomean_proved, backend)
        optimal = proved and geomean_proved and all(covers[i][1] for i in covers)
        points.append(ParetoPoint(size, worst_selection.worst, geomean_selection.geomean, worst_selection.kernels,
                                  geomean_selection.kernels, optimal))
    return points


def _best_set(table: _Table, eligible: np.ndarray, size: int, fallback: list[int], solver: str,
              time_limit: float | None) -> tuple[list[int], bool]:
    """The set of at most ``size`` kernels with the best summed log-efficiency on eligible pairs."""
    chosen, optimal = _best_assignment(table.efficiency, eligible, size, solver, time_limit)
    return (fallback, False) if chosen is None else (chosen, optimal)


# ---------------------------------------------------------------------------------------------------------------
# Dispatch tables


def _selections(selection: Selection | Mapping) -> dict:
    """``{operation class: Selection}`` from one Selection or a mapping of them (``select_per_class``)."""
    if isinstance(selection, Selection):
        return {selection.op_class: selection}
    if isinstance(selection, Mapping) and selection and all(isinstance(v, Selection) for v in selection.values()):
        for op_class, chosen in selection.items():
            if chosen.op_class is not None and chosen.op_class != op_class:
                raise ArgumentError(f"the selection under class {op_class!r} was made for class "
                                    f"{chosen.op_class!r}")
        return dict(selection)
    raise ArgumentError(f"selection is a {type(selection).__name__}; give a Selection or a non-empty "
                        f"{{operation class: Selection}} mapping (select_per_class returns one)")


def _table_document(selection: Selection, key_fn) -> dict:
    return {"min_efficiency": selection.min_efficiency, "kernels": [str(k) for k in selection.kernels],
            "table": selection.dispatch_table(key_fn)}


def write_dispatch_table(selection: Selection | Mapping, path: str | Path, *,
                         key_fn: Callable[[Any], Any] | None = None) -> Path:
    """Write ``{"min_efficiency", "kernels", "table": {key: kernel}}`` as JSON (see ``Selection.dispatch_table``),
    with ``"op_class"`` when the selection has one, and return the path. For several operation classes (a
    ``{class: Selection}`` mapping) the document is ``{"classes": {class: {"min_efficiency", "kernels",
    "table"}}}``: a problem's kernel is looked up in its own class's table."""
    path = Path(path)
    selections = _selections(selection)
    if len(selections) == 1:
        [(op_class, only)] = selections.items()
        document = _table_document(only, key_fn)
        if op_class is not None:
            document["op_class"] = op_class
    else:
        document = {"classes": {str(op_class): _table_document(chosen, key_fn)
                                for op_class, chosen in selections.items()}}
    path.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    return path


def _field_values(problem: Any, key_fields: Sequence[str]) -> tuple[int, ...]:
    """A problem's key: a mapping by field name, a tuple/list positionally (one item per field), else
    attributes of that name (dataclasses, GemmCoord-like objects)."""
    if isinstance(problem, Mapping):
        missing = [name for name in key_fields if name not in problem]
        values = [problem.get(name) for name in key_fields]
    elif isinstance(problem, (tuple, list)) and not hasattr(problem, "_fields"):
        if len(problem) != len(key_fields):
            raise ArgumentError(f"problem {problem!r} has {len(problem)} items; a tuple problem needs one per key "
                                f"field ({', '.join(key_fields)})")
        missing, values = [], list(problem)
    else:
        missing = [name for name in key_fields if not hasattr(problem, name)]
        values = [getattr(problem, name, None) for name in key_fields]
    if missing:
        raise ArgumentError(f"problem {problem!r} has no field {', '.join(missing)}; problems must be dicts, "
                            f"tuples with one item per key field, or objects with those attributes")
    try:
        ints = tuple(operator.index(value) for value in values)
    except TypeError:
        raise ArgumentError(f"problem {problem!r} has key values {values!r}; they must be integers") from None
    if any(value < 0 for value in ints):
        raise ArgumentError(f"problem {problem!r} has key values {ints!r}; they must be >= 0")
    return ints


def _pow2(value: int) -> int:
    return 1 << max(0, (value - 1).bit_length())


def generate_dispatch_python(selection: Selection | Mapping, key_fields: Sequence[str], *,
                             function_name: str = "select_kernel", policy: str = "exact") -> str:
    """The source of a standalone module (no pycutlass import) holding ``TABLE`` and
    ``function_name(*key_fields) -> kernel name`` (and ``OP_CLASS``, the selection's operation class).

    Each problem gives one integer per key field: a dict by name, a tuple or list by position, or any other
    object by attribute. ``policy``: "exact" keys the values as they are; "pow2" rounds each up to a power of
    two (queries are rounded the same way). A query missing from the table goes to the nearest key in log2
    space. Problems sharing a key get the selected kernel best over all of them.

    For several operation classes (a ``{class: Selection}`` mapping, as ``select_per_class`` returns) the module
    holds ``TABLES = {class: table}`` and ``function_name(op_class, *key_fields)``: a query is answered from its
    own class's table only (nearest key within that class), and an unknown class raises ValueError."""
    if isinstance(key_fields, str) or not isinstance(key_fields, Sequence) or not key_fields:
        raise ArgumentError(f"key_fields is {key_fields!r}; give a non-empty sequence of field names, "
                            f"e.g. ('m', 'n', 'k')")
    key_fields = tuple(key_fields)
    for name in (*key_fields, function_name):
        if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name) or name.startswith("_"):
            raise ArgumentError(f"{name!r} cannot be a generated argument or function name; use a Python "
                                f"identifier that is not a keyword and does not start with '_'")
    if len(set(key_fields)) != len(key_fields):
        raise ArgumentError(f"key_fields {key_fields!r} names a field twice")
    if function_name in key_fields or function_name in ("math", "TABLE", "TABLES", "KEY_FIELDS", "POLICY",
                                                        "OP_CLASS", "op_class"):
        raise ArgumentError(f"function_name {function_name!r} clashes with a name of the generated module")
    if policy not in BUCKET_POLICIES:
        raise ArgumentError(f"policy is {policy!r}; it must be one of {', '.join(map(repr, BUCKET_POLICIES))}")
    selections = _selections(selection)
    if len(selections) > 1 and "op_class" in key_fields:
        raise ArgumentError("key_fields names 'op_class', the generated function's first argument for several "
                            "operation classes")
    bucket = _pow2 if policy == "pow2" else (lambda value: value)

    def entries_of(chosen: Selection, indent: str) -> str:
        table = chosen._grouped(lambda problem: tuple(bucket(v) for v in _field_values(problem, key_fields)))
        return "".join(f"{indent}{key!r}: {str(kernel)!r},\n" for key, kernel in sorted(table.items()))

    arguments = ", ".join(key_fields)
    key_expression = ", ".join(f"_bucket({name})" for name in key_fields) + ("," if len(key_fields) == 1 else "")
    bucket_body = ("return 1 << max(0, (int(value) - 1).bit_length())  # the next power of two >= value"
                   if policy == "pow2" else "return int(value)")
    if len(selections) > 1:
        return _multi_class_module(selections, entries_of, key_fields, function_name, policy, arguments,
                                   key_expression, bucket_body)
    [(op_class, selection)] = selections.items()
    entries = entries_of(selection, "    ")
    return f'''"""Kernel dispatch generated by pycutlass.tune.select (policy {policy}, \
{len(selection.kernels)} kernels, min_efficiency {selection.min_efficiency})."""
import math

KEY_FIELDS = {key_fields!r}
POLICY = {policy!r}
OP_CLASS = {op_class!r}
TABLE = {{
{entries}}}


def _bucket(value):
    {bucket_body}


def _log_distance(a, b):
    return sum((math.log2(max(x, 1)) - math.log2(max(y, 1))) ** 2 for x, y in zip(a, b))


def {function_name}({arguments}):
    """The kernel name for a problem; an unseen shape gets the nearest tuned one (log2 distance)."""
    key = ({key_expression})
    kernel = TABLE.get(key)
    if kernel is None:
        kernel = TABLE[min(TABLE, key=lambda known: (_log_distance(known, key), known))]
    return kernel
'''


def _multi_class_module(selections: dict, entries_of, key_fields, function_name, policy, arguments, key_expression,
                        bucket_body) -> str:
    tables = "".join(f"    {str(op_class)!r}: {{\n{entries_of(chosen, '        ')}    }},\n"
                     for op_class, chosen in selections.items())
    kernels = sum(len(chosen.kernels) for chosen in selections.values())
    return f'''"""Kernel dispatch generated by pycutlass.tune.select (policy {policy}, {len(selections)} operation \
classes, {kernels} kernels)."""
import math

KEY_FIELDS = {key_fields!r}
POLICY = {policy!r}
TABLES = {{
{tables}}}


def _bucket(value):
    {bucket_body}


def _log_distance(a, b):
    return sum((math.log2(max(x, 1)) - math.log2(max(y, 1))) ** 2 for x, y in zip(a, b))


def {function_name}(op_class, {arguments}):
    """The kernel name for a problem of an operation class, from that class's kernels only; an unseen shape gets
    the nearest tuned one of the class (log2 distance)."""
    table = TABLES.get(op_class)
    if table is None:
        raise ValueError(f"no kernels for operation class {{op_class!r}}; the classes are {{sorted(TABLES)}}")
    key = ({key_expression})
    kernel = table.get(key)
    if kernel is None:
        kernel = table[min(table, key=lambda known: (_log_distance(known, key), known))]
    return kernel
'''
