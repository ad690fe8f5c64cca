"""``pycutlass.test``: PyCUTLASS 2.11's testbeds, so its users' unit tests keep running.

    from pycutlass.test import *
    assert test_all_gemm(operation, "universal")        # GemmUniversalLauncher over PyCUTLASS's sweep
    assert test_all_conv2d(conv_operation)              # Conv2dLauncher over pycutlass's conv sizes
    assert TestbedGrouped(grouped_operation).run(24)    # 24 random problems as one group

Results are checked against float64 references of the whole epilogue (activations included), not by the
exact comparison with a host GEMM in the operands' types that PyCUTLASS made; cases an operation's arguments refuse
are skipped and listed in ``launcher.skipped``. Importing this module needs no GPU; running does.
"""
from __future__ import annotations

from ... import *  # noqa: F401,F403  (PyCUTLASS's testbeds did ``from pycutlass import *``; see __all__)
from ... import __all__ as _pycutlass_names
from ..support import missing_names
from .conv2d_testbed import Conv2dLauncher, test_all_conv2d
from .gemm_grouped_testbed import TestbedGrouped
from .gemm_testbed import GemmUniversalLauncher, test_all_gemm
from .profiler import GpuTimer

__getattr__ = missing_names(__name__, {
    "get_name": "use operation.name (or operation.procedural_name) for test names",
})

# PyCUTLASS's testbed modules began with ``from pycutlass import *`` and had no __all__, so its unit tests that only
# do ``from pycutlass.test import *`` (the few- and fixed-channel conv tests) got MathInstruction, cutlass & co. here.
__all__ = ["Conv2dLauncher", "GemmUniversalLauncher", "GpuTimer", "TestbedGrouped", "test_all_conv2d", "test_all_gemm",
           *_pycutlass_names]
