"""Operations PyCUTLASS 2.11's own unit tests build that need relaxed validation (shared by
tests/cpu/test_pycutlass211_units.py and tests/gpu/test_pycutlass211_units.py):

- ``GemmOperationUniversal(..., direct_store=True)``: CUTLASS's register-to-global epilogue (gemm_f16_sm80.py);
- ``LinearCombination(Clamp)`` computing in int32 (gemm_s8_sm80.py's s8 -> s32 GEMMs);
- SIMT convolutions declaring A/B alignment 4 (conv2d_*_simt_f32_sm80.py), which CUTLASS's SIMT conv kernels ignore;
- tensor-op convolutions with 256-bit C stores (float32 C alignment 8, conv2d_*_tf32*_sm80.py), and grouped GEMMs
  with them (test/unit/test_sm80.py);
- warp tiles 128 wide in N for float32 outputs (test_sm80.py's fast-math test: 128x256x16 on 4x2 warps);
- PyCUTLASS's spelling of the fast float32 instructions, [16, 8, 8] float16 + multiply_add_fast_f16 (test_sm80.py).
"""
from __future__ import annotations

import pycutlass as cutlass
from pycutlass.conv import IteratorAlgorithm, Operator, StrideSupport

D = cutlass.DataType
R, CM, NHWC = cutlass.RowMajor, cutlass.ColumnMajor, cutlass.TensorNHWC
T, S = cutlass.OpClass.TensorOp, cutlass.OpClass.Simt
MO = cutlass.MathOperation


def gemm(element, acc, out, layouts, align, tile=(128, 128, 32), warps=(2, 2, 1), stages=3, functor=None,
         element_epilogue=None, direct_store=False, activation=None, math_operation=None, grouped=None):
    instruction = {D.float16: [16, 8, 16], D.bfloat16: [16, 8, 16], D.tfloat32: [16, 8, 8], D.int8: [16, 8, 32],
                   D.float32: [16, 8, 8]}[element]
    math = cutlass.MathInstruction(instruction, element, element, acc, T, math_operation or
                                   (MO.multiply_add_saturate if element is D.int8 else MO.multiply_add))
    description = cutlass.TileDescription(list(tile), stages, list(warps), math)
    storage = D.float32 if element is D.tfloat32 else element
    A = cutlass.TensorDescription(storage, layouts[0], align[0])
    B = cutlass.TensorDescription(storage, layouts[1], align[1])
    C = cutlass.TensorDescription(out, layouts[2], align[2])
    if activation is not None:
        epilogue = cutlass.LinearCombinationGeneric(activation(D.float32), out, align[2], acc, element_epilogue)
    else:
        epilogue = (functor or cutlass.LinearCombination)(out, align[2], acc, element_epilogue)
    if grouped is not None:  # a SchedulerMode
        return cutlass.GemmOperationGrouped(80, description, A, B, C, epilogue, cutlass.BatchedIdentitySwizzle,
                                            precompute_mode=grouped)
    return cutlass.GemmOperationUniversal(80, description, A, B, C, epilogue, cutlass.IdentitySwizzle1,
                                          direct_store=direct_store)


def conv(kind, algorithm, element, acc, out, align, tile, warps, stages, stride=StrideSupport.Strided,
         swizzle=cutlass.IdentitySwizzle1):
    simt = element is D.float32
    instruction = [1, 1, 1] if simt else {D.float16: [16, 8, 16], D.tfloat32: [16, 8, 8]}[element]
    math = cutlass.MathInstruction(instruction, element, element, acc, S if simt else T, MO.multiply_add)
    description = cutlass.TileDescription(list(tile), stages, list(warps), math)
    storage = D.float32 if element is D.tfloat32 else element
    A = cutlass.TensorDescription(storage, NHWC, align[0])
    B = cutlass.TensorDescription(storage, NHWC, align[1])
    C = cutlass.TensorDescription(out, NHWC, align[2])
    return cutlass.Conv2dOperation(kind, algorithm, 80, description, A, B, C, stride,
                                   cutlass.LinearCombination(out, align[2], acc, D.float32), swizzle)


