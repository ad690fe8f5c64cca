"""PyCUTLASS 2.11's ``pycutlass.library``: the same module as
:mod:`pycutlass.compat.library`."""
from .compat import library as _module
from .compat.support import alias

alias(__name__, _module)
