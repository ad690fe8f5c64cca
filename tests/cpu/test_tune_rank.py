"""Ranking a space before compiling: the model's verdicts on hand-made cases, top_k in autotune / Tuned / Sweep /
the CLI (compiles counted by patching the compile step), cached kernels included, cannot-win pruning, the torch
layers' ranked draw and the trust benchmark's table on synthetic timings."""
from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

import pycutlass
from pycutlass.compiler.manager import CompileReport, Compiler
from pycutlass.errors import ArgumentError
from pycutlass.tune import autotune as autotune_module
from pycutlass.tune.autotune import DEFAULT_TOP_K, Tuned, autotune
from pycutlass.tune.problems import GemmProblem
from pycutlass.tune.rank import cannot_win, config_of, device_model, estimate, rank, top_k
from pycutlass.tune.space import BUILTIN_FILTERS, SearchSpace
from pycutlass.tune.sweep import Sweep

REPO_ROOT = Path(__file__).resolve().parents[2]
FACTS = {"device": "NVIDIA H100 80GB HBM3", "cc": 90, "driver": 13000, "toolkit": "13.0"}


@pytest.fixture(scope="module")
def sm90():
    return SearchSpace.preset("sm90-f16").build()


def _tile(op):
    return tuple(op.tile_description.threadblock_shape[:2])


def _cluster_size(op):
    return math.prod(op.tile_description.cluster_shape)


# --- the model -----------------------------------------------------------------------------------------------------
def test_ranking_is_deterministic_and_scored_best_first(sm90):
    problem = GemmProblem(2048, 14336, 4096)
    first = rank(sm90.operations, problem, model="analytic")
    again = rank(list(reversed(sm90.operations)), problem, model="analytic")
    assert len(first) == len(sm90.operations)
    assert [r.score for r in first] == sorted((r.score for r in first), reverse=True)
    assert [r.point.name for r in first] == [r.point.name for r in rank(sm90.operations, problem, model="analytic")]
    assert {r.point.name: r.score for r in first} == {r.point.name: r.score for r in again}
    point, score, reason = first[0]  # unpacks as (point, score, reason)
    assert 0 < score <= 1 and "waves" in reason


def test_tiny_m_prefers_small_tiles_and_huge_square_big_clustered_tiles(sm90):
    tiny = rank(sm90.operations, GemmProblem(16, 4096, 4096), model="analytic")
    assert all(_tile(r.point)[0] == 64 for r in tiny[:8])  # 16 rows: a 128-row tile wastes 7/8 of its work
    assert _tile(tiny[0].point)[1] <= 64  # narrow tiles put more SMs to streaming B
    huge = rank(sm90.operations, GemmProblem(8192, 8192, 8192), model="analytic")
    assert all(math.prod(_tile(r.point)) >= 128 * 192 and _cluster_size(r.point) == 2 for r in huge[:4])
    assert "multicast" in huge[0].reason
    # and the big tile is a poor choice for the tiny problem, the small one for the huge problem
    tiny_order = [r.point.name for r in tiny]
    assert tiny_order.index(huge[0].point.name) > len(tiny_order) // 2


def test_stream_k_wins_under_one_wave_of_long_k():
    space = SearchSpace(compute_capability=90, threadblock_shape=[128, 128, 64], warp_count="auto", stages=0,
                        kernel_schedule="TmaWarpSpecializedCooperative", tile_scheduler=["Default", "StreamK"]).build()
    few_tiles = GemmProblem(512, 1024, 16384)  # 32 tiles on 132 SMs, 256 k-iterations each
    best = rank(space.operations, few_tiles, model="analytic")[0]
    assert best.point.tile_description.tile_scheduler.name == "StreamK" and "stream-K" in best.reason
    many_tiles = GemmProblem(128 * 12, 128 * 44, 512)  # exactly 4 waves: nothing to balance, the fixup only costs
    assert rank(space.operations, many_tiles, model="analytic")[0].point.tile_description.tile_scheduler.name == \
        "Default"


def test_sm_count_changes_the_waves(sm90):
    op = next(o for o in sm90.operations if _tile(o) == (128, 128) and _cluster_size(o) == 1)
    one_wave = GemmProblem(128 * 12, 128 * 11, 4096)  # 132 tiles: one wave on 132 SMs, two on 114
    full = estimate(config_of(op), one_wave, device_model("H100"))
    fewer = estimate(config_of(op), one_wave, device_model("H100", sm_count=114))
    assert "1.00 waves" in full.reason and "1.16 waves" in fewer.reason
    assert fewer.seconds > 1.3 * full.seconds  # a second round of tiles (L2 traffic, the same, overlaps it)
    with pytest.raises(ArgumentError, match="sm_count"):
        device_model("H100", sm_count=0)
    with pytest.raises(ArgumentError, match="unknown device"):
        rank(sm90.operations, one_wave, device="TPU")


