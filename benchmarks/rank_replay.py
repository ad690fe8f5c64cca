"""How well the ranking picks grouped-GEMM and convolution kernels, replayed on kernels measured earlier (no GPU).

    python benchmarks/rank_replay.py                     # every recorded source below
    python benchmarks/rank_replay.py --out FILE.json

The ranking (``pycutlass.tune.rank``) estimates a grouped GEMM as its GEMM model over all groups in one persistent
launch, and a convolution as the implicit GEMM of its kind. Each source is a table of kernels timed on one GPU (the
MoE sets of ``benchmarks/moe.py``, the ResNet-50 layers of ``benchmarks/conv2d.py``); for every problem the kernels
it timed are ranked, and the best measured time among the ranked top K is compared with the best of them all: hits
within 2% and the geometric-mean regret, for K = 1, 2, 4, 8, beside the expectation of K kernels drawn at random.
Convolution problems count where at least 9 kernels were timed (split-K and the filter-tap kernels left out: they
are timed with their own slice counts). Writes benchmarks/results/rank-replay-h200.json (``--out``).
"""
from __future__ import annotations

import argparse
import json
import math
import random
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import print_table, write_json  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
KS = (1, 2, 4, 8)
MOE_SOURCES = (("moe-forward-settled-h200.json", "rows", "contiguous"),
               ("moe-forward-again-h200.json", "rows", "contiguous"),
               ("moe-forward-candidates-h200.json", "rows", "contiguous"),
               ("moe-masked-settled-h200.json", "masked", "masked"))
CONV_SOURCES = ("conv2d-fprop-h200.json", "conv2d-wgrad-h200.json", "conv2d-h200.json")
CONV_MIN_KERNELS = 9
RANDOM_DRAWS = 2000


def score(problems: list[tuple[list[float], dict[str, float]]]) -> dict:
    """problems: (measured seconds in rank order, every measured seconds by kernel). Hits and regret per K, for the
    ranking and for K kernels drawn at random."""
    found = {}
    rng = random.Random(0)
    for k in KS:
        hits, logs, random_hits, random_logs = 0, 0.0, 0.0, 0.0
        for ranked, measured in problems:
            best = min(measured.values())
            got = min(ranked[:k])
            hits += got <= 1.02 * best
            logs += math.log(got / best)
            times = list(measured.values())
            for _ in range(RANDOM_DRAWS):
                drawn = min(rng.sample(times, min(k, len(times))))
                random_hits += (drawn <= 1.02 * best) / RANDOM_DRAWS
                random_logs += math.log(drawn / best) / RANDOM_DRAWS
        n = len(problems)
        found[k] = {"problems": n, "within_2%": hits, "regret_%": round((math.exp(logs / n) - 1) * 100, 2),
                    "random_within_2%": round(random_hits, 1),
                    "random_regret_%": round((math.exp(random_logs / n) - 1) * 100, 2)}
    return found


# ---- MoE grouped GEMMs (benchmarks/moe.py) ----------------------------------------------------------------------
_TILE = re.compile(r"(\d+)x(\d+)x(\d+)_c(\d)x(\d)_(coop|pp)(?:_e(\d+)x(\d+))?$")


def moe_operation(name: str):
    """The bf16 grouped GEMM moe.py timed under ``name`` (``128x256x64_c1x2_coop``, ``..._e128x64``)."""
    from moe import _bf16_grouped

    found = _TILE.match(name)
    if found is None:
        raise SystemExit(f"unrecognised tile name {name!r}")
    m, n, k, cm, cn = (int(v) for v in found.groups()[:5])
    schedule = {"coop": "TmaWarpSpecializedCooperative", "pp": "TmaWarpSpecializedPingpong"}[found.group(6)]
    epilogue = (int(found.group(7)), int(found.group(8))) if found.group(7) else None
    return _bf16_grouped([((m, n, k), (cm, cn, 1), schedule, *([epilogue] if epilogue else []))],
                         "RowMajor", "ColumnMajor")[0]