F16, F32, S8, S32 = D.float16, D.float32, D.int8, D.int32
GEMMS = {
    # gemm_f16_sm80.py's direct-store test: f16 -> f32, ColumnMajor C, alignment 4
    "direct_store_f16_f32_nt_n": gemm(F16, F32, F32, (CM, R, CM), (8, 8, 4), direct_store=True),
    "direct_store_f16_f16_tn_t_relu": gemm(F16, F32, F16, (R, CM, R), (8, 8, 8), tile=(64, 128, 32),
                                           direct_store=True, activation=cutlass.relu),
    "direct_store_bf16_f32_tt_t_2": gemm(D.bfloat16, F32, F32, (R, R, R), (8, 8, 2), tile=(128, 64, 64),
                                         warps=(2, 2, 1), stages=4, direct_store=True),
    "direct_store_tf32_f32_nn_n": gemm(D.tfloat32, F32, F32, (CM, CM, CM), (4, 4, 4), tile=(64, 64, 32),
                                       direct_store=True),
    # float32 C x 8 (256-bit stores): its parallel split-K reduces 256 bits at a time
    "f16_f32_c8_split_k_parallel": gemm(F16, F32, F32, (R, CM, R), (8, 8, 8)),
    # warp tiles 128 wide in N, float32 output (test_sm80.py's fast-math test runs 128x256x16 on 4x2 warps)
    "tf32_f32_warp_n128": gemm(D.tfloat32, F32, F32, (R, R, CM), (4, 4, 4), tile=(128, 256, 16), warps=(4, 2, 1)),
    "f16_f32_warp_n128": gemm(F16, F32, F32, (R, CM, R), (8, 8, 4), tile=(64, 256, 32), warps=(2, 2, 1)),
    "bf16_f32_warp_n128_c8": gemm(D.bfloat16, F32, F32, (CM, R, R), (8, 8, 8), tile=(128, 256, 32),
                                  warps=(4, 2, 1)),
    "f32_fast_f16_warp_n128": gemm(F32, F32, F32, (CM, CM, R), (4, 4, 4), tile=(128, 256, 16), warps=(4, 2, 1),
                                   math_operation=MO.multiply_add_fast_f16),
    # gemm_s8_sm80.py: s8 -> s32 with LinearCombinationClamp computing in int32 (ColumnMajor and RowMajor C)
    "s8_s32_clamp_int32_compute_n": gemm(S8, S32, S32, (R, CM, CM), (16, 16, 4), tile=(128, 128, 128),
                                         functor=cutlass.LinearCombinationClamp, element_epilogue=S32),
    "s8_s32_clamp_int32_compute_t": gemm(S8, S32, S32, (R, CM, R), (16, 16, 4), tile=(128, 128, 128),
                                         functor=cutlass.LinearCombinationClamp, element_epilogue=S32),
    "s8_s32_int32_compute_t": gemm(S8, S32, S32, (R, CM, R), (16, 16, 4), tile=(64, 64, 64),
                                   element_epilogue=S32),
    "s8_s8_clamp_int32_compute_t": gemm(S8, S32, S8, (R, CM, R), (16, 16, 16), tile=(128, 128, 64),
                                        functor=cutlass.LinearCombinationClamp, element_epilogue=S32),
    "s8_s32_int32_compute_direct_store": gemm(S8, S32, S32, (R, CM, R), (16, 16, 4), tile=(64, 64, 64),
                                              element_epilogue=S32, direct_store=True),
}

FPROP, DGRAD, WGRAD = Operator.fprop, Operator.dgrad, Operator.wgrad
ANALYTIC, OPTIMIZED = IteratorAlgorithm.analytic, IteratorAlgorithm.optimized
CONVS = {
    # conv2d_*_f32nhwc_*_simt_f32_sm80.py: A and B declared with alignment 4, C with 1
    "simt_fprop_analytic_a4": conv(FPROP, ANALYTIC, F32, F32, F32, (4, 4, 1), (128, 128, 8), (4, 2, 1), 4),
    "simt_fprop_optimized_a4": conv(FPROP, OPTIMIZED, F32, F32, F32, (4, 4, 1), (128, 128, 8), (4, 2, 1), 4),
    "simt_dgrad_optimized_a4_unity": conv(DGRAD, OPTIMIZED, F32, F32, F32, (4, 4, 1), (128, 128, 8), (4, 2, 1), 4,
                                          StrideSupport.Unity),
    "simt_dgrad_analytic_a4_strided_2stage": conv(DGRAD, ANALYTIC, F32, F32, F32, (4, 4, 1), (128, 128, 8),
                                                  (4, 2, 1), 2, swizzle=cutlass.StridedDgradIdentitySwizzle1),
    "simt_wgrad_optimized_a4": conv(WGRAD, OPTIMIZED, F32, F32, F32, (4, 4, 1), (128, 128, 8), (4, 2, 1), 4),
    # conv2d_*_tf32nhwc_*_tensor_op_f32_sm80.py: float32 C alignment 8 (256-bit stores)
    "tf32_fprop_optimized_c8": conv(FPROP, OPTIMIZED, D.tfloat32, F32, F32, (4, 4, 8), (128, 128, 16), (2, 2, 1), 3),
    "tf32_dgrad_analytic_c8_unity": conv(DGRAD, ANALYTIC, D.tfloat32, F32, F32, (4, 4, 8), (128, 128, 16),
                                         (2, 2, 1), 3, StrideSupport.Unity),
    "tf32_dgrad_optimized_c8_strided": conv(DGRAD, OPTIMIZED, D.tfloat32, F32, F32, (4, 4, 8), (128, 128, 16),
                                            (2, 2, 1), 3, swizzle=cutlass.StridedDgradIdentitySwizzle1),
    "tf32_wgrad_optimized_c8": conv(WGRAD, OPTIMIZED, D.tfloat32, F32, F32, (4, 4, 8), (128, 128, 16), (2, 2, 1), 3),
    "f16_fprop_f32out_c8": conv(FPROP, OPTIMIZED, F16, F32, F32, (8, 8, 8), (128, 128, 64), (2, 2, 1), 3),
    "f16_fprop_f32out_warp_n128": conv(FPROP, OPTIMIZED, F16, F32, F32, (8, 8, 4), (128, 256, 32), (2, 2, 1), 3),
}

HOST, DEVICE = cutlass.SchedulerMode.Host, cutlass.SchedulerMode.Device
GROUPED = {
    # test_sm80.py's grouped f16 -> f32 GEMMs with C alignment 8 (256-bit stores)
    "f16_f32_c8_device": gemm(F16, F32, F32, (R, CM, R), (8, 8, 8), grouped=DEVICE),
    "f16_f32_c8_host_cm": gemm(F16, F32, F32, (CM, R, CM), (8, 8, 8), grouped=HOST),
    "tf32_f32_warp_n128_host": gemm(D.tfloat32, F32, F32, (R, CM, R), (4, 4, 4), tile=(128, 256, 16),
                                    warps=(4, 2, 1), grouped=HOST),
}