def test_history_of_nearby_shapes_moves_measured_winners_up(sm90):
    problem = GemmProblem(4096, 4096, 4096)
    ranked = rank(sm90.operations, problem, model="analytic")
    underdog = ranked[40].point.name
    others = [r.point.name for r in ranked[:5]]
    rows = [(underdog, "gemm 4096x8192x4096", 1.0e-3)] + [(name, "gemm 4096x8192x4096", 1.3e-3) for name in others]
    moved = rank(sm90.operations, problem, history=rows, model="analytic")
    assert moved[0].point.name == underdog and "measured nearby" in moved[0].reason
    far = [(underdog, "gemm 4096x16384x4096", 1.0e-3)] + [(n, "gemm 4096x16384x4096", 1.3e-3) for n in others]
    assert rank(sm90.operations, problem, history=far, model="analytic")[0].point.name != underdog  # 4x away
    with pytest.raises(ArgumentError, match="history"):
        rank(sm90.operations, problem, history=[("only a name",)])


def test_top_k_spreads_picks_over_tiles(sm90):
    problem = GemmProblem(4096, 4096, 4096)
    picked = top_k(sm90.operations, problem, 8, model="analytic")
    assert len(picked) == 8 and len({op.name for op in picked}) == 8
    tiles = [_tile(op) for op in picked]
    assert max(tiles.count(t) for t in tiles) <= 2
    assert len(top_k(sm90.operations, problem, None, model="analytic")) == len(sm90.operations)
    with pytest.raises(ArgumentError, match="top_k"):
        top_k(sm90.operations, problem, 0)


def test_top_k_second_pick_of_a_tile_is_another_cluster_shape():
    """A memory-bound decode GEMM: the model scores a tile's cluster shapes alike (DRAM bounds them all), and
    measured they differed by up to 17% on an H200; so a tile's second pick is a cluster shape not yet picked."""
    space = SearchSpace(name="decode", kind="gemm", compute_capability=90, dtypes="f16_f32acc", layouts="rcr",
                        threadblock_shape=[[64, 64, 64], [64, 128, 64]], warp_count="auto", stages=0,
                        cluster_shape=[[1, 1, 1], [1, 2, 1], [2, 1, 1]],
                        kernel_schedule=["TmaWarpSpecialized", "TmaWarpSpecializedPingpong"]).build()
    problem = GemmProblem(16, 4096, 4096)
    ranked = rank(space.operations, problem, "H200", model="analytic")
    best_tile = _tile(ranked[0].point)
    picked = [op for op in top_k(space.operations, problem, 4, "H200", model="analytic") if _tile(op) == best_tile]
    clusters = [tuple(op.tile_description.cluster_shape[:2]) for op in picked]
    assert len(picked) == 2 and len(set(clusters)) == 2, clusters
    # with one cluster shape in the space, every candidate still comes, in rank order once each tile had its best
    single = [op for op in space.operations if tuple(op.tile_description.cluster_shape[:2]) == (1, 1)]
    assert len(single) == 4
    again = top_k(single, problem, 4, "H200", model="analytic")
    assert sorted(op.name for op in again) == sorted(op.name for op in single)


def test_rank_takes_params_and_space_points():
    space = SearchSpace.preset("sm90-f16-small")
    points = [p for p in space.points() if p.valid]
    problem = GemmProblem(1024, 1024, 1024)
    by_point = [r.point.operation.name for r in rank(points, problem, model="analytic")]
    by_params = [build.name for build in (p.operation for p in (r.point for r in rank(points, problem,
                                                                                        model="analytic")))]
    by_dict = rank([p.params for p in points], problem, model="analytic")
    assert by_point == by_params
    assert [r.score for r in by_dict] == [r.score for r in rank(points, problem, model="analytic")]
    with pytest.raises(ArgumentError, match="GemmProblem"):
        rank(points, object())


# --- pruning what cannot win ------------------------------------------------------------------------------------------
def test_spilling_configurations_are_pruned_with_their_reason(sm90):
    reasons = sm90.pruned_by_reason
    spill = "cannot win: accumulators spill registers (pingpong 128x256 tile, 256 per consumer thread)"
    assert reasons[spill] == 6  # 3 clusters x 2 epilogue schedules
    assert reasons["cannot win: accumulators spill registers (cooperative 256x256 tile, 256 per consumer thread)"]
    kept = {(_tile(op), op.tile_description.kernel_schedule.name) for op in sm90.operations}
    assert ((128, 256), "TmaWarpSpecializedCooperative") in kept  # two warpgroups share the tile: 128 each
    assert ((128, 192), "TmaWarpSpecializedPingpong") in kept  # 192 registers fit
    assert ((128, 256), "TmaWarpSpecializedPingpong") not in kept
    assert "no_register_spills" in SearchSpace.preset("sm90-f16").to_dict()["filters"]
    # the rule stays out of what the descriptions reject themselves, and out of Sm80 spaces
    assert not any("cannot win" in r for r in SearchSpace.preset("sm80-f16").build().pruned_by_reason)



