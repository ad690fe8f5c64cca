"""Plots (pycutlass.tune.plots) render headless to PNG and SVG from synthetic results."""
from __future__ import annotations

import random
import subprocess
import sys

import pytest

pytest.importorskip("matplotlib")
pytest.importorskip("scipy")

from pycutlass.errors import ArgumentError  # noqa: E402
from pycutlass.tune import plots  # noqa: E402
from pycutlass.tune.select import greedy_select, pareto_curve, select_kernels  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def synthetic_results(n_kernels=8, n_problems=6, seed=0):
    """Long CUTLASS-like kernel names, (m, n, k) problems, about 15% of the pairs missing."""
    rng = random.Random(seed)
    kernels = [f"cutlass3x_sm90_tensorop_gemm_f16_f16_f32_f16_f16_{64 * (i + 1)}x128x64_1x1x1_0_tnn_align8_{i}"
               for i in range(n_kernels)]
    problems = [(2 ** rng.randint(4, 13), 4096, 4096) for _ in range(n_problems)]
    problems = list(dict.fromkeys(problems))
    results = []
    for problem in problems:
        for index, kernel in enumerate(kernels):
            if index and rng.random() < 0.15:
                continue
            results.append((kernel, problem, rng.uniform(1e-4, 1.5e-4)))
    return results


def check_image(path, suffix):
    assert path.exists() and path.stat().st_size > 2000
    data = path.read_bytes()
    if suffix == ".png":
        assert data.startswith(PNG_MAGIC)
    else:
        assert b"<svg" in data[:2000]


@pytest.mark.parametrize("suffix", [".png", ".svg"])
def test_heatmap_with_selection_and_missing_cells(tmp_path, suffix):
    results = synthetic_results()
    selection = select_kernels(results, 0.95)
    path = plots.heatmap(results, tmp_path / f"heat{suffix}", selected=selection, title="efficiency",
                         problem_label=lambda p: "x".join(map(str, p)))
    assert path == tmp_path / f"heat{suffix}"
    check_image(path, suffix)


def test_heatmap_selected_iterable_max_kernels_and_plain(tmp_path):
    results = synthetic_results(n_kernels=12)
    kernels = sorted({kernel for kernel, _, _ in results})
    check_image(plots.heatmap(results, tmp_path / "a.svg", selected=kernels[3:5], max_kernels=4), ".svg")
    check_image(plots.heatmap(results, tmp_path / "b.png"), ".png")
    svg = (tmp_path / "a.svg").read_text()
    assert "not run / failed" in svg and "selected kernels" in svg
    with pytest.raises(ArgumentError, match="not in the results"):
        plots.heatmap(results, tmp_path / "c.png", selected=["no_such_kernel"])
    with pytest.raises(ArgumentError, match="max_kernels"):
        plots.heatmap(results, tmp_path / "c.png", max_kernels=0)


def test_heatmap_many_labels_stays_bounded(tmp_path):
    results = synthetic_results(n_kernels=150, n_problems=80, seed=3)
    path = plots.heatmap(results, tmp_path / "big.png", selected=greedy_select(results, 0.9))
    check_image(path, ".png")
    width, height = int.from_bytes(path.read_bytes()[16:20], "big"), int.from_bytes(path.read_bytes()[20:24], "big")
    assert width < 6000 and height < 6000


@pytest.mark.parametrize("suffix", [".png", ".svg"])
def test_ratio_bars(tmp_path, suffix):
    rows = [(f"{m}x4096x4096", ratio) for m, ratio in zip((16, 64, 256, 1024, 4096), (0.8, 0.97, 1.0, 1.1, 1.3))]
    check_image(plots.ratio_bars(rows, tmp_path / f"bars{suffix}", title="vs cuBLAS"), suffix)
    with pytest.raises(ArgumentError, match="empty"):
        plots.ratio_bars([], tmp_path / "x.png")
    with pytest.raises(ArgumentError, match="finite number > 0"):
        plots.ratio_bars([("a", float("nan"))], tmp_path / "x.png")
    with pytest.raises(ArgumentError, match=r"rows\[0\]"):
        plots.ratio_bars([1.0], tmp_path / "x.png")


@pytest.mark.parametrize("suffix", [".png", ".svg"])
def test_pareto_plot(tmp_path, suffix):
    results = synthetic_results(n_kernels=6, n_problems=8, seed=5)
    curve = pareto_curve(results)
    path = plots.pareto_plot(curve, tmp_path / f"pareto{suffix}", greedy=greedy_select(results, 0.95), title="t")
    check_image(path, suffix)
    with pytest.raises(ArgumentError, match="ParetoPoint"):
        plots.pareto_plot([], tmp_path / "x.png")


@pytest.mark.parametrize("suffix", [".png", ".svg"])
def test_resource_scatter(tmp_path, suffix):
    rng = random.Random(1)
    points = [{"registers": rng.randint(64, 255), "seconds": rng.uniform(1e-5, 1e-2),
               "shape": rng.choice(["square", "tall", "wide"])} for _ in range(60)]
    check_image(plots.resource_scatter(points, tmp_path / f"grouped{suffix}", group="shape", title="r"), suffix)
    check_image(plots.resource_scatter(points, tmp_path / f"plain{suffix}", log_y=False), suffix)
    with pytest.raises(ArgumentError, match="no field 'smem'"):
        plots.resource_scatter(points, tmp_path / "x.png", x="smem")
    with pytest.raises(ArgumentError, match="must be a number"):
        plots.resource_scatter([{"registers": "many", "seconds": 1.0}], tmp_path / "x.png")