def moe_problem(set_name: str, layout: str):
    """``"deepseek-v3 ep8 up 4096"`` -> its grouped problem (moe.py's sets, seed 0)."""
    from moe import problem_sets

    *model, projection, tokens = set_name.split()
    sets = problem_sets([int(tokens)], "forward", layout)
    return list(sets[" ".join(model)])[0 if projection == "up" else 1]


def replay_moe(device) -> list[dict]:
    from pycutlass.tune.rank import rank

    rows = []
    for file, key, layout in MOE_SOURCES:
        path = RESULTS / file
        if not path.exists():
            continue
        recorded = json.loads(path.read_text())
        operations, problems = {}, []
        for entry in recorded[key]:
            measured = entry["_tiles"]
            ops = [operations.setdefault(name, moe_operation(name)) for name in measured]
            by_name = {op.name: name for name, op in zip(measured, ops)}
            ranked = rank(ops, moe_problem(entry["set"], layout), device)
            problems.append(([measured[by_name[r.point.name]] for r in ranked], measured))
        rows.append({"source": file, "kind": f"grouped GEMM ({layout})", "kernels": len(operations),
                     "device": recorded.get("device", "?"), **{f"K={k}": v for k, v in score(problems).items()}})
    return rows


# ---- convolutions (benchmarks/conv2d.py) -------------------------------------------------------------------------
def replay_conv(device) -> list[dict]:
    import conv2d as bench
    from pycutlass.tune.problems import Conv2dProblem
    from pycutlass.tune.rank import rank

    rows = []
    for file in CONV_SOURCES:
        path = RESULTS / file
        if not path.exists():
            continue
        recorded = json.loads(path.read_text())
        kinds = sorted({k["kind"] for k in recorded["kernels"]})
        labelled = {}
        for (kind, _), ops in bench.grid(kinds).items():
            labelled.update({(kind, bench._label(op, 1)): op for op in ops})
        for kind, ops in bench.sm90_grid(kinds).items():
            labelled.update({(kind, bench._label(op, 1)): op for op in ops})
        timed: dict[tuple, dict[str, float]] = {}
        for kernel in recorded["kernels"]:
            if kernel.get("correct") and (kernel["kind"], kernel["config"]) in labelled:
                timed.setdefault((kernel["kind"], kernel["layer"], kernel["batch"]), {})[kernel["config"]] = \
                    kernel["ms"]
        problems = []
        for (kind, layer, batch), measured in timed.items():
            if len(measured) < CONV_MIN_KERNELS:
                continue
            shape = recorded["layers"][layer]
            problem = Conv2dProblem(batch, shape["H"], shape["W"], shape["C"], shape["K"], shape["R"], shape["S"],
                                    (shape["R"] // 2, shape["S"] // 2), (shape["stride"],) * 2)
            ops = {labelled[(kind, label)].name: label for label in measured}
            ranked = rank([labelled[(kind, label)] for label in measured], problem, device)
            problems.append(([measured[ops[r.point.name]] for r in ranked], measured))
        if problems:
            rows.append({"source": file, "kind": f"Conv2d ({', '.join(kinds)})", "kernels": len(labelled),
                         "device": recorded.get("device", "?"), **{f"K={k}": v for k, v in score(problems).items()}})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="H200", help="the ranking's device model (the sources' GPU)")
    parser.add_argument("--out", default=str(RESULTS / "rank-replay-h200.json"))
    args = parser.parse_args()
    from pycutlass.tune.rank import device_model

    device = device_model(args.device)
    rows = replay_moe(device) + replay_conv(device)
    table = [{"source": r["source"], "kind": r["kind"], "problems": r["K=1"]["problems"],
              **{f"K={k}": f"{r[f'K={k}']['within_2%']} ({r[f'K={k}']['regret_%']}%)" for k in KS},
              **{f"random K={k}": f"{r[f'K={k}']['random_within_2%']} ({r[f'K={k}']['random_regret_%']}%)"
                 for k in (4, 8)}} for r in rows]
    print_table("ranked top K: problems whose best within 2% of the best timed (geomean regret)", table)
    write_json(args.out, {"device_model": args.device, "rows": rows})


if __name__ == "__main__":
    main()
