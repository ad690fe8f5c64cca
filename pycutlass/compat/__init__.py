"""PyCUTLASS 2.11's surface, at the edge of pycutlass: the modules its scripts import (``pycutlass.gemm_operation``,
``conv2d_operation``, ``reduction_operation``, ``memory_manager``, ``library``, ``parser``, ``utils``, ``test``) live
here, and each old path is the same module under its PyCUTLASS name (:func:`support.alias`). The core (descriptions,
emit, cache, compiler, runtime, kinds, tune, torch) never imports this package (tests/cpu/test_layers.py).
See docs/porting.md."""
