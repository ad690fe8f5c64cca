"""PyCUTLASS 2.11's ``pycutlass.test``: the package :mod:`pycutlass.compat.test` (submodules included) under its
old path."""
from ..compat import test as _package
from ..compat.support import alias

alias(__name__, _package)
