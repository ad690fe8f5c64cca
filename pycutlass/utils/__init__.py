"""PyCUTLASS 2.11's ``pycutlass.utils``: the package :mod:`pycutlass.compat.utils` (submodules included) under its
old path."""
from ..compat import utils as _package
from ..compat.support import alias

alias(__name__, _package)