@pytest.mark.parametrize("name", ["plot.pdf", "plot", "plot.jpg"])
def test_bad_suffix(tmp_path, name):
    results = synthetic_results()
    for draw in (lambda p: plots.heatmap(results, p), lambda p: plots.ratio_bars([("a", 1.0)], p),
                 lambda p: plots.pareto_plot(pareto_curve(results), p),
                 lambda p: plots.resource_scatter([{"registers": 1, "seconds": 1.0}], p)):
        with pytest.raises(ArgumentError, match=r"\.png, \.svg"):
            draw(tmp_path / name)
    assert list(tmp_path.iterdir()) == []


def test_plots_use_no_pyplot(tmp_path):
    code = ("import sys; from pycutlass.tune import plots; "
            "plots.ratio_bars([('a', 1.2), ('b', 0.9)], sys.argv[1]); "
            "assert 'matplotlib.pyplot' not in sys.modules")
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "bars.png")], check=True, cwd=tmp_path)
    check_image(tmp_path / "bars.png", ".png")


def png_size(path):
    data = path.read_bytes()
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_108_kernels_of_two_classes_give_one_readable_heatmap_per_class(tmp_path):
    """An SM90 sweep's 108 configurations x 9 shapes in f16 and bf16: one figure per class, bounded in size, rows
    labelled by the parameters that vary (no cut names), at most 40 rows plus one summary row, MxNxK columns."""
    from pycutlass.tune.select import MixedClassesError, select_per_class
    from tests.tune_helpers import sm90_two_class_results

    results, params = sm90_two_class_results()
    chosen = select_per_class(results, 0.98)
    with pytest.raises(MixedClassesError, match="results hold 2"):
        plots.heatmap(results, tmp_path / "mixed.png")
    written = plots.heatmaps(results, tmp_path / "heatmap.png", selected=chosen, kernel_params=params)
    assert set(written) == set(chosen) and len(written) == 2
    for op_class, path in written.items():
        assert path.name.startswith("heatmap-gemm-A-") and path.suffix == ".png"
        assert ("bf16" in path.name) == ("bf16" in op_class)
        check_image(path, ".png")
        width, height = png_size(path)
        assert height <= 1600 and width <= 1400, (width, height)  # 108 rows at the old 0.45 in were 3326 px tall

    f16_class = next(c for c in chosen if "A=f16/" in c)
    svg = plots.heatmap([r for r in results if r.op_class == f16_class], tmp_path / "f16.svg",
                        selected=chosen[f16_class], kernel_params=params).read_text()
    assert f16_class in svg  # the class is the title
    for label in ("128x128x64 c1x1x1 ws-coop sched:streamk", "64x64x64 c1x1x1 ws sched:default",
                  "1024x1024x1024", "4096x14336x4096", "+68 more"):
        assert label in svg, label
    assert "pycutlass_gemm_sm90" not in svg and "…" not in svg and "gemm 1024x1024x1024" not in svg
    # 40 kernel rows: the selected ones first, then the best by geometric mean
    shown = [name for name in (line.strip()[5:-4] for line in svg.splitlines() if line.strip().startswith("<!-- "))
             if " sched:" in name]
    assert len(shown) == 40, shown
    # without parameters the labels come from the names: the parts that vary, no shared prefix, no hash
    by_name = plots.heatmap([r for r in results if r.op_class == f16_class], tmp_path / "names.svg",
                            max_kernels=10).read_text()
    assert "64x128x64 c1x1 cooperative" in by_name and "f16f16f16f32" not in by_name
    assert "pycutlass_gemm" not in by_name and "+98 more" in by_name


def test_kernel_and_problem_labels():
    from pycutlass.tune.problems import GemmProblem

    params = {"a": {"threadblock_shape": [128, 128, 64], "cluster_shape": [1, 1, 1], "stages": 0,
                    "kernel_schedule": "TmaWarpSpecializedPingpong", "element_a": "float16", "warp_count": [2, 2, 1]},
              "b": {"threadblock_shape": [128, 256, 64], "cluster_shape": [2, 1, 1], "stages": 0,
                    "kernel_schedule": "TmaWarpSpecializedPingpong", "element_a": "float16", "warp_count": [2, 2, 1]},
              "c": {"threadblock_shape": [128, 256, 64], "cluster_shape": [2, 1, 1], "stages": 0,
                    "kernel_schedule": "TmaWarpSpecializedPingpong", "element_a": "float16", "warp_count": [4, 2, 1]}}
    # only what varies; the derived warps only where the rest leaves two labels equal
    assert plots.kernel_labels(params) == {"a": "128x128x64 c1x1x1 w2x2x1", "b": "128x256x64 c2x1x1 w2x2x1",
                                           "c": "128x256x64 c2x1x1 w4x2x1"}
    assert plots.kernel_labels({k: params[k] for k in "ab"}) == {"a": "128x128x64 c1x1x1", "b": "128x256x64 c2x1x1"}
    assert plots.shape_label(GemmProblem(16, 4096, 512)) == "16x4096x512"
    assert plots.shape_label(GemmProblem(16, 4096, 512, batch=4)) == "16x4096x512 b4"
    assert plots.shape_label("gemm 64x64x64 b2") == "64x64x64 b2" and plots.shape_label((1, 2, 3)) == "1x2x3"
    assert plots.shape_label("p1") == "p1"
