"""PyCUTLASS 2.11's ``pycutlass.library``: the module :mod:`pycutlass.compat.library` under its old path."""
from .compat import library as _module
from .compat.support import alias

alias(__name__, _module)
