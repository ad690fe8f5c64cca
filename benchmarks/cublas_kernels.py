"""Which kernels cuBLAS runs for the gemm_sm90 benchmark shapes (torch.profiler): what its heuristics pick on
this GPU, to compare tile shapes, clusters and split-K with the SM90 grid.

    python benchmarks/cublas_kernels.py
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from gemm_sm90 import SHAPES  # noqa: E402


def main() -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    for dtype in (torch.float16, torch.bfloat16):
        for m, n, k in SHAPES:
            A = torch.randn(m, k, device="cuda", dtype=dtype)
            B = torch.randn(n, k, device="cuda", dtype=dtype).t()  # ColumnMajor, as gemm_sm90 times it
            for _ in range(3):
                torch.matmul(A, B)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                torch.matmul(A, B)
                torch.cuda.synchronize()
            names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
            print(dtype, f"{m}x{n}x{k}", " | ".join(names), flush=True)


if __name__ == "__main__":
    main()
