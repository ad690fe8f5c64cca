"""benchmarks/agreement.py's parsing of ncu's CSV and its verdicts, on captured-looking text instead of a GPU."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import agreement  # noqa: E402

HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
          '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"\n')


def _row(index: int, kernel: str, value: str, unit: str = "nsecond") -> str:
    return (f'"{index}","4242","python3","host","{kernel}","1","7","(384, 1, 1)","(132, 1, 1)","0","9.0",'
            f'"Command line profiler metrics","gpu__time_duration.sum","{unit}","{value}"\n')


def test_ncu_csv_gives_microseconds_per_call_per_series():
    lines = ["==PROF== Connected to process 4242\n", HEADER]
    index = 0
    # series 1: a pycutlass kernel, 2 calls of one kernel each (12.5 us, 13.5 us)
    for kernel, value in (("spin_kernel(long)", "1,000"), ("pycutlass_gemm_sm90_x", "12,500"),
                          ("pycutlass_gemm_sm90_x", "13,500")):
        lines.append(_row(index, kernel, value))
        index += 1
    # series 2: torch, each call a GEMM kernel and a reduction (usecond units)
    for kernel, value in (("spin_kernel(long)", "1.0"), ("sm90_xmma_gemm", "20.0"), ("splitKreduce", "2.0"),
                          ("sm90_xmma_gemm", "22.0"), ("splitKreduce", "2.0")):
        lines.append(_row(index, kernel, value, "usecond"))
        index += 1
    found = agreement.parse_ncu_csv("".join(lines), series=3, calls=2)
    assert found[0] == pytest.approx(13.0) and found[1] == pytest.approx(23.0)
    assert found[2] is None  # a series ncu did not report
    with pytest.raises(ValueError):
        agreement.parse_ncu_csv("==ERROR== ERR_NVGPUCTRPERM", series=1)


def test_ncu_csv_after_flushes_leaves_the_flush_kernels_out():
    lines = [HEADER]
    index = 0
    # the naming flush before the first marker: torch's sum(dtype=int64) of an int32 buffer casts, then reduces;
    # then each call: the flush's two kernels, then the measured ones (a GEMM and cuBLAS's own split-K reduction)
    flush = [("unrolled_elementwise_kernel<copy>", "30.0"), ("reduce_kernel<512, 1>", "40.0")]
    rows = flush + [("spin_kernel(long)", "1.0")]
    rows += flush + [("sm90_xmma_gemm", "20.0"), ("splitKreduce_kernel", "2.0")]
    rows += flush + [("sm90_xmma_gemm", "21.0"), ("splitKreduce_kernel", "2.0")]
    rows += [("spin_kernel(long)", "1.0")] + flush + [("pycutlass_gemm_sm90_x", "12.0")] + flush + [
        ("pycutlass_gemm_sm90_x", "14.0")]
    for kernel, value in rows:
        lines.append(_row(index, kernel, value, "usecond"))
        index += 1
    found = agreement.parse_ncu_csv("".join(lines), series=2, calls=2, flushed=True)
    assert found == [pytest.approx(22.5), pytest.approx(13.0)]
    # read as unflushed, the flushes would count
    assert agreement.parse_ncu_csv("".join(lines), series=2, calls=2)[1] == pytest.approx(83.0)
    with pytest.raises(ValueError):  # flushed, but nothing named the flush
        agreement.parse_ncu_csv("".join(lines[:1] + lines[3:]), series=2, calls=2, flushed=True)


def test_the_verdict_takes_ncu_in_the_harness_cache_state_and_the_raw_one_ncu_with_every_cache_flushed():
    rows = agreement.agreement_rows([
        # ncu with every cache (instruction caches too) flushed before each kernel reads 7% high on a 7 us kernel
        {"who": "torch", "harness_us": 7.0, "graph_us": 6.9, "launch_gap_us": 0.5, "ncu_us": 7.5,
         "ncu_matched_us": 6.95},
        # torch's call of two kernels: summed one by one, each with its own launch, ncu reads high either way
        {"who": "torch", "harness_us": 13.4, "graph_us": 13.6, "ncu_us": 15.2, "ncu_matched_us": 14.3},
    ])
    assert rows[0]["within_3%"] and not rows[0]["within_3%_raw"]
    assert rows[0]["harness/ncu_matched"] == pytest.approx(7.0 / 6.95, abs=1e-4)
    assert rows[0]["harness/ncu"] == pytest.approx(7.0 / 7.5, abs=1e-4)
    assert rows[0]["graph_net_us"] == pytest.approx(6.4)
    assert not rows[1]["within_3%"] and rows[1]["harness/graph"] == pytest.approx(13.4 / 13.6, abs=1e-4)


def test_agreement_rows_judge_every_pair_against_both_measures():
    rows = agreement.agreement_rows([
        {"who": "pycutlass", "harness_us": 100.0, "graph_us": 98.0, "ncu_matched_us": 101.0},  # within 3% of both
        {"who": "torch", "harness_us": 100.0, "graph_us": 90.0, "ncu_matched_us": 100.0},      # 11% off the graph
        {"who": "torch", "harness_us": 100.0, "graph_us": 99.0, "ncu_matched_us": None},  # ncu missing: graph decides
        {"who": "pycutlass", "harness_us": None, "graph_us": 99.0, "ncu_matched_us": 99.0},    # no harness: no verdict
        {"who": "torch", "harness_us": 100.0, "graph_us": None, "ncu_matched_us": None},       # nothing to judge by
    ])
    assert [row["within_3%"] for row in rows] == [True, False, True, False, False]
    assert rows[1]["harness/graph"] == pytest.approx(100 / 90, abs=1e-4)
    assert rows[2]["harness/ncu_matched"] is None and rows[2]["harness/ncu"] is None


def test_every_round_of_the_harness_is_judged_against_the_references():
    rows = agreement.agreement_rows([
        {"who": "pycutlass", "harness_us": 180.0, "harness_rounds": [179.5, 224.6, 180.0, 181.2, 180.4],
         "graph_us": 179.1, "ncu_matched_us": 181.3},
        {"who": "torch", "harness_us": 7.0, "harness_rounds": [7.0, None, 6.5], "graph_us": 7.0,
         "ncu_matched_us": None},
    ])
    assert rows[0]["within_3%"] and rows[0]["rounds_verdicts"] == [True, False, True, True, True]
    assert rows[0]["rounds_within"] == "4/5" and rows[0]["harness_spread"] == pytest.approx(224.6 / 179.5, abs=1e-4)
    assert rows[1]["rounds_verdicts"] == [True, False, False]  # a missing round and one 7% low fail


def test_ncu_clock_rate_is_read_in_mhz_per_series():
    lines = [HEADER]
    rows = [("spin_kernel(long)", "1.98"), ("pycutlass_gemm", "1.98"), ("pycutlass_gemm", "1.76"),
            ("spin_kernel(long)", "1.98"), ("sm90_xmma_gemm", "1.90")]
    for index, (kernel, value) in enumerate(rows):
        lines.append(_row(index, kernel, value, "cycle/nsecond").replace("gpu__time_duration.sum",
                                                                          agreement.NCU_CLOCK))
    lines.append(_row(9, "pycutlass_gemm", "12,000"))  # another metric's row is left alone
    found = agreement.parse_ncu_csv("".join(lines), series=2, metric=agreement.NCU_CLOCK)
    assert found == [pytest.approx(1870.0), pytest.approx(1900.0)]


def test_each_shape_gets_one_configuration_per_dtype():
    found = agreement.pairs()
    assert len(found) == 10
    assert {tuple(p["shape"]) for p in found} == set(agreement.SHAPES)
    assert {p["params"]["threadblock_shape"][0] for p in found if p["shape"] == [4096, 4096, 4096]} == {128}
    assert len(agreement.operations()) == 6  # 3 configurations x 2 dtypes


def test_the_kernel_timer_column_is_judged_beside_the_default_one():
    rows = agreement.agreement_rows([
        {"who": "torch", "harness_us": 7.0, "kernel_us": 5.8, "graph_us": 7.1, "ncu_matched_us": 7.2},
        {"who": "pycutlass", "harness_us": 20.5, "kernel_us": None, "graph_us": 21.0, "ncu_matched_us": 20.3},
    ])
    assert rows[0]["within_3%"] and not rows[0]["kernel_within_3%"]
    assert rows[0]["kernel/graph"] == pytest.approx(5.8 / 7.1, abs=1e-4)
    assert rows[1]["within_3%"] and "kernel_within_3%" not in rows[1]  # no kernel-timer figure: no verdict
