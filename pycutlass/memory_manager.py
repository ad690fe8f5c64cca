"""PyCUTLASS 2.11's ``pycutlass.memory_manager``: the same module as
:mod:`pycutlass.compat.memory_manager`."""
from .compat import memory_manager as _module
from .compat.support import alias

alias(__name__, _module)
