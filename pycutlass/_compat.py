"""Helpers of the PyCUTLASS 2.11 module paths: the module :mod:`pycutlass.compat.support` under its old path."""
from .compat import support as _module
from .compat.support import alias

alias(__name__, _module)
