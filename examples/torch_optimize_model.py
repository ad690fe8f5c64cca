"""Optimizing a PyTorch model: its Conv2d + BatchNorm + ReLU and Linear + GELU layers swapped for fused CUTLASS
kernels (partition), each distinct call tuned against torch (tune), the result saved with its tuning decisions and
loaded back without tuning again (build).

    python examples/torch_optimize_model.py [--batch 16]

Without a GPU it runs the model pass on the CPU (the fused ops run torch's math there), prints what was matched and
stops. With one, the model runs in float16 channels_last; the optimized and the reloaded model are checked against
the float64 model (outputs poisoned with NaN first) and timed against eager.
"""
import argparse
import tempfile

import common

try:
    import torch
    from torch import nn
except ImportError:
    print("this example needs torch; no GPU here, stopping before launch")
    raise SystemExit(0)

import pycutlass.torch as pct

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--batch", type=int, default=16)
args = parser.parse_args()


class SmallNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(16, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
                                      nn.Conv2d(64, 64, 3, stride=2, padding=1), nn.BatchNorm2d(64), nn.ReLU())
        self.head = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))

    def forward(self, x):
        x = self.features(x).mean((2, 3))
        return self.head(x)


torch.manual_seed(0)
model = SmallNet()
with torch.no_grad():  # running statistics from a few random batches, so BatchNorm folding has something to fold
    model.train()
    for _ in range(3):
        model(torch.randn(8, 16, 32, 32))
model.eval()

if not common.gpu_available():
    fast = pct.optimize(model, (torch.randn(2, 16, 32, 32),), tune=False)
    print(pct.report(fast))
    print("matched the layers above (tuning needs a GPU); no GPU here, stopping before launch")
    raise SystemExit(0)

x = torch.randn(args.batch, 16, 32, 32, device="cuda").half().contiguous(memory_format=torch.channels_last)
model = model.cuda()
with torch.no_grad():
    reference = model.double()(x.double()).cpu().numpy()
    model = model.half().to(memory_format=torch.channels_last)
    fast = pct.optimize(model, (x,))
    print(pct.report(fast))
    torch.empty(args.batch * 64 * 4, device="cuda").fill_(float("nan"))  # poison the allocator's next blocks
    results = [common.check("optimized model vs float64", fast(x), reference, 2e-2)]
    with tempfile.TemporaryDirectory(prefix="pycutlass-model-") as directory:
        pct.save(fast, directory)
        again = pct.load(directory)
        results.append(common.check("saved and loaded model vs float64", again(x), reference, 2e-2))

    def milliseconds(fn, repeats=50):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        fn()
        start.record()
        for _ in range(repeats):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / repeats

    eager_ms, fast_ms = milliseconds(lambda: model(x)), milliseconds(lambda: fast(x))
    print(f"eager {eager_ms:.3f} ms, optimized {fast_ms:.3f} ms ({eager_ms / fast_ms:.2f}x)")
common.finish(results)