def test_cooperative_192_registers_fit_a_plain_epilogue_but_not_a_fused_one():
    """Cooperative 256x192 (192 accumulators per thread): kept with a plain linear combination, pruned with a bias or
    an activation, by the space's filter and by the ranker alike."""
    def space(**dims):
        dims = {"kind": ["gemm", "grouped_gemm"], **dims}
        return SearchSpace(compute_capability=[90], dtypes=["bf16"], threadblock_shape=[[256, 192, 64]],
                           kernel_schedule=["TmaWarpSpecializedCooperative"], filters=["no_register_spills"],
                           **dims).build()

    plain = space()
    assert len(plain.operations) == 2 and not plain.pruned_by_reason
    assert all(cannot_win(config_of(op)) is None and not config_of(op).fused_epilogue for op in plain.operations)
    reason = "cannot win: accumulators spill registers (cooperative 256x192 tile, 192 per consumer thread)"
    fused = space(epilogue=["gelu"])
    assert not fused.operations and set(fused.pruned_by_reason) == {reason}
    params = plain.params_of(plain.operations[0])
    for fused_params in ({**params, "epilogue": "silu"}, {**params, "bias": "row"}):  # the model pass adds a bias
        assert BUILTIN_FILTERS["no_register_spills"](fused_params) == reason
        assert config_of(fused_params).fused_epilogue and cannot_win(config_of(fused_params)) == reason
    grouped = next(op for op in plain.operations if op.name.startswith("pycutlass_gemm_grouped_sm90_"))
    with_bias = pycutlass.GemmOperationGrouped(90, grouped.tile_description, grouped.A, grouped.B, grouped.C,
                                               grouped.epilogue_functor, bias="column")
    assert cannot_win(config_of(with_bias)) == reason  # an operation says the same through its bias

# --- top_k in autotune, Tuned, Sweep ---------------------------------------------------------------------------------
SM80_TILES = [[64, 64, 32], [64, 128, 32], [128, 64, 32], [128, 128, 32], [128, 256, 32], [256, 128, 32]]


def _sm80_space():
    return SearchSpace(compute_capability=80, threadblock_shape=SM80_TILES, warp_count="auto", stages=3)


class _CountingCompiles:
    """Stands in for the compile step: records every operation asked for and reports it compiled."""

    def __init__(self, monkeypatch):
        self.names = []
        tracker = self

        def add_module(compiler, operations, *, jobs=None, cache=None, target=None, errors="raise"):
            tracker.names += [op.name for op in operations]
            return CompileReport(compiled=len(operations), backend="nvcc")

        monkeypatch.setattr(Compiler, "add_module", add_module)


def _fake_gpu(monkeypatch):
    measured = []

    def gpu_measure(config=None, session=None, device=None):
        def measure(operation, problem):
            measured.append(operation.name)
            return 1e-6 * (1 + math.prod(operation.tile_description.threadblock_shape[:2]) / 1e4)
        return measure

    monkeypatch.setattr(autotune_module, "gpu_measure", gpu_measure)
    return measured


def test_autotune_top_k_compiles_exactly_k(monkeypatch, tmp_path):
    compiles, measured = _CountingCompiles(monkeypatch), _fake_gpu(monkeypatch)
    session = pycutlass.Session(cache_path=tmp_path / "kernels.db")
    space = _sm80_space()
    assert len(space.build()) == 6
    problem = GemmProblem(64, 4096, 4096)
    result = autotune(space, problem, db=tmp_path / "t.db", session=session, device_facts=FACTS, top_k=2)
    assert len(compiles.names) == 2 and result.candidates == 2 and sorted(measured) == sorted(compiles.names)
    # ranked for the GPU the facts name (an H100 runs Sm80-family kernels too)
    assert set(compiles.names) == {op.name for op in top_k(space.build().operations, problem, 2, "H100")}
    everything = autotune(space, GemmProblem(4096, 4096, 4096), db=tmp_path / "all.db", session=session,
                          device_facts=FACTS, top_k=None)
    assert everything.candidates == 6
    assert DEFAULT_TOP_K == 8
    with pytest.raises(ArgumentError, match="top_k"):
        autotune(space, problem, db=tmp_path / "t.db", session=session, device_facts=FACTS, top_k=0)


