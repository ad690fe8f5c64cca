"""PyCUTLASS 2.11's ``pycutlass.test`` (its testbeds) has no pycutlass counterpart; importing it raises
ImportError saying what to use instead."""
raise ImportError(
    "pycutlass.test: PyCUTLASS 2.11's testbeds (GemmUniversalLauncher, Conv2dLauncher, TestbedGrouped, "
    "test_all_gemm, ...) are not part of pycutlass. Check results with pycutlass.utils.reference_model "
    "(ReferenceModule, Conv2dReferenceModule); see docs/porting.md")
