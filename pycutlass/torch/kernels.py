"""Which CUTLASS operations can serve a torch call, and which one to use before anything is tuned.

A call's *class* is everything that decides the kernel's description (types, layouts, alignment, epilogue, bias); its
*problem* is the shape. Candidates are small, deliberate sets: the SM90 (TMA + WGMMA) configurations that won at
least one shape of ``benchmarks/gemm_sm90.py`` on an H100, and Sm80-family configurations for what SM90 does not
build (alignments below 16 bytes, float64, convolutions). When a layer is tuned, an SM90 class draws that layer's
candidates from the whole SM90 grid ranked for its shape (:func:`ranked_gemm_candidates`); the fixed sets serve
untuned calls and every class the ranking does not cover. Descriptions only: nothing here compiles or needs torch.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import DescriptionError
from ..tune.space import build_operation

SM90_TILE_N = (32, 64, 128, 192, 256)
SM90_SCHEDULES = ("TmaWarpSpecialized", "TmaWarpSpecializedCooperative", "TmaWarpSpecializedPingpong")
SM90_CLUSTERS = ([1, 1, 1], [2, 1, 1], [1, 2, 1])

DTYPES = {"float16": "f16_f32acc", "bfloat16": "bf16", "float64": "f64"}
_BITS = {"float16": 16, "bfloat16": 16, "float64": 64}


@dataclass(frozen=True)
class GemmClass:
    dtype: str  # torch dtype name
    a_row: bool
    b_row: bool
    alignment: int  # elements, for A, B and C alike
    activation: str
    bias: bool
    c: bool
    cc: int  # the device's compute capability

    @property
    def sm90(self) -> bool:
        # TMA needs 16-byte aligned strides; Sm80-family kernels build bias as a broadcast C, so not with C as well
        return self.cc == 90 and self.dtype in ("float16", "bfloat16") and self.alignment * _BITS[self.dtype] == 128

    def signature(self) -> dict:
        return {"kind": "torch.gemm", "dtype": self.dtype, "layouts": ("r" if self.a_row else "c") +
                ("r" if self.b_row else "c") + "r", "alignment": self.alignment, "activation": self.activation,
                "bias": self.bias, "c": self.c, "family": 90 if self.sm90 else 80}


@dataclass(frozen=True)
class ConvClass:
    dtype: str
    conv_kind: str  # fprop, dgrad, wgrad
    alignment: int
    activation: str
    bias: bool
    unit_stride: bool
    cc: int

    def signature(self) -> dict:
        return {"kind": f"torch.conv2d_{self.conv_kind}", "dtype": self.dtype, "alignment": self.alignment,
                "activation": self.activation, "bias": self.bias}


# SM90: (tile, cluster, kernel schedule); the best of benchmarks/gemm_sm90.py's grid on an H100, f16 and bf16.
SM90_CONFIGS = (
    ([128, 256, 64], [2, 1, 1], "TmaWarpSpecializedCooperative"),
    ([256, 128, 64], [1, 2, 1], "TmaWarpSpecializedCooperative"),
    ([128, 128, 64], [2, 1, 1], "TmaWarpSpecializedPingpong"),
    ([64, 128, 64], [1, 1, 1], "TmaWarpSpecialized"),
    ([64, 256, 64], [1, 2, 1], "TmaWarpSpecialized"),
)
# Sm80 family: (tile, warps, stages).
SM80_GEMM_CONFIGS = (
    ([128, 256, 32], [2, 4, 1], 3), ([256, 128, 32], [4, 2, 1], 3), ([128, 128, 32], [2, 2, 1], 4),
    ([128, 64, 32], [2, 2, 1], 4), ([64, 64, 64], [2, 2, 1], 3),
)
SM80_F64_CONFIGS = (([64, 64, 16], [2, 2, 1], 4), ([128, 64, 16], [2, 2, 1], 3))
SM80_CONV_CONFIGS = (
    ([128, 128, 32], [2, 2, 1], 3), ([128, 128, 64], [2, 2, 1], 3), ([256, 64, 32], [4, 2, 1], 3),
    ([128, 64, 32], [2, 2, 1], 4), ([64, 64, 64], [2, 2, 1], 3),
)


def _gemm_params(cls: GemmClass, tile, extra: dict) -> dict:
    epilogue = "linear_combination" if cls.activation == "identity" else cls.activation
    return {"kind": "gemm", "dtypes": DTYPES[cls.dtype],
            "layouts": ("r" if cls.a_row else "c") + ("r" if cls.b_row else "c") + "r",
            "alignment": [cls.alignment] * 3, "epilogue": epilogue, "threadblock_shape": tile, **extra}


def build(params: dict):
    """The operation for a candidate's params (``bias`` is the SM90 bias mode, beside the space's fields)."""
    return build_operation(params)


def gemm_candidates(cls: GemmClass) -> list[tuple[dict, object]]:
    """(params, operation) for every configuration that builds for this class; may be empty."""
    if cls.dtype not in DTYPES or (cls.bias and cls.c and not cls.sm90) or cls.cc < 80:
        return []  # (every candidate is Sm80 family or SM90: cp.async and these MMAs need compute capability 8.0)
    found = []
    if cls.sm90:
        for tile, cluster, schedule in SM90_CONFIGS:
            extra = {"compute_capability": 90, "cluster_shape": cluster, "kernel_schedule": schedule}
            if cls.bias:
                extra["bias"] = "column"
            found.append(_gemm_params(cls, tile, extra))
    else:
        configs = SM80_F64_CONFIGS if cls.dtype == "float64" else SM80_GEMM_CONFIGS
        for tile, warps, stages in configs:
            found.append(_gemm_params(cls, tile, {"compute_capability": 80, "warp_count": warps, "stages": stages}))
    return _buildable(found)


def sm90_grid(cls: GemmClass) -> list[tuple[dict, object]]:
    """Every SM90 configuration that builds for the class and can win (tiles M 64/128/256 x N 32..256, clusters
    1x1/2x1/1x2, the three kernel schedules, stream-K with the cooperative one); empty for a non-SM90 class."""
    if not cls.sm90 or cls.dtype not in DTYPES:
        return []
    from ..tune.rank import cannot_win, config_of

    found = []
    for m in (64, 128, 256):
        for n in SM90_TILE_N:
            for cluster in SM90_CLUSTERS:
                for schedule in SM90_SCHEDULES:
                    cooperative = schedule.endswith("Cooperative")
                    if (m == 64 and cooperative) or (m == 256 and not cooperative):
                        continue  # the descriptions reject these (cooperative splits M in two; the others take 64, 128)
                    for scheduler in ("Default", "StreamK") if cooperative else ("Default",):
                        extra = {"compute_capability": 90, "cluster_shape": cluster, "kernel_schedule": schedule,
                                 "tile_scheduler": scheduler}
                        if cls.bias:
                            extra["bias"] = "column"
                        params = _gemm_params(cls, [m, n, 64], extra)
                        if cannot_win(config_of(params)) is None:
                            found.append(params)
    return _buildable(found)


def ranked_gemm_candidates(cls: GemmClass, problem, top_k: int | None, grid=None, device=None) -> list:
    """A layer's candidates: the ``top_k`` configurations of the SM90 grid ranked best for ``problem`` (m, n, k[,
    batch]); for classes without a ranked grid (Sm80 family, float64) the fixed candidates."""
    grid = sm90_grid(cls) if grid is None else grid
    if not grid:
        return gemm_candidates(cls)
    from ..tune.problems import GemmProblem
    from ..tune.rank import top_k as best

    shape = GemmProblem(*(int(v) for v in tuple(problem)[:3]))
    return best(grid, shape, top_k, device)


def conv_candidates(cls: ConvClass) -> list[tuple[dict, object]]:
    if cls.dtype not in ("float16", "bfloat16") or cls.cc < 80:
        return []
    epilogue = "linear_combination" if cls.activation == "identity" else cls.activation
    found = []
    for tile, warps, stages in SM80_CONV_CONFIGS:
        found.append({"kind": "conv2d", "compute_capability": 80, "dtypes": DTYPES[cls.dtype],
                      "alignment": [cls.alignment] * 3, "epilogue": epilogue, "conv_kind": cls.conv_kind,
                      "iterator_algorithm": "optimized",
                      "stride_support": "unity" if cls.conv_kind == "dgrad" and cls.unit_stride else "strided",
                      "threadblock_shape": tile, "warp_count": warps, "stages": stages,
                      # CUTLASS's strided dgrad kernel walks the output with its own swizzle
                      **({"swizzle": "StridedDgradIdentitySwizzle1"}
                         if cls.conv_kind == "dgrad" and not cls.unit_stride else {})})
    return _buildable(found)


def _buildable(params_list) -> list[tuple[dict, object]]:
    built = []
    for params in params_list:
        try:
            built.append((params, build(params)))
        except DescriptionError:  # this configuration does not exist for the class (e.g. its alignment)
            continue
    return built


def _first(candidates, small_problem: bool):
    """The first 64-row tile for a small problem (more CTAs to fill the GPU), else the first (largest) candidate."""
    if not candidates:
        return None
    small = [c for c in candidates if c[0]["threadblock_shape"][0] == 64]
    return small[0] if small_problem and small else candidates[0]


def default_gemm(candidates, m: int, n: int):
    """The untuned choice: small-M tiles for decode-like shapes, the large cooperative tile otherwise."""
    return _first(candidates, m <= 128)


def default_conv(candidates, gemm_m: int, gemm_n: int):
    """The untuned choice for a convolution, by the sizes of its implicit GEMM."""
    return _first(candidates, gemm_m < 4096 or gemm_n <= 64)
