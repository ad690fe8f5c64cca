"""PyCUTLASS 2.11's ``pycutlass.parser`` (the epilogue visitor tree's AST parser) has no pycutlass counterpart:
pycutlass traces the tree instead of parsing it. Importing it raises ImportError saying so."""
raise ImportError(
    "pycutlass.parser: PyCUTLASS 2.11's epilogue visitor tree (EVT) parser does not exist in pycutlass, which traces "
    "the tree instead: subclass pycutlass.EpilogueVisitTree (reduction_op is pycutlass.reduction_op) and build the "
    "GEMM with GemmOperationUniversal(..., visitor=True) (see docs/porting.md)")
