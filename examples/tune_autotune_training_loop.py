"""Autotuning: a tuned GEMM inside a training-style loop whose batch size varies, with a persistent
tuning cache keyed by power-of-two buckets of M, N, K.

    python examples/tune_autotune_training_loop.py [--space sm80-f16-small] [--db PATH] [--steps 40]

The first call in each bucket compiles (once, cached) and times every candidate; every later call is one dict
lookup. A second run of the script tunes nothing: the tuning cache lives in the DB (default: a temporary file).
Each step's output is checked against float64 (outputs poisoned with NaN first).
"""
import argparse
import random
import tempfile
import time
from pathlib import Path

import common
from pycutlass.tune.autotune import Tuned
from pycutlass.tune.space import SearchSpace
from pycutlass.tune.sweep import Sweep

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--space", default="sm80-f16-small")
parser.add_argument("--db", type=Path, default=None)
parser.add_argument("--steps", type=int, default=40)
args = parser.parse_args()
db = args.db or Path(tempfile.mkdtemp(prefix="pycutlass-tune-")) / "tuning.db"
space = SearchSpace.preset(args.space)

if not common.gpu_available():
    summary = Sweep(space, db=db, name="autotune").compile()  # what tuning would compile first
    print(f"compiled the candidates: {summary}; no GPU here, stopping before launch")
    raise SystemExit(0)

import torch  # noqa: E402

gemm = Tuned(space, db=db, policy="pow2")
hidden, ffn = 1024, 4096
rng = random.Random(0)
weights = torch.randn(ffn, hidden, device="cuda").half() / hidden ** 0.5  # (N x K) row-major = B column-major
results, start = [], time.perf_counter()
for step in range(args.steps):
    tokens = rng.choice([96, 128, 200, 256, 384, 512, 1000])  # variable sequence packing: M changes every step
    x = torch.randn(tokens, hidden, device="cuda").half()
    y = torch.full((tokens, ffn), float("nan"), device="cuda").half()
    gemm(x, weights.t(), y)
    reference = (x.double() @ weights.t().double()).cpu().numpy()
    results.append(common.relative_error(y, reference) < common.TOLERANCE)
torch.cuda.synchronize()
dispatched = gemm.dispatched()
print(f"{args.steps} steps in {time.perf_counter() - start:.1f} s, {len(dispatched)} distinct shapes dispatched; "
      f"tuning cache: {db}")
for shape, op in sorted(dispatched.items()):
    print(f"  M={shape[0]:5} N={shape[1]} K={shape[2]} -> {op.name}")
print(f"{sum(results)}/{len(results)} steps PASS")
common.finish(results)
