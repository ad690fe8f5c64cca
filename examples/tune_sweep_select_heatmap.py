"""A tuning sweep on a small grid: compile a search space (remembering failures), sweep it over a model's GEMM
shapes, pick the minimum kernel set at an efficiency threshold, and draw the heatmap and the Pareto curve.

    python examples/tune_sweep_select_heatmap.py                       # sm80-f16-small x llama-3-8b, batch 1..512
    python examples/tune_sweep_select_heatmap.py --space sm90-f16-small --model mistral-7b --out /tmp/sweep

The same as commands: `pycutlass sweep --space ... --problems model:llama-3-8b:tp=1:batch=1,16,128,512 --db D`,
`pycutlass select --db D --min-efficiency 0.98 --pareto P.png`, `pycutlass heatmap --db D H.png --select 0.98`.
Everything goes to --out (default: a fresh temporary directory); nothing is written to the working directory.
"""
import argparse
import tempfile
from pathlib import Path

import common
from pycutlass.tune.bench import BenchConfig
from pycutlass.tune.problems import model_problems
from pycutlass.tune.space import SearchSpace
from pycutlass.tune.sweep import Sweep

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--space", default="sm80-f16-small", help="a preset or a .toml space file")
parser.add_argument("--model", default="llama-3-8b")
parser.add_argument("--min-efficiency", type=float, default=0.98)
parser.add_argument("--out", type=Path, default=None, help="directory for the DB and figures")
args = parser.parse_args()
out = args.out or Path(tempfile.mkdtemp(prefix="pycutlass-sweep-"))
out.mkdir(parents=True, exist_ok=True)

space = SearchSpace.from_file(args.space) if args.space.endswith(".toml") else SearchSpace.preset(args.space)
problems = model_problems(args.model, tp_sizes=(1,), batch_sizes=(1, 16, 128, 512))
sweep = Sweep(space, problems, db=out / "sweep.db", name="example")
print(f"{args.space}: {space.build().summary()}; {len(problems)} {args.model} GEMM shapes")
print(f"compile: {sweep.compile()}")  # a second run takes every kernel from the cache
if not common.gpu_available():
    print(f"results DB: {out / 'sweep.db'} (compile status recorded); no GPU here, stopping before launch")
    raise SystemExit(0)

summary = sweep.benchmark(config=BenchConfig(repetitions=50))
print(f"benchmark: {summary}")
results = sweep.db.results(sweep="example")

from pycutlass.tune.plots import heatmap, pareto_plot, ratio_bars  # noqa: E402
from pycutlass.tune.select import greedy_select, pareto_curve, select_kernels  # noqa: E402

chosen = select_kernels(results, args.min_efficiency)
greedy = greedy_select(results, args.min_efficiency)
print(f"{len(chosen.kernels)} kernels cover all {len(chosen.assignment)} shapes at >= {args.min_efficiency} "
      f"(worst {chosen.worst:.3f}, geomean {chosen.geomean:.3f}); greedy selection needs {len(greedy.kernels)}")
for problem, kernel in sorted(chosen.assignment.items()):
    print(f"  {problem:28} -> {kernel}  ({chosen.efficiency[problem]:.3f})")
heatmap(results, out / "heatmap.png", selected=chosen)
pareto_plot(pareto_curve(results), out / "pareto.png", greedy=greedy)
# Same-run ratio of the best kernel per shape against torch (cuBLAS).
best = {problem: seconds for _, problem, seconds in sorted(results, key=lambda r: -r[2])}
baseline = {problem: seconds for kernel, problem, seconds in sweep.db.results(sweep="example", include_baselines=True)
            if kernel.startswith("torch.")}
ratio_bars([(p, baseline[p] / best[p]) for p in best if p in baseline], out / "vs_torch.png")
print(f"wrote {out / 'heatmap.png'}, {out / 'pareto.png'}, {out / 'vs_torch.png'}")
failed = sweep.db.query("select count(*) as n from runs where status = 'wrong'")[0]["n"]
common.finish([failed == 0])
