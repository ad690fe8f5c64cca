"""Helpers of the PyCUTLASS 2.11 module paths: the same module as :mod:`pycutlass.compat.support`."""
from .compat import support as _module
from .compat.support import alias

alias(__name__, _module)
