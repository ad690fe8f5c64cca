"""The split-K reduction: sums parallel split-K partials and applies the epilogue."""
from .arguments import ReductionArguments
from .operation import ReductionOperation

__all__ = ["ReductionArguments", "ReductionOperation"]