def test_autotune_includes_candidates_already_in_the_kernel_cache(monkeypatch, tmp_path):
    compiles, measured = _CountingCompiles(monkeypatch), _fake_gpu(monkeypatch)
    session = pycutlass.Session(cache_path=tmp_path / "kernels.db")
    space = _sm80_space()
    problem = GemmProblem(64, 4096, 4096)
    operations = space.build().operations
    ranked = [op.name for op in top_k(operations, problem, None, "H100")]
    cached = next(op for op in operations if op.name == ranked[-1])  # the model's last choice
    key, _ = Compiler.of(session).key_and_target(cached)
    from pycutlass.cache.current import CacheState

    CacheState.of(session).cache.store([(key, cached.name, {})], b"a compiled kernel", "cubin")
    result = autotune(space, problem, db=tmp_path / "t.db", session=session, device_facts=FACTS, top_k=2)
    assert result.candidates == 3 and cached.name in result.timings  # timed, though ranked last
    assert len(compiles.names) == 3  # handed to the compiler, which serves it from the cache
    assert set(measured) == set(ranked[:2]) | {cached.name}


def test_tuned_tunes_each_shape_over_its_top_k(monkeypatch, tmp_path):
    compiles, measured = _CountingCompiles(monkeypatch), _fake_gpu(monkeypatch)
    session = pycutlass.Session(cache_path=tmp_path / "kernels.db")
    tuned = Tuned(_sm80_space(), db=tmp_path / "t.db", session=session, device_facts=FACTS, top_k=2,
                  policy="exact")
    tuned.select(64, 4096, 4096)
    first = set(compiles.names)
    tuned.select(8192, 8192, 8192)
    assert len(first) == 2 and len(set(compiles.names)) <= 4
    assert len(compiles.names) == len(set(compiles.names))  # nothing compiled twice
    assert len(measured) >= 4  # the second shape also times what the first compiled


def test_sweep_top_k_keeps_the_union_over_problems(tmp_path):
    space = _sm80_space()
    problems = [GemmProblem(64, 4096, 4096), GemmProblem(8192, 8192, 8192)]
    sweep = Sweep(space, problems, db=tmp_path / "s.db", top_k=1,
                  session=pycutlass.Session(cache_path=tmp_path / "kernels.db"))
    expected = {op.name for p in problems for op in top_k(space.build().operations, p, 1, "A100")}
    assert {op.name for op in sweep.operations} == expected and len(expected) == 2
    assert sweep.pruned["ranked below the top 1 for every problem"] == 4
    whole = Sweep(space, problems, db=tmp_path / "s.db", session=pycutlass.Session(cache_path=tmp_path / "k.db"))
    assert len(whole.operations) == 6  # sweeps default to every configuration
    with pytest.raises(ArgumentError, match="give problems"):
        Sweep(space, [], db=tmp_path / "s.db", top_k=2)


def test_cli_top_k_options(monkeypatch, tmp_path):
    from click.testing import CliRunner

    from pycutlass.cli import main

    compiles = _CountingCompiles(monkeypatch)
    runner = CliRunner()
    swept = runner.invoke(main, ["sweep", "--space", "sm80-f16-small", "--problems", "gemm:64x4096x4096", "--db",
                                 str(tmp_path / "k.db"), "--top-k", "2", "--compile-only"])
    assert swept.exit_code == 0, swept.output
    assert len(compiles.names) == 2 and "2 ready" in swept.output and "ranked below the top 2" in swept.output
    bad = runner.invoke(main, ["tune", "--space", "sm80-f16-small", "--problem", "gemm:64x64x64", "--db",
                               str(tmp_path / "t.db"), "--top-k", "none"])
    assert bad.exit_code != 0 and "positive integer or 'all'" in bad.output
    compiled = runner.invoke(main, ["sweep", "--space", "sm80-f16-small", "--problems", "gemm:64x64x64", "--db",
                                    str(tmp_path / "s.db"), "--top-k", "0", "--compile-only"])
    assert compiled.exit_code != 0 and "--top-k" in compiled.output


