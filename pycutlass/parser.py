"""PyCUTLASS 2.11's ``pycutlass.parser`` (the epilogue visitor tree's Python parser) has no pycutlass
counterpart: the epilogue visitor tree is not supported. Importing it raises ImportError saying so."""
raise ImportError(
    "pycutlass.parser: PyCUTLASS 2.11's epilogue visitor tree (EVT) parser does not exist in pycutlass, which does "
    "not support the epilogue visitor tree. Use LinearCombinationGeneric with an activation, and pass a bias as C "
    "with beta = 1 (see docs/porting.md)")
