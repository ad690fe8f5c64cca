"""Compile here, run there: build a bundle of compiled kernels on a machine without a GPU, run it on
the GPU host without compiling, bring the results back, and correlate time with kernel resources.

    python examples/tune_compile_here_run_there.py --target 90          # here: writes the bundle
    pycutlass sweep --bundle sweep.bundle --db there.db                  # there (GPU host)
    pycutlass db merge home.db there.db && pycutlass db correlate home.db --scatter resources.png

Without a GPU the script stops after writing the bundle; with one it also runs it and merges the results.
"""
import argparse
import tempfile
from pathlib import Path

import common
import pycutlass
from pycutlass.tune.bundle import Bundle, export_bundle, run_bundle
from pycutlass.tune.problems import explicit_problems
from pycutlass.tune.space import SearchSpace
from pycutlass.tune.sweep import Sweep

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--space", default="sm80-f16-small")
parser.add_argument("--target", default=None, help="the GPU that will run it (default: this GPU's, else 90)")
parser.add_argument("--out", type=Path, default=None)
args = parser.parse_args()
out = args.out or Path(tempfile.mkdtemp(prefix="pycutlass-bundle-"))
out.mkdir(parents=True, exist_ok=True)
target = args.target or common.compute_capability()

problems = explicit_problems([(16, 4096, 4096), (256, 4096, 4096), (4096, 4096, 4096), (1000, 3000, 520)])
sweep = Sweep(SearchSpace.preset(args.space), problems, db=out / "compile.db",
              session=pycutlass.Session(target=target))
path = export_bundle(sweep, out / "sweep.bundle", target=target)
bundle = Bundle.open(path)  # checks every hash
print(f"wrote {path}: {len(bundle.manifest['kernels'])} kernels for {bundle.target}, "
      f"{path.stat().st_size // 1024} KB")
if not common.gpu_available():
    print("no GPU here, stopping before launch (copy the bundle to a GPU host: pycutlass sweep --bundle FILE)")
    raise SystemExit(0)

from pycutlass.tune.db import ResultsDB  # noqa: E402
from pycutlass.tune.resources import correlation_report, resource_points  # noqa: E402

summary = run_bundle(path, out / "there.db")  # the GPU host's side: nothing compiles
print(f"benchmark: {summary}")
with ResultsDB(out / "home.db") as home:
    print(f"merged: {home.merge(out / 'there.db')}; again: {sum(home.merge(out / 'there.db').values())} rows")
    for row in correlation_report(resource_points(home))[:6]:
        print(f"  {row['class']:8} {row['resource']:14} Spearman {row['spearman']:+.2f} (n={row['n']})")
    wrong = home.query("select count(*) as n from runs where status != 'ok'")[0]["n"]
common.finish([wrong == 0])