# --- torch layers draw from the ranked grid -------------------------------------------------------------------------
def test_torch_layers_draw_ranked_sm90_candidates_and_keep_sm80_fixed():
    pytest.importorskip("torch")
    import pycutlass.torch as pct
    from pycutlass.torch import kernels
    from pycutlass.torch.dispatch import OpCall
    from pycutlass.torch.tuning import call_candidates

    dispatch = pct.Dispatch.of(pycutlass.Session())
    hopper = kernels.GemmClass("float16", True, False, 8, "identity", False, False, 90)
    ampere = kernels.GemmClass("float16", True, False, 8, "identity", False, False, 80)
    calls = [OpCall("gemm", "decode", "k1", (), (), 0, hopper, (16, 4096, 4096)),
             OpCall("gemm", "prefill", "k2", (), (), 0, hopper, (8192, 8192, 8192)),
             OpCall("gemm", "old", "k3", (), (), 0, ampere, (8192, 8192, 8192))]
    drawn = call_candidates(dispatch, calls, top_k=4)
    decode = [op for _, op in drawn["k1"]]
    prefill = [op for _, op in drawn["k2"]]
    assert len(decode) == len(prefill) == 4
    assert all(math.prod(_tile(op)) <= 128 * 64 for op in decode)  # for each layer's shape: small tiles for M=16
    assert all(math.prod(_tile(op)) >= 128 * 128 for op in prefill)
    fixed = {op.name for _, op in kernels.gemm_candidates(hopper)}
    assert {op.name for op in decode} != fixed  # not the five fixed configurations
    assert [op.name for _, op in drawn["k3"]] == [op.name for _, op in kernels.gemm_candidates(ampere)]
    assert all(op.name in dispatch.kernels() for op in decode + prefill)  # callable by name when tuning
    assert len(kernels.sm90_grid(hopper)) > 100 and kernels.sm90_grid(ampere) == []


