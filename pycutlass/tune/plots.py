"""Plots of tuning results: efficiency heatmaps, ratio bars, Pareto curves and resource scatters.

Every function draws on its own ``matplotlib.figure.Figure`` (no pyplot, so no global state and no display
needed) and writes a PNG or an SVG chosen by the path's suffix. matplotlib is imported when a plot is drawn.
Figures grow with the number of labels up to a cap; past it fonts shrink to a floor and labels are thinned.

A heatmap shows one operation class (kernels compete only within their class): ``heatmaps`` draws one figure per
class of mixed results. Its rows are labelled by the parameters that vary among them (tile, cluster, schedules,
stages, swizzle), at most ``MAX_HEATMAP_KERNELS`` of them (the selected ones first, then the best by geometric
mean), the rest summarized in one last row.
"""
from __future__ import annotations


import math
import numbers
import re
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ArgumentError
from .select import ParetoPoint, Selection, efficiency_matrix, results_matrix, split_classes

FORMATS = {".png": "png", ".svg": "svg"}
MAX_FIGURE_INCHES = 40.0  # beyond this PNGs get huge and viewers slow; labels thin out instead
MAX_AXES_INCHES = 30.0  # the data area's share of it; the rest is for labels
CELL_INCHES = (0.12, 0.45)  # a heatmap column's width, largest while the grid fits MAX_AXES_INCHES
ROW_INCHES = (0.12, 0.28)  # a heatmap row's height: a 7-point value and a 10-point label fit 0.28 in
MAX_HEATMAP_KERNELS = 40  # rows drawn by default; the rest become one summary row
MIN_HEATMAP_INCHES = 2.5  # the data area's least height
MAX_LABEL_CHARS = 48  # kernel names run to 100+ characters; the middle goes
FONT_RANGE = (5.0, 10.0)


def _format(path: str | Path) -> tuple[Path, str]:
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in FORMATS:
        raise ArgumentError(f"cannot write a plot to {str(path)!r}: the suffix must be one of "
                            f"{', '.join(FORMATS)}, not {suffix or 'none'!r}")
    return path, FORMATS[suffix]


def _save(figure: Any, path: Path, fmt: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format=fmt, dpi=100, bbox_inches="tight")  # "tight" makes room for long labels
    return path


def _figure(width: float, height: float) -> Any:
    from matplotlib.figure import Figure

    return Figure(figsize=(min(width, MAX_FIGURE_INCHES), min(height, MAX_FIGURE_INCHES)), layout="constrained")


def _font_size(count: int, inches: float) -> float:
    """The largest font (in the allowed range) that fits ``count`` labels side by side in ``inches``."""
    per_label_points = 72.0 * inches / max(count, 1)
    return float(np.clip(per_label_points * 0.8, *FONT_RANGE))


def _label_step(count: int, inches: float, font: float) -> int:
    """Show every n-th label when even the smallest font would overlap."""
    return max(1, math.ceil(count * font * 1.2 / (72.0 * inches)))


def _axis_inches(count: int, cell: tuple[float, float] = CELL_INCHES) -> float:
    """The length of a heatmap axis with ``count`` cells."""
    return count * float(np.clip(MAX_AXES_INCHES / max(count, 1), *cell))


def _label_inches(labels: Sequence[str], count: int, inches: float) -> float:
    """How far the longest (shortened) label reaches out from its axis."""
    longest = max((len(_shorten(label)) for label in labels), default=0)
    return longest * _font_size(count, inches) * 0.6 / 72.0


def _shorten(label: str) -> str:
    if len(label) <= MAX_LABEL_CHARS:
        return label
    keep = (MAX_LABEL_CHARS - 1) // 2
    return f"{label[:keep]}…{label[-keep:]}"


def _set_ticks(axis: Any, labels: Sequence[str], inches: float, *, rotation: float = 0) -> list[int]:
    """Label the axis (thinned and shortened as needed); returns the positions that got a label."""
    font = _font_size(len(labels), inches)
    step = _label_step(len(labels), inches, font)
    positions = list(range(0, len(labels), step))
    axis.set_ticks(positions)
    axis.set_ticklabels([_shorten(labels[i]) for i in positions], fontsize=font, rotation=rotation)
    return positions


