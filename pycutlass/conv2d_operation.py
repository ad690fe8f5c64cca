"""PyCUTLASS 2.11's ``pycutlass.conv2d_operation``: the module :mod:`pycutlass.compat.conv2d_operation` under its old path."""
from .compat import conv2d_operation as _module
from .compat.support import alias

alias(__name__, _module)
