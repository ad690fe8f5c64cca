"""PyCUTLASS 2.11's ``pycutlass.parser``: importing it raises ImportError saying what pycutlass does instead (see
:mod:`pycutlass.compat.parser`)."""
from .compat import parser  # noqa: F401  (raises)