def _finite_positive(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value <= 0:
        raise ArgumentError(f"{what} is {value!r}; it must be a finite number > 0")
    return float(value)


# ---------------------------------------------------------------------------------------------------------------
# Labels

# Space parameters that tell kernels of one class apart, in label order, with their short forms; the derived ones
# (warps, instruction shape: they follow from the tile) are added only when the others leave labels equal.
_LABEL_FIELDS = ("threadblock_shape", "cluster_shape", "kernel_schedule", "epilogue_schedule", "tile_scheduler",
                 "epilogue_tile", "stages", "swizzle")
_DERIVED_FIELDS = ("warp_count", "instruction_shape")
_CLASS_FIELDS = {"kind", "compute_capability", "dtypes", "element_a", "element_b", "element_accumulator", "element_c",
                 "element_epilogue", "math_operation", "layouts", "alignment", "epilogue", "name", "op_class"}
_PREFIXES = {"cluster_shape": "c", "stages": "s", "epilogue_schedule": "epi:", "warp_count": "w",
             "instruction_shape": "mma", "tile_scheduler": "sched:", "epilogue_tile": "etile:"}
_ABBREVIATIONS = (("TmaWarpSpecialized", "ws"), ("Cooperative", "-coop"), ("Pingpong", "-pingpong"),
                  ("NoSmemWarpSpecialized", "nosmem"), ("IdentitySwizzle", "swz"), ("StreamK", "streamk"),
                  ("FP8FastAccum", "-fp8fast"))


def _value_text(field: str, value: Any) -> str:
    if value is None and field == "epilogue_tile":  # left out of params at its default
        value = "auto"
    if isinstance(value, (list, tuple)):
        text = "x".join(str(v) for v in value)
    else:
        text = str(value)
        for long, short in _ABBREVIATIONS:
            text = text.replace(long, short)
        text = text.lower() if field in ("kernel_schedule", "epilogue_schedule", "tile_scheduler") else text
    return f"{_PREFIXES.get(field, '')}{text}"


def kernel_labels(params: Mapping[Hashable, Mapping[str, Any]]) -> dict:
    """``{kernel: short label}`` from each kernel's space parameters: only the parameters whose values differ
    among these kernels (e.g. ``"128x256x64 c2x1x1 ws-coop sched:streamk"``), so labels of one class stay short.
    Labels that would still be equal get the derived parameters, then the kernel's name."""
    kernels = list(params)
    fields = [f for f in dict.fromkeys(f for k in kernels for f in params[k]) if f not in _CLASS_FIELDS]

    def varying(names):
        return [f for f in names if len({repr(params[k].get(f)) for k in kernels}) > 1]

    chosen = varying([f for f in _LABEL_FIELDS if f in fields])
    labels = {k: " ".join(_value_text(f, params[k].get(f)) for f in chosen) for k in kernels}
    if len(set(labels.values())) < len(labels):
        extra = varying([f for f in fields if f not in _LABEL_FIELDS])
        extra.sort(key=lambda f: (f not in _DERIVED_FIELDS, f))
        for k in kernels:
            labels[k] = " ".join(filter(None, [labels[k]] + [_value_text(f, params[k].get(f)) for f in extra]))
    return _unique(labels)


def _unique(labels: dict) -> dict:
    """Labels that are still equal get their kernel's name appended (its hash tells them apart)."""
    counts: dict = {}
    for label in labels.values():
        counts[label] = counts.get(label, 0) + 1
    return {k: (f"{label} {str(k).rsplit('_', 1)[-1]}".strip() if counts[label] > 1 or not label else label)
            for k, label in labels.items()}


def _name_labels(kernels: Sequence) -> dict:
    """Short labels from kernel names alone: the ``_``-separated parts that not every name shares (for an
    operation name: tile, cluster, stages, schedule), the trailing hash only where it is needed."""
    parts = {k: str(k).split("_") for k in kernels}
    if len(kernels) < 2:
        return {k: _shorten(str(k)) for k in kernels}
    common = set.intersection(*(set(p) for p in parts.values()))

    def is_hash(part: str) -> bool:
        return bool(re.fullmatch(r"[0-9a-f]{8,}", part))

    labels = {k: " ".join(part for part in p if part not in common and not is_hash(part)) for k, p in parts.items()}
    return _unique(labels)


def shape_label(problem: Any) -> str:
    """``MxNxK`` (and ``bN`` for batches) for a GEMM problem, a (m, n, k) tuple or a "gemm MxNxK" key; str()
    otherwise."""
    if all(hasattr(problem, name) for name in ("m", "n", "k")):
        batch = getattr(problem, "batch", 1)
        return f"{problem.m}x{problem.n}x{problem.k}" + (f" b{batch}" if batch not in (1, None) else "")
    if isinstance(problem, tuple) and problem and all(isinstance(v, numbers.Integral) for v in problem):
        return "x".join(str(v) for v in problem)
    text = str(problem)
    found = re.fullmatch(r"[a-z_0-9]+ (\d+x\d+x\d+(?: .*)?)", text)
    return found.group(1) if found else text


# ---------------------------------------------------------------------------------------------------------------
# Heatmap


def _selected_kernels(selected: Selection | Iterable[Hashable] | None, kernels: list) -> list:
    if selected is None:
        return []
    chosen = list(selected.kernels if isinstance(selected, Selection) else selected)
    unknown = [k for k in chosen if k not in kernels]
    if unknown:
        raise ArgumentError(f"selected kernels {unknown!r} are not in the results; select among the results' "
                            f"kernels")
    return list(dict.fromkeys(chosen))


def _shown_kernels(efficiency: np.ndarray, kernels: list, selected: list, max_kernels: int | None) -> list[int]:
    """Column indices: the selected kernels first, then the others by geometric-mean efficiency over the problems
    each ran times the share of problems it ran, up to ``max_kernels`` in all (never fewer than the selected
    ones)."""
    if max_kernels is not None and (isinstance(max_kernels, bool) or not isinstance(max_kernels, numbers.Integral)
                                    or max_kernels < 1):
        raise ArgumentError(f"max_kernels is {max_kernels!r}; it must be None or an integer >= 1")
    first = [kernels.index(k) for k in selected]
    ran = ~np.isnan(efficiency)
    with np.errstate(all="ignore"):
        geomean = np.exp(np.where(ran, np.log(np.where(ran, efficiency, 1.0)), 0.0).sum(axis=0)
                         / np.maximum(ran.sum(axis=0), 1))
    score = geomean * ran.mean(axis=0)
    others = sorted((k for k in range(len(kernels)) if k not in first), key=lambda k: (-score[k], str(kernels[k])))
    room = len(others) if max_kernels is None else max(0, max_kernels - len(first))
    return first + others[:room]


def heatmap(results: Iterable[tuple[Hashable, Hashable, float]], path: str | Path, *,
            selected: Selection | Iterable[Hashable] | None = None, title: str | None = None,
            problem_label: Callable[[Any], str] | None = None, kernel_label: Callable[[Any], str] | None = None,
            max_kernels: int | None = MAX_HEATMAP_KERNELS,
            kernel_params: Mapping[Hashable, Mapping[str, Any]] | None = None) -> Path:
    """Kernels (rows) x problems (columns) of one operation class, each cell the kernel's efficiency on the
    problem (best time / time; 1.0 = fastest). Missing pairs are hatched grey. Selected kernels are listed first
    with bold names and a box, and the cell each problem runs on is outlined (for a Selection its assignment,
    otherwise the fastest selected kernel).

    Rows: the selected kernels, then the best others by geometric-mean efficiency, ``max_kernels`` in all (None:
    every kernel); the kernels left out are summarized in a last row holding their best efficiency per problem.
    Row labels: ``kernel_label(kernel)`` if given, else the parameters that vary among the kernels
    (``kernel_params``: kernel -> its space parameters, as the results DB's ``kernels.params`` holds them), else
    the parts of the kernel names that differ. Columns: ``problem_label`` (default ``MxNxK``). The title names the
    results' operation class when they carry one; results of several classes raise ``MixedClassesError`` (draw
    them with ``heatmaps``). Returns the path."""
    path, fmt = _format(path)
    groups = split_classes(results)
    results = [item for items in groups.values() for item in items]
    op_class = next(iter(groups)) if len(groups) == 1 else None
    problems, kernels, seconds = results_matrix(results)
    if not any(isinstance(problem, str) for problem in problems):  # strings would sort "16x.." after "128x.."
        try:  # problems that order (GemmProblem: by M, N, K) read left to right; others keep their first-seen order
            order = sorted(range(len(problems)), key=lambda p: problems[p])
            problems, seconds = [problems[p] for p in order], seconds[order]
        except TypeError:
            pass
    efficiency = efficiency_matrix(seconds)
    chosen = _selected_kernels(selected, kernels)
    columns = _shown_kernels(efficiency, kernels, chosen, max_kernels)
    shown_columns = set(columns)
    hidden = [k for k in range(len(kernels)) if k not in shown_columns]
    grid = efficiency[:, columns].T  # rows: shown kernels, columns: problems
    if hidden:
        with np.errstate(all="ignore"):
            rest = np.where(np.isnan(efficiency[:, hidden]), -np.inf, efficiency[:, hidden]).max(axis=1)
        grid = np.vstack([grid, np.where(np.isinf(rest), np.nan, rest)])
    n_rows, n_cols = grid.shape

    from matplotlib import colormaps
    from matplotlib.patches import Patch, Rectangle

    problem_names = [(problem_label or shape_label)(p) for p in problems]
    shown = [kernels[k] for k in columns]
    # labels tell apart all the class's kernels, not only the rows shown: a row keeps its label at any max_kernels
    if kernel_label is not None:
        names = {k: str(kernel_label(k)) for k in shown}
    elif kernel_params is not None and all(k in kernel_params for k in kernels):
        names = kernel_labels({k: kernel_params[k] for k in kernels})
    else:
        names = _name_labels(kernels)
    kernel_names = [names[k] for k in shown]
    if hidden:
        best_hidden = float(np.nanmax(grid[-1])) if not np.all(np.isnan(grid[-1])) else float("nan")
        kernel_names.append(f"+{len(hidden)} more, none above {best_hidden:.2f} of best" if best_hidden < 0.995
                            else f"+{len(hidden)} more: their best per problem")
    # a few rows still get room for the colorbar's label
    width, height = _axis_inches(n_cols), max(_axis_inches(n_rows, ROW_INCHES), MIN_HEATMAP_INCHES)
    # + the kernel names, the colorbar, the problem names (vertical), the title and the legend
    figure = _figure(width + _label_inches(kernel_names, n_rows, height) + 2.0,
                     height + _label_inches(problem_names, n_cols, width) + 1.5 + 0.3 * bool(op_class))
    axes = figure.add_subplot()
    axes.add_patch(Rectangle((-0.5, -0.5), n_cols, n_rows, facecolor="0.88", edgecolor="0.65", hatch="///",
                             linewidth=0, zorder=0))
    colormap = colormaps["viridis"].with_extremes(bad=(0, 0, 0, 0))  # NaN cells let the hatching through
    low = float(np.nanmin(grid))
    image = axes.imshow(np.ma.masked_invalid(grid), cmap=colormap, vmin=min(low, 0.999), vmax=1.0,
                        aspect="auto", interpolation="nearest", zorder=1)
    colorbar = figure.colorbar(image, ax=axes, shrink=min(1.0, 8.0 / height))
    colorbar.set_label("efficiency (best time / time)")

    _set_ticks(axes.xaxis, problem_names, width, rotation=90)
    labelled_rows = _set_ticks(axes.yaxis, kernel_names, height)
    shapes = all(re.match(r"\d+x\d+x\d+", name) for name in problem_names)
    axes.set_xlabel("problem (M x N x K)" if shapes else "problem")
    axes.set_ylabel("kernel")
    if n_rows * n_cols <= 400:  # values are legible only on small grids
        for (row, col), value in np.ndenumerate(grid):
            if not np.isnan(value):
                axes.text(col, row, f"{value:.2f}", ha="center", va="center", fontsize=7, zorder=3,
                          color="black" if value > low + 0.6 * (1 - low) else "white")
    if hidden:
        axes.axhline(n_rows - 1.5, color="white", linewidth=3, zorder=4)
        for row, label in zip(labelled_rows, axes.get_yticklabels()):
            if row == n_rows - 1:
                label.set_fontstyle("italic")

    if chosen:
        for row, label in zip(labelled_rows, axes.get_yticklabels()):
            if row < len(chosen):  # the selected kernels are the first rows
                label.set_fontweight("bold")
        axes.add_patch(Rectangle((-0.5, -0.5), n_cols, len(chosen), fill=False, edgecolor="red", linewidth=2,
                                 zorder=4))
        assignment = selected.assignment if isinstance(selected, Selection) else _fastest_of(efficiency, chosen,
                                                                                             kernels, problems)
        for col, problem in enumerate(problems):
            if problem in assignment:
                row = chosen.index(assignment[problem])
                axes.add_patch(Rectangle((col - 0.5, row - 0.5), 1, 1, fill=False, edgecolor="black",
                                         linewidth=1.2, zorder=5))
    handles = [Patch(facecolor="0.88", edgecolor="0.65", hatch="///", label="not run / failed")]
    if chosen:
        handles += [Patch(fill=False, edgecolor="red", linewidth=2, label="selected kernels"),
                    Patch(fill=False, edgecolor="black", label="kernel each problem runs")]
    figure.legend(handles=handles, loc="outside lower center", ncols=len(handles), fontsize=8, frameon=False)
    heading = [title] if title else []
    if op_class:
        heading.append(op_class)
    if heading:
        axes.set_title("\n".join(heading), fontsize=9 if op_class and not title else None)
    return _save(figure, path, fmt)


def class_path(path: str | Path, op_class: str | None) -> Path:
    """``heatmap.png`` -> ``heatmap-<class>.png``: the file of one operation class among several."""
    from .db import class_slug

    path = Path(path)
    return path.with_name(f"{path.stem}-{class_slug(str(op_class))}{path.suffix}")


def heatmaps(results: Iterable[tuple[Hashable, Hashable, float]], path: str | Path, *,
             selected: Mapping[Any, Selection | Iterable[Hashable]] | None = None, **options) -> dict:
    """One ``heatmap`` per operation class of ``results`` (``split_classes``): ``{class: path}``. With one class
    the figure goes to ``path``; with several, each to ``class_path(path, class)``. ``selected``: a
    ``{class: Selection or kernels}`` mapping (``select_per_class`` returns one). Other options as ``heatmap``."""
    _format(path)
    groups = split_classes(results)
    if not groups:
        raise ArgumentError("results is empty; give at least one (kernel, problem, seconds) triple")
    written = {}
    for op_class, items in groups.items():
        target = path if len(groups) == 1 else class_path(path, op_class)
        written[op_class] = heatmap(items, target, selected=(selected or {}).get(op_class), **options)
    return written


def _fastest_of(efficiency: np.ndarray, chosen: list, kernels: list, problems: list) -> dict:
    """problem -> the fastest chosen kernel on it (problems none of them ran are left out)."""
    columns = [kernels.index(k) for k in chosen]
    assignment = {}
    for p, problem in enumerate(problems):
        values = efficiency[p, columns]
        if not np.all(np.isnan(values)):
            assignment[problem] = chosen[int(np.nanargmax(values))]
    return assignment


# ---------------------------------------------------------------------------------------------------------------
# Ratio bars, Pareto curve, resource scatter


def ratio_bars(rows: Iterable[tuple[str, float]], path: str | Path, *, title: str | None = None,
               ylabel: str = "ratio vs baseline (baseline time / kernel time)") -> Path:
    """One bar per shape: the ratio against the baseline (cuBLAS), green at or above 1.0 and red below, with a
    line at 1.0. ``rows``: ``(label, ratio)`` pairs."""
    path, fmt = _format(path)
    rows = list(rows)
    if not rows:
        raise ArgumentError("rows is empty; give at least one (label, ratio) pair")
    labels, ratios = [], []
    for index, row in enumerate(rows):
        try:
            label, ratio = row
        except (TypeError, ValueError):
            raise ArgumentError(f"rows[{index}] is {row!r}; each row must be a (label, ratio) pair") from None
        labels.append(str(label))
        ratios.append(_finite_positive(ratio, f"the ratio of {label!r}"))
    width = min(3.0 + 0.3 * len(rows), MAX_FIGURE_INCHES)
    figure = _figure(width, 4.5)
    axes = figure.add_subplot()
    colors = ["tab:green" if ratio >= 1.0 else "tab:red" for ratio in ratios]
    axes.bar(range(len(rows)), ratios, color=colors, width=0.8)
    axes.axhline(1.0, color="black", linewidth=1, linestyle="--")
    _set_ticks(axes.xaxis, labels, width, rotation=90)
    axes.set_xlim(-0.6, len(rows) - 0.4)
    axes.set_ylabel(ylabel)
    axes.grid(axis="y", alpha=0.3)
    if title:
        axes.set_title(title)
    return _save(figure, path, fmt)


def pareto_plot(curve: Sequence[ParetoPoint], path: str | Path, *, greedy: Selection | None = None,
                title: str | None = None) -> Path:
    """Set size vs the best worst-case and the best geometric-mean efficiency (``pareto_curve``'s points),
    with a greedy selection's size, worst and geomean marked if given."""
    path, fmt = _format(path)
    curve = list(curve)
    if not curve or not all(isinstance(point, ParetoPoint) for point in curve):
        raise ArgumentError("curve must be a non-empty list of ParetoPoint, as pareto_curve() returns")
    sizes = [point.size for point in curve]
    figure = _figure(min(4.0 + 0.25 * len(curve), MAX_FIGURE_INCHES), 4.5)
    axes = figure.add_subplot()
    axes.plot(sizes, [p.worst for p in curve], marker="o", label="best worst-case efficiency")
    axes.plot(sizes, [p.geomean for p in curve], marker="s", label="best geomean efficiency")
    if greedy is not None:
        if not isinstance(greedy, Selection):
            raise ArgumentError(f"greedy is a {type(greedy).__name__}; give the Selection greedy_select() returns")
        size = len(greedy.kernels)
        axes.scatter([size], [greedy.worst], marker="x", s=80, color="tab:red", zorder=3, label="greedy: worst")
        axes.scatter([size], [greedy.geomean], marker="+", s=100, color="tab:red", zorder=3,
                     label="greedy: geomean")
    axes.xaxis.get_major_locator().set_params(integer=True)
    axes.set_xlabel("kernels in the set")
    axes.set_ylabel("efficiency (best time / time)")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8, loc="lower right")
    if title:
        axes.set_title(title)
    return _save(figure, path, fmt)


