"""PyCUTLASS 2.11's ``pycutlass.conv2d_operation``: the same module as
:mod:`pycutlass.compat.conv2d_operation`."""
from .compat import conv2d_operation as _module
from .compat.support import alias

alias(__name__, _module)
