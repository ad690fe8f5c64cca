"""PyCUTLASS 2.11's ``pycutlass.memory_manager``: the module :mod:`pycutlass.compat.memory_manager` under its old path."""
from .compat import memory_manager as _module
from .compat.support import alias

alias(__name__, _module)
