"""Argument rules the SM90 kinds share: the persistent grid's SM count, and the pointer-array kernels' knobs and
tensormap workspace (grouped GEMM and Array mode)."""
from __future__ import annotations

from ...errors import ArgumentError, CudaError


def check_sm_count(operation, sm_count) -> None:
    """An ``sm_count`` knob (None or 0: the device's) must be whole clusters: CUTLASS sizes the persistent grid from
    it without rounding, and a grid of partial clusters fails at launch (CUDA_ERROR_INVALID_CLUSTER_SIZE)."""
    cluster = operation.cluster_shape[0] * operation.cluster_shape[1]
    if sm_count and sm_count % cluster:
        raise ArgumentError(f"sm_count={sm_count} is not a multiple of the operation's cluster of {cluster} CTAs; "
                            f"the persistent grid is made of whole clusters")


def persistent_sm_count(operation, sm_count, device) -> int:
    """The SMs CUTLASS's persistent grid may use: the knob (checked by ``check_sm_count``) or the device's SM count
    rounded down to whole clusters."""
    cluster = operation.cluster_shape[0] * operation.cluster_shape[1]
    return sm_count or device.sm_count // cluster * cluster


# None: CUTLASS's own default for groups (along M; its heuristic looks at the grid, not at the groups' shapes).
GROUP_RASTER_ORDERS = {None: 1, "heuristic": 0, "along_m": 1, "along_n": 2}


def check_group_knobs(operation, raster_order, swizzle, sm_count) -> tuple:
    """The pointer-array kernels' knobs (raster order, swizzle, SM count) as the ABI struct takes them."""
    if raster_order not in GROUP_RASTER_ORDERS:
        raise ArgumentError(f"raster_order must be one of {list(GROUP_RASTER_ORDERS)}, got {raster_order!r}")
    if swizzle not in (None, 1, 2, 4, 8):
        raise ArgumentError(f"swizzle must be 1, 2, 4 or 8, got {swizzle!r}")
    if sm_count is not None:
        if isinstance(sm_count, bool) or not isinstance(sm_count, int) or sm_count < 1:
            raise ArgumentError(f"sm_count must be a positive integer, got {sm_count!r}")
        check_sm_count(operation, sm_count)
    return (GROUP_RASTER_ORDERS[raster_order], swizzle or 0, sm_count or 0)


def check_workspace(arguments, launch) -> None:
    """The builder's tensormap workspace size must be the one the arguments allocated (the per-SM descriptor slots
    the kernel re-targets); records the launch's CTA count."""
    if launch.workspace_bytes != arguments.workspace_bytes:
        raise CudaError(f"{arguments.operation.name}: the builder sized the tensormap workspace at "
                        f"{launch.workspace_bytes} bytes, pycutlass at {arguments.workspace_bytes} (sm_count "
                        f"{arguments.sm_count})", operation=arguments.operation.name)
    arguments.threadblock_count = launch.grid[0] * launch.grid[1] * launch.grid[2]
