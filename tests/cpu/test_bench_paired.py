"""benchmarks/gemm_sm90.py's order-fair comparison (``paired``) with scripted timings instead of a GPU."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import gemm_sm90  # noqa: E402


class ScriptedClock:
    """Stands in for bench_ms: each launch function's time rises by ``drift`` per call made before it, as a GPU
    that heats up would make it; records the order of the calls."""

    def __init__(self, base_ms: dict, drift: float):
        self.base_ms, self.drift, self.calls = base_ms, drift, []

    def __call__(self, fn, warmup_ms=None, rep_ms=None):
        self.calls.append(fn)
        return self.base_ms[fn] * (1 + self.drift * len(self.calls))


def test_paired_rotates_the_order_and_confirms_the_winner_in_fresh_rounds(monkeypatch):
    def torch_fn():
        pass

    def slow():
        pass

    def fast():
        pass

    clock = ScriptedClock({torch_fn: 1.0, slow: 1.10, fast: 0.95}, drift=0.01)
    monkeypatch.setattr(gemm_sm90, "bench_ms", clock)
    winner, ratio, selection = gemm_sm90.paired(torch_fn, [("slow", slow), ("fast", fast)], select_rounds=3,
                                                confirm_rounds=5)
    assert winner == 1 and len(selection) == 2 and selection[1] > selection[0]
    # 3 selection rounds of 3 timings, then 5 confirmation rounds of torch and the winner only
    assert len(clock.calls) == 3 * 3 + 5 * 2
    firsts = [clock.calls[i] for i in (0, 3, 6)]
    assert firsts == [torch_fn, slow, fast]  # each round starts with the next entry: nobody is always first
    confirm = clock.calls[9:]
    assert set(confirm) == {torch_fn, fast} and confirm[0] is torch_fn and confirm[2] is fast
    # the confirmed ratio is torch / winner within a round: about 1 / 0.95, whatever the drift did meanwhile
    assert 1.03 < ratio < 1.07


def test_paired_with_one_candidate_skips_the_selection(monkeypatch):
    def torch_fn():
        pass

    def only():
        pass

    clock = ScriptedClock({torch_fn: 2.0, only: 2.5}, drift=0.0)
    monkeypatch.setattr(gemm_sm90, "bench_ms", clock)
    winner, ratio, selection = gemm_sm90.paired(torch_fn, [("only", only)], confirm_rounds=3)
    assert winner == 0 and ratio == 2.0 / 2.5 and len(clock.calls) == 6


def test_moe_paired_ratio_alternates_so_a_heating_gpu_favours_neither_side():
    """benchmarks/moe.py's confirmation of the tuned choice: with both sides equally fast and a clock that slows by
    5% per timing, timing torch first every round would read 1.05; alternating reads the median of 1.05 and 0.95."""
    import moe

    calls = []

    def timed(name):
        def run():
            calls.append(name)
            return 1.0 * (1 + 0.05 * len(calls))
        return run

    ratio = moe.paired_ratio(timed("torch"), timed("ours"), rounds=4)
    assert calls == ["torch", "ours", "ours", "torch", "torch", "ours", "ours", "torch"]
    assert 0.99 < ratio < 1.01
    calls.clear()
    assert moe.paired_ratio(lambda: 2.0, lambda: 1.6, rounds=3) == 1.25
