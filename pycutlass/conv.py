"""``pycutlass.conv``: convolution enums and problem sizes, spelled as in the users' API (``cutlass.conv.Operator``)."""
from __future__ import annotations

from .kinds.conv2d.problem import *  # noqa: F401,F403
from .kinds.conv2d.problem import __all__  # noqa: F401