def resource_scatter(points: Iterable[Mapping[str, Any]], path: str | Path, *, x: str = "registers",
                     y: str = "seconds", group: str | None = None, log_y: bool | None = None,
                     title: str | None = None) -> Path:
    """Each point a dict with numeric ``x`` and ``y`` fields (e.g. registers per thread and seconds), colored by
    its ``group`` field (e.g. the problem class) when given. ``log_y``: None = log scale when y spans more than
    100x."""
    path, fmt = _format(path)
    points = list(points)
    if not points:
        raise ArgumentError("points is empty; give at least one dict with the x and y fields")
    xs, ys, groups = [], [], []
    for index, point in enumerate(points):
        if not isinstance(point, Mapping):
            raise ArgumentError(f"points[{index}] is {point!r}; each point must be a dict")
        missing = [name for name in (x, y, group) if name is not None and name not in point]
        if missing:
            raise ArgumentError(f"points[{index}] has no field {', '.join(map(repr, missing))}; its fields are "
                                f"{', '.join(map(repr, point))}")
        for name in (x, y):
            if isinstance(point[name], bool) or not isinstance(point[name], numbers.Real):
                raise ArgumentError(f"points[{index}][{name!r}] is {point[name]!r}; it must be a number")
        xs.append(float(point[x]))
        ys.append(float(point[y]))
        groups.append(None if group is None else str(point[group]))
    from matplotlib import colormaps

    figure = _figure(6.5, 4.5)
    axes = figure.add_subplot()
    names = list(dict.fromkeys(groups))
    palette = colormaps["tab10" if len(names) <= 10 else "tab20"]
    for number, name in enumerate(names):
        mask = [g == name for g in groups]
        axes.scatter(np.array(xs)[mask], np.array(ys)[mask], s=14, alpha=0.75,
                     color=palette(number % palette.N), label=name)
    positive = [value for value in ys if value > 0]
    if log_y is None:
        log_y = len(positive) == len(ys) and max(ys) / min(ys) > 100
    if log_y:
        axes.set_yscale("log")
    if group is not None:  # beside the axes: many groups would hide the points
        figure.legend(title=group, fontsize=7, title_fontsize=8, ncols=max(1, math.ceil(len(names) / 25)),
                      loc="outside right upper")
    axes.set_xlabel(x)
    axes.set_ylabel(y)
    axes.grid(alpha=0.3)
    if title:
        axes.set_title(title)
    return _save(figure, path, fmt)
