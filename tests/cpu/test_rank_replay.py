"""benchmarks/rank_replay.py: the ranking of grouped GEMM and Conv2d kernels replayed on recorded H200 timings (no
GPU); its scoring on hand-made tables, and the replay itself on the stored results."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import rank_replay  # noqa: E402


def test_scoring_counts_hits_within_two_percent_and_the_geometric_regret():
    measured = {"a": 1.0, "b": 1.015, "c": 1.5, "d": 2.0}
    problems = [([2.0, 1.5, 1.0, 1.015], measured), ([1.015, 2.0, 1.5, 1.0], measured)]
    found = rank_replay.score(problems)
    assert found[1]["within_2%"] == 1 and found[1]["regret_%"] == pytest.approx((2.0 * 1.015) ** 0.5 * 100 - 100,
                                                                                abs=0.01)
    assert found[2]["within_2%"] == 1 and found[4]["within_2%"] == 2 and found[4]["regret_%"] == 0
    assert found[4]["random_within_2%"] == 2  # four of four drawn: always the best
    assert 0 < found[1]["random_within_2%"] < 2


def test_a_moe_tile_name_builds_the_operation_it_names():
    op = rank_replay.moe_operation("128x192x64_c2x1_coop_e128x64")
    tile = op.tile_description
    assert (tuple(tile.threadblock_shape), tuple(tile.cluster_shape[:2])) == ((128, 192, 64), (2, 1))
    assert tile.kernel_schedule.name == "TmaWarpSpecializedCooperative" and tuple(tile.epilogue_tile) == (128, 64)
    up = rank_replay.moe_problem("deepseek-v3 ep8 up 4096", "contiguous")
    assert up.count == 32 and {n for _, n, _ in up.shapes} == {2048}


def test_the_replay_on_the_stored_h200_results_beats_random_picks(tmp_path):
    from pycutlass.tune.rank import device_model

    rows = rank_replay.replay_moe(device_model("H200")) + rank_replay.replay_conv(device_model("H200"))
    assert {row["source"] for row in rows} >= {"moe-forward-settled-h200.json", "conv2d-fprop-h200.json"}
    for row in rows:
        four = row["K=4"]
        assert four["within_2%"] >= four["random_within_2%"] and four["regret_%"] <= four["random_regret_%"], row
    stored = json.loads((rank_replay.RESULTS / "rank-replay-h200.json").read_text())
    assert [r["K=4"]["within_2%"] for r in stored["rows"]] == [r["K=4"]["within_2%"] for r in rows]