# --- the trust benchmark's table --------------------------------------------------------------------------------------
def _trust_module():
    spec = importlib.util.spec_from_file_location("tune_trust", REPO_ROOT / "benchmarks" / "tune_trust.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_trust_table_counts_hits_and_regret_on_synthetic_timings():
    trust = _trust_module()
    space = trust.trust_space()
    by_dtype = trust.operations_by_dtype(space)
    assert sum(map(len, by_dtype.values())) == 108 and set(by_dtype) == {"f16_f32acc", "bf16"}
    problems = [GemmProblem(*shape) for shape in trust.SHAPES[:2]]
    device = device_model("H100")
    timings = trust.synthetic_timings(by_dtype, problems, device)
    table = trust.trust_table(timings, by_dtype, problems, device)
    assert [s["pairs"] for s in table["summary"]] == [4, 4, 4]
    assert all(0 <= s["within_2%"] <= 4 for s in table["summary"])
    # a kernel the ranking never picks becomes the best everywhere: every pair misses by its margin
    ranked_f16 = {op.name for p in problems for op in top_k(by_dtype["f16_f32acc"], p, 16)}
    outsider = next(op for op in by_dtype["f16_f32acc"] if op.name not in ranked_f16 and
                    "cannot" not in str(trust.cannot_win(config_of(op))))
    for p in problems:
        best = min(t for (name, key), t in timings.items() if key == p.key)
        timings[(outsider.name, p.key)] = best / 1.5
    missed = trust.trust_table(timings, by_dtype, problems, device)
    f16_rows = [r for r in missed["rows"] if r["dtype"] == "f16_f32acc"]
    assert all(r["top16/best"] >= 1.5 for r in f16_rows)
    assert missed["summary"][2]["within_2%"] <= table["summary"][2]["within_2%"] - 2
    assert missed["pruned_cannot_win"] and not missed["goal_met"]


def test_nvidia_model_is_used_when_installed_and_named_when_missing(sm90):
    problem = GemmProblem(4096, 4096, 4096)
    try:
        import nvMatmulHeuristics  # noqa: F401
    except ImportError:
        with pytest.raises(ArgumentError, match=r"pycutlass\[rank\]"):
            rank(sm90.operations, problem, model="nvmmh")
        assert [r.reason for r in rank(sm90.operations, problem)] == \
            [r.reason for r in rank(sm90.operations, problem, model="analytic")]
        return
    ranked = rank(sm90.operations, problem, device="H200", model="nvmmh")
    assert any("nvMatmulHeuristics" in r.reason for r in ranked)
    assert all("spill" not in r.reason for r in ranked[:8])


def test_trust_replay_reads_measured_grids_first_entry_per_label(tmp_path):
    import json

    trust = _trust_module()
    grid = {"results": {"f16": [{"shape": "16x4096x4096", "configs": [
        {"config": "64x32x64 c1x1 ws", "ms": 0.024}, {"config": "128x256x64 c2x1 coop", "ms": 0.070},
        {"config": "128x128x64 c1x1 coop sk", "ms": 0.040}, {"config": "128x256x64 c2x1 coop", "ms": 0.010},
        {"config": "64x128x64 c1x1 coop splitk=2", "ms": 0.001}, {"config": "128x128x64 c1x1 coop", "ms": None}]}]}}
    (tmp_path / "grid.json").write_text(json.dumps(grid))
    by_dtype, timings, problems = trust.replay_timings([tmp_path / "grid.json"])
    assert [p.key for p in problems] == ["gemm 16x4096x4096"] and list(by_dtype) == ["f16_f32acc"]
    assert sorted(round(t * 1e3, 3) for t in timings.values()) == [0.024, 0.04, 0.07]  # later duplicate ignored
    table = trust.trust_table(timings, by_dtype, problems, device_model("H100"), ks=(1,))
    assert table["rows"][0]["best"].startswith("64x32x64") and table["summary"][0]["within_2%"] == 1


# --- terms for small and skinny problems ----------------------------------------------------------------------------
def _one_config(tile, cluster, schedule):
    space = SearchSpace(name="one", kind="gemm", compute_capability=90, dtypes="f16_f32acc", layouts="rcr",
                        threadblock_shape=[[*tile, 64]], warp_count="auto", stages=0, cluster_shape=[[*cluster, 1]],
                        kernel_schedule=[schedule]).build()
    assert len(space.operations) == 1, space.pruned_by_reason
    return config_of(space.operations[0])


WS, PP, COOP = "TmaWarpSpecialized", "TmaWarpSpecializedPingpong", "TmaWarpSpecializedCooperative"


def test_one_wave_favours_the_plain_warp_specialized_kernel_many_waves_the_persistent_ones():
    """The plain warp-specialized kernel is not persistent: in one wave (a tile per CTA) there is no next tile for
    ping-pong or cooperative to overlap an epilogue with, so it is not slower (measured on an H200 it won every
    (shape, dtype) whose best ran in one wave, by 2-6% over ping-pong); over many waves it pays every tile's epilogue
    and prologue (8-12% behind)."""
    h200 = device_model("H200")
    one_wave = GemmProblem(512, 2048, 4096)  # 64x128 tiles: 128 on 132 SMs; 128x128: 64
    many = GemmProblem(4096, 4096, 4096)  # 1024 tiles of 128x128: 8 per SM
    for tile, persistent in (((64, 128), [PP]), ((128, 128), [PP, COOP])):
        ws = _one_config(tile, (1, 1), WS)
        for schedule in persistent:
            other = _one_config(tile, (1, 1), schedule)
            assert estimate(ws, one_wave, h200).seconds <= estimate(other, one_wave, h200).seconds, (tile, schedule)
            if tile == (128, 128):  # (64x128 tiles are L2-bound on the big problem, every schedule alike)
                assert estimate(ws, many, h200).seconds > 1.02 * estimate(other, many, h200).seconds, schedule
    space = SearchSpace(name="mid", kind="gemm", compute_capability=90, dtypes="f16_f32acc", layouts="rcr",
                        threadblock_shape=[[64, 128, 64], [128, 128, 64]], warp_count="auto", stages=0,
                        kernel_schedule=[WS, PP, COOP]).build()
    assert rank(space.operations, one_wave, h200)[0].point.tile_description.kernel_schedule.name == WS
    assert rank(space.operations, many, h200)[0].point.tile_description.kernel_schedule.name != WS


def test_memory_bound_decode_still_pays_for_tensor_work_and_loads():
    """M = 1: DRAM bounds every tile alike, but the tensor work of a tile's zero-filled rows and each CTA's loads
    still cost where they come close to the memory time (limits that overlap add up near each other). So of two
    tiles on as many CTAs the 64-row one wins (measured: 1.5x), a 1x2 cluster (A multicast, fewer loads per MMA)
    beats the same tile without one, and two rounds of 64x64 tiles lose to one round of 64x128."""
    h200 = device_model("H200")
    decode = GemmProblem(1, 14336, 4096)

    def seconds(tile, cluster, schedule=WS):
        return estimate(_one_config(tile, cluster, schedule), decode, h200).seconds

    assert seconds((64, 128), (1, 2), PP) < 0.95 * seconds((128, 128), (1, 2), PP)  # 112 CTAs each
    assert seconds((64, 128), (1, 2)) < seconds((64, 128), (1, 1))
    assert seconds((64, 128), (1, 2)) < seconds((64, 64), (1, 2))  # 224 tiles: two rounds on 132 SMs
    space = SearchSpace(name="decode", kind="gemm", compute_capability=90, dtypes="f16_f32acc", layouts="rcr",
                        threadblock_shape=[[64, 64, 64], [64, 128, 64], [128, 128, 64]], warp_count="auto",
                        stages=0, cluster_shape=[[1, 1, 1], [1, 2, 1]], kernel_schedule=[WS, PP]).build()
    best = rank(space.operations, decode, h200)[0].point.tile_description
    assert tuple(best.threadblock_shape[:2]) == (64, 128) and tuple(best.cluster_shape[:2]) == (1, 2)


def test_sm90_convolutions_rank_as_the_plain_kernel_with_two_ctas_where_their_stages_fit():
    """CUTLASS 4.2's SM90 conv is the plain warp-specialized kernel (a tile M of 128 is not cooperative there); at 4
    stages a 128x64 tile runs two CTAs per SM, whose epilogues overlap the other's mainloop. Measured on an H200
    (conv2d-fprop-h200.json), conv2_x 3x3 64->64 at batch 128 (GEMM 401408 x 64 x 576): 128x64 at 4 stages 322
    TFLOP/s, at the automatic count (one CTA) 226."""
    space = SearchSpace(kind=["conv2d"], compute_capability=[90], threadblock_shape=[[128, 64, 64], [128, 128, 64]],
                        stages=[0, 4])
    built = space.build()
    two = [op for op in built.operations if op.tile_description.stages == 4 and op.ctas_per_sm == 2]
    assert len(two) == 1
    for item in (two[0], list(space.points())[1]):  # an operation, and the same point as params
        config = config_of(item)
        assert (config.schedule, config.ctas_per_sm) == ("warpspecialized", 2)
    one = [op for op in built.operations if op.tile_description.threadblock_shape[1] == 64 and op not in two][0]
    assert config_of(one).ctas_per_sm == 1 and config_of(one).schedule == "warpspecialized"
    problem = GemmProblem(128 * 56 * 56, 64, 576)
    assert rank([one, two[0]], problem, device="H200")[0].point is two[0]
    grouped = SearchSpace(kind=["grouped_gemm"], compute_capability=[90], dtypes=["bf16"],
                          threadblock_shape=[[64, 128, 64], [128, 128, 64]]).build()
    assert [config_of(op).schedule for op in grouped.operations] == ["pingpong", "cooperative"]  # Auto, pointer-array


def test_a_transformer_mlp_layer_ranks_data_parallel_tiles_ahead_of_stream_k_and_drops_cooperative_256x192():
    """bf16 6304x3072x768 with a bias (ViT-B/16's MLP at batch 32) on H200: cooperative stream-K ran 1.16-1.25x this
    model's time at 4.55 waves while ping-pong ran 0.9x, and cooperative 256x192 ran 2-3x slower than 128x256."""
    from pycutlass.torch import kernels
    from pycutlass.tune.rank import cannot_win

    cls = kernels.GemmClass("bfloat16", True, False, 8, "identity", True, False, 90)
    grid = kernels.sm90_grid(cls)
    names = [op.name for _, op in grid]
    assert not any("_256x192x64_" in name and "_coop" in name for name in names)
    assert any("_128x192x64_" in name and "_pp_" in name for name in names)  # 192 per thread: ping-pong keeps it
    reason = cannot_win(config_of({**grid[0][0], "threadblock_shape": [256, 192, 64],
                                   "kernel_schedule": "TmaWarpSpecializedCooperative"}))
    assert reason and "192 per consumer thread" in reason
    problem = GemmProblem(6304, 3072, 768)
    best = [op.name for op in top_k([op for _, op in grid], problem, 4, "H200")]
    assert not any("_sk_" in name for name in best), best
    assert any("_128x192x64_" in name and "_pp_" in name for name in best), best
    # just past one wave (1.14) stream-K keeps its place: a data-parallel second wave leaves most SMs idle
    small = [op.name for op in top_k([op for _, op in grid], GemmProblem(6304, 768, 3072), 4, "H200")]
    assert any("_sk_" in name for name in small), small


# --- grouped GEMM and Conv2d problems ------------------------------------------------------------------------------
def test_a_grouped_set_is_the_gemm_model_over_its_groups():
    from pycutlass.tune.problems import Conv2dProblem, GroupedGemmProblem, MaskedGroupedProblem

    h200 = device_model("H200")
    grouped = SearchSpace(kind=["grouped_gemm"], compute_capability=[90], dtypes=["bf16"],
                          threadblock_shape=[[64, 128, 64], [128, 128, 64], [128, 256, 64]]).build().operations
    for op in grouped:  # one group: exactly the GEMM's estimate
        config = config_of(op)
        assert estimate(config, GroupedGemmProblem(((1000, 3000, 520),)), h200).seconds == \
            estimate(config, GemmProblem(1000, 3000, 520), h200).seconds
    # eight experts of ~100 rows pad each to a whole 128-row tile (eight rows of tiles where one GEMM of their 824
    # rows needs seven), and each reads its own 4096 x 4096 weights
    experts = GroupedGemmProblem(tuple((100 + 3 * e, 4096, 4096) for e in range(8)))
    large = next(op for op in grouped if config_of(op).tile[:2] == (128, 256))
    padded, packed = estimate(config_of(large), experts, h200), estimate(config_of(large), GemmProblem(824, 4096, 4096),
                                                                         h200)
    assert padded.seconds > packed.seconds and "8 groups" in padded.reason and "of the tiles' area" in padded.reason
    # the masked layout computes each expert's rows up to its count; empty experts cost nothing
    masked = MaskedGroupedProblem(8, 256, 4096, 4096, (100, 0, 103, 106, 109, 112, 115, 118))
    sparse = GroupedGemmProblem(tuple((m, 4096, 4096) for m in (100, 103, 106, 109, 112, 115, 118)))
    for op in grouped:
        assert estimate(config_of(op), masked, h200).seconds == estimate(config_of(op), sparse, h200).seconds
    # a convolution ranks as the implicit GEMM of its own kind
    conv = SearchSpace(kind=["conv2d"], compute_capability=[90], conv_kind=["fprop", "wgrad"],
                       threadblock_shape=[[128, 64, 64]]).build().operations
    layer = Conv2dProblem(32, 56, 56, 64, 64, 3, 3, (1, 1))
    for op in conv:
        m, n, k = layer.gemm_shape(op.conv_kind.name)
        assert estimate(config_of(op), layer, h200).seconds == estimate(config_of(op), GemmProblem(m, n, k),
                                                                        h200).seconds
    with pytest.raises(ArgumentError, match="GemmProblem, GroupedGemmProblem, MaskedGroupedProblem or "
                                            "Conv2dProblem"):
        rank(grouped, object(), h200)


def test_autotune_ranks_grouped_and_conv_problems_and_keys_them_exactly(monkeypatch, tmp_path):
    from pycutlass.tune.problems import Conv2dProblem, GroupedGemmProblem

    compiles, measured = _CountingCompiles(monkeypatch), _fake_gpu(monkeypatch)
    session = pycutlass.Session(cache_path=tmp_path / "kernels.db")
    tiles = [[64, 128, 64], [128, 128, 64], [128, 256, 64], [256, 128, 64]]
    grouped = SearchSpace(kind=["grouped_gemm"], compute_capability=[90], dtypes=["bf16"], threadblock_shape=tiles,
                          cluster_shape=[[1, 1, 1], [1, 2, 1]])
    experts = GroupedGemmProblem(tuple((m, 2048, 7168) for m in (48, 96, 244, 130, 64, 180)))
    result = autotune(grouped, experts, db=tmp_path / "t.db", session=session, device_facts=FACTS, top_k=3)
    assert result.candidates == 3 and len(compiles.names) == 3 and sorted(measured) == sorted(compiles.names)
    assert set(compiles.names) == {op.name for op in top_k(grouped.build().operations, experts, 3, "H100")}
    assert experts.key in result.key
    again = autotune(grouped, experts, db=tmp_path / "t.db", session=session, device_facts=FACTS, top_k=3)
    assert again.from_cache and again.operation.name == result.operation.name and len(compiles.names) == 3
    with pytest.raises(ArgumentError, match="'pow2' rounds a GEMM's M, N and K"):
        autotune(grouped, experts, db=tmp_path / "t.db", session=session, device_facts=FACTS, policy="pow2")
    with pytest.raises(ArgumentError, match="timed on grouped_gemm or masked_grouped_gemm problems, got a gemm"):
        autotune(grouped, GemmProblem(128, 128, 128), db=tmp_path / "t.db", session=session, device_facts=FACTS)
    conv = SearchSpace(kind=["conv2d"], compute_capability=[90], conv_kind=["wgrad"], threadblock_shape=tiles)
    layer = Conv2dProblem(32, 28, 28, 128, 128, 3, 3, (1, 1))
    found = autotune(conv, layer, db=tmp_path / "t.db", session=session, device_facts=FACTS, top_k=2)
    assert found.candidates == 2 and found.operation.conv_kind.name == "wgrad"


def test_a_sweeps_top_k_ranks_each_operation_class_on_the_problems_it_times(monkeypatch, tmp_path):
    from pycutlass.tune.problems import GroupedGemmProblem, ProblemSet
    from pycutlass.tune.sweep import ranked_union

    gemm = SearchSpace(compute_capability=[90], dtypes=["f16", "bf16"],
                       threadblock_shape=[[64, 128, 64], [128, 128, 64], [128, 256, 64]]).build().operations
    grouped = SearchSpace(kind=["grouped_gemm"], compute_capability=[90], dtypes=["bf16"],
                          threadblock_shape=[[64, 128, 64], [128, 128, 64], [128, 256, 64]]).build().operations
    operations = gemm + grouped
    problems = ProblemSet("mixed", [GemmProblem(4096, 4096, 4096), GroupedGemmProblem(((96, 4096, 4096),) * 8)])
    kept = ranked_union(operations, problems, 1, device="H200")
    # one per class for the GEMM (f16 and bf16) and one grouped for the grouped set
    assert len(kept) == 3
    assert {op.tile_description.math_instruction.element_a.name for op in kept if op in gemm} == \
        {"float16", "bfloat16"}
    assert [op for op in kept if op in grouped] == top_k(grouped, problems[1], 1, "H200")
