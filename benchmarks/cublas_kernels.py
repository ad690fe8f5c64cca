"""Which kernels cuBLAS runs for the gemm_sm90 benchmark shapes (torch.profiler): what its heuristics pick on
this GPU, to compare tile shapes, clusters and split-K with the SM90 grid.

    python benchmarks/cublas_kernels.py > benchmarks/results/cublas-kernels-h100.log
"""
import torch
from torch.profiler import profile, ProfilerActivity
SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (2048, 14336, 4096), (4096, 14336, 4096), (1024, 1024, 1024),
          (16, 4096, 4096), (64, 14336, 4096), (128, 4096, 14336), (1000, 3000, 520)]
for dtype in (torch.float16, torch.bfloat16):
    for m, n, k in SHAPES:
        A = torch.randn(m, k, device="cuda", dtype=dtype)
        B = torch.randn(n, k, device="cuda", dtype=dtype).t()
        for _ in range(3):
            torch.matmul(A, B)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            torch.matmul(A, B)
            torch.cuda.synchronize()
        names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        print(dtype, f"{m}x{n}x{k}", " | ".join(names), flush=True)
