"""The rules a description can break: each ``DescriptionError`` names one by a stable code (``error.rule``).

Codes are dotted, grouped by what states the rule: ``tile.``, ``tensor.``, ``instruction.``, ``epilogue.`` for the
descriptions themselves, ``smem.``/``alignment.`` for limits every family has, ``sm80.``/``sm90.`` for a template
family's rules, and a kind's name for its own (``conv2d.``, ``grouped.``, ``evt.``, ...). A code never changes its
meaning; the summary is what tuning reports for every configuration a rule rejected (``tune.space.reason_of``) and
what docs/object-model.md lists. Every ``rule=`` at a raise site is a key of ``RULES`` (tests/cpu/test_rules.py).
"""
from __future__ import annotations

from types import MappingProxyType

RULES = MappingProxyType({
    # ---- limits every family has --------------------------------------------------------------------------------
    "smem.capacity": "too much shared memory",
    "alignment.invalid": "alignment not valid for the type",
    "alignment.max_128b": "alignment wider than 128 bits",
    "alignment.multistage_32b": "alignment below 32 bits with stages > 2",
    "alignment.epilogue_match": "epilogue alignment differs from C's",
    "alignment.simt": "SIMT alignment above 1",
    "target.compute_capability": "compute capability not supported here",
    "target.invalid": "not a target architecture",
    "target.family": "target cannot run the template family",
    "swizzle.unsupported": "swizzling functor not built for the kind",
    "bias.unsupported": "bias mode not built for the kind",
    "scales.unsupported": "row-wise scale mode not built for the kind or not with that epilogue",
    "direct_store.unsupported": "direct-store epilogue does not fit the operation",
    # ---- descriptions -------------------------------------------------------------------------------------------
    "description.field_type": "a field of the wrong type or value",
    "instruction.shape": "instruction shape not three integers",
    "instruction.unsupported": "math instruction not supported",
    "instruction.warpgroup_unsupported": "wgmma instruction not supported",
    "instruction.mixed_operands": "math instruction operand types differ",
    "tile.stages": "stages not 0 or 2..10",
    "tile.sm90_only_values": "SM90-only value in an Sm80-family kernel",
    "tensor.interleaved_type": "interleaved layout for a type other than int8",
    "epilogue.clamp_output": "clamp epilogue needs an int8, int32, f16 or bf16 output",
    "epilogue.output_type": "epilogue output type differs from C's",
    "epilogue.accumulator_type": "epilogue accumulator type differs from the instruction's",
    "epilogue.alignment": "epilogue alignment not a power of two within one access",
    "epilogue.compute_type": "epilogue compute type not allowed",
    "epilogue.integer_output": "int32 accumulators in float32 need an integer output",
    "epilogue.fast_clamp": "FastLinearCombinationClamp types are fixed",
    "epilogue.activation_type": "activation cannot compute in that type",
    "evt.unsupported": "epilogue visitor tree not built for the kind",
    "evt.operation": "operation not supported in an epilogue visitor tree",
    "evt.constant": "visitor tree constant not a finite number",
    "evt.reduction": "visitor tree reduction misused",
    "evt.signature": "visitor tree __call__ not of the supported form",
    "evt.capacity": "visitor tree has too many tensors or scalars",
    "evt.types": "visitor tree element types not allowed",
    "evt.tensor_op": "visitor tree needs a tensor-op instruction",
    "evt.layout": "visitor tree operand layout not supported",
    # ---- the Sm80 family (CUTLASS 2.x) --------------------------------------------------------------------------
    "sm80.warp_divides_tile": "tile not divisible by the warp count",
    "sm80.warp_count_k": "warp_count along K must be 1",
    "sm80.threads_per_block": "too many threads per block",
    "sm80.warp_tile_instruction": "warp tile not a multiple of the instruction shape",
    "sm80.warp_tile_n": "warp tile N not 16, 32, 64 or 128",
    "sm80.warp_tile_f64": "float64 warp tile M or N not a multiple of 16",
    "sm80.tile_k_steps": "tile K below two instruction K-steps",
    "sm80.simt_warp_tile": "SIMT warp tile not a 4x8 lane arrangement",
    "sm80.warp_tile_n128": "128-wide warp tile without a float32 output",
    "sm80.warp_tile_n16_mixed": "16-wide warp tile with the mixed-precision epilogue",
    "sm80.epilogue_thread_map": "epilogue thread map does not fit the tile",
    "sm80.mainloop_thread_map": "main-loop thread map does not fit the tile",
    "sm80.int8_k_major": "int8 needs A row-major, B column-major",
    "sm80.operand_element": "operand element differs from the instruction's",
    "sm80.layout": "layouts not matrix layouts of the kind",
    "sm80.interleaved": "interleaved int8 configuration not built",
    "sm80.f64_warps": "float64 tensor-op epilogue on one warp",
    "sm80.f64_stages": "float64 tensor op with 2 stages",
    "sm80.simt_epilogue_n": "SIMT tile N not a multiple of 32",
    "sm80.simt_lanes": "SIMT warp tile not divided by the lanes",
    "sm80.simt_padding": "SIMT shared-memory padding not a multiple of the lane tile",
    "sm80.narrow_warp_tile": "warp tile too narrow for the 16-bit warp iterators",
    "sm80.epilogue_accesses": "fewer than 4 C accesses per warp-tile row",
    "sm80.int_epilogue_alignment": "C alignment not built for int32 accumulators",
    "sm80.crosswise_tile_k": "tile K wider than a shared-memory line",
    "sm80.congruous_tile": "tile extent not built for a congruous operand",
    # ---- the SM90 family (CUTLASS 3.x) --------------------------------------------------------------------------
    "sm90.tensor_op": "SM90 kernels compute on tensor cores",
    "sm90.operand_type": "operand type not in the SM90 family",
    "sm90.accumulator": "accumulator type not offered for the SM90 operands",
    "sm90.operand_element": "operand element differs from the instruction's",
    "sm90.layout": "SM90 operand layout not row- or column-major",
    "sm90.alignment_16b": "SM90 needs 16-byte alignment",
    "sm90.k_major": "SM90 operand type needs A row-major, B column-major",
    "sm90.output_type": "C type not built for the SM90 operands",
    "sm90.epilogue_kind": "epilogue not built for the SM90 family",
    "sm90.epilogue_compute": "SM90 epilogue must compute in float32",
    "sm90.tile_m": "SM90 tile M not 64, 128 or 256",
    "sm90.tile_n": "SM90 tile N not one the kernel builds",
    "sm90.tile_k_bytes": "SM90 tile K must be 128 bytes",
    "sm90.cluster_shape": "SM90 cluster not 1x1x1, 2x1x1 or 1x2x1",
    "sm90.fast_accum_operands": "FP8FastAccum schedule without fp8 operands",
    "sm90.cooperative_tile_m": "cooperative schedule needs tile M 128 or 256",
    "sm90.schedule_tile_m": "one-warpgroup schedule needs tile M of 64 or 128",
    "sm90.stream_k_schedule": "stream-K needs the cooperative schedule",
    "sm90.tile_scheduler": "tile scheduler must be Default",
    "sm90.kernel_schedule": "kernel schedule not built for the kind",
    "sm90.epilogue_schedule": "epilogue schedule does not fit the kernel schedule",
    "sm90.epilogue_tile": "epilogue tile outside what the SM90 kind builds",
    "sm90.nosmem_epilogue": "NoSmemWarpSpecialized epilogue with activation, clamp or bias",
    "sm90.warp_count_derived": "SM90 warp_count must be derived",
    # ---- kinds --------------------------------------------------------------------------------------------------
    "conv2d.operand_type": "operand type not built for convolutions",
    "conv2d.int8_kind": "int8 convolution other than fprop",
    "conv2d.interleaved": "interleaved int8 convolution configuration not built",
    "conv2d.layout": "convolution operand not TensorNHWC",
    "conv2d.iterator_algorithm": "iterator algorithm not built for the convolution",
    "conv2d.two_stage_f32": "two-stage convolution with a fast-f32 math operation",
    "conv2d.f64_alignment": "float64 tensor-op convolution alignment above 1",
    "conv2d.strided_dgrad_swizzle": "swizzle does not fit the strided dgrad",
    "conv2d.strided_dgrad_alignment": "2-stage strided dgrad alignment below the vector",
    "conv2d_sm90.dgrad_stride": "SM90 dgrad needs stride_support unity",
    "conv2d_sm90.layout": "SM90 convolution operand not TensorNHWC",
    "conv2d_sm90.filter_taps_tile": "filter-tap-reuse wgrad tile or instruction not built",
    "grouped.layout": "grouped GEMM operand not row- or column-major",
    "grouped.precompute_mode": "SM90 grouped GEMM needs SchedulerMode.Device",
    "grouped.persistent_grid": "the SM90 grouped kernel sizes its own grid",
    "reduction.layout": "reduction output layout not supported",
    "reduction.epilogue": "reduction epilogue does not match its output",
    "reduction.count": "reduction count not a power of two within one access",
    "reduction.shape": "reduction shape does not fit the count or 1024 threads",
})


def summary(rule: str | None) -> str | None:
    """The one-line summary of ``rule`` (None for no rule or an unknown one)."""
    return RULES.get(rule) if rule else None


def markdown_table() -> str:
    """The table of codes docs/object-model.md lists (between its ``rule codes`` markers)."""
    rows = [f"| `{code}` | {text} |" for code, text in RULES.items()]
    return "\n".join(["| rule | what it rejects |", "| --- | --- |", *rows])
