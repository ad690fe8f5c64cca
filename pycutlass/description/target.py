"""Target: one GPU architecture (compute capability plus feature suffix) and every fact pycutlass needs about it.

Two things must agree: an operation's compute capability picks the CUTLASS template family (today the Sm80 family,
CUTLASS 2.x), and the target picks the binary (SASS is not forward compatible across major architectures, so a
Hopper GPU needs an sm_90 build even of Sm80-family templates). ``Target.check_runs`` says whether a target can run
a family, with a clear error when it cannot.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import DescriptionError
from ..session import read_target, target_problem

# Shared memory a thread block may opt into (bytes), by compute capability (one entry per supported target).
_SHARED_MEMORY_PER_BLOCK = {80: 163 * 1024, 86: 99 * 1024, 87: 163 * 1024, 89: 99 * 1024, 90: 227 * 1024}

# Template families and the smallest compute capability whose instructions they use.
FAMILIES = {"sm80": 80, "sm90": 90}

# The compute capabilities an operation may name (each selects the Sm80 family; 90 also has the SM90 family).
OPERATION_COMPUTE_CAPABILITIES = (80, 86, 89, 90)


@dataclass(frozen=True, order=True)
class Target:
    """A GPU architecture such as ``sm_90`` or ``sm_90a`` (``a``: architecture-specific features, e.g. wgmma)."""

    compute_capability: int
    suffix: str = ""

    def __post_init__(self):
        problem = target_problem(self.compute_capability, self.suffix)
        if problem is not None:
            raise DescriptionError(problem, rule="target.invalid")

    @classmethod
    def parse(cls, value) -> "Target":
        """Accepts a Target, ``90``, ``"90"``, ``"sm_90"``, ``"sm90"``, ``"90a"``, ``"sm_90a"``, ``"compute_90"``."""
        if isinstance(value, Target):
            return value
        try:
            return cls(*read_target(value))
        except ValueError as error:
            raise DescriptionError(str(error), rule="target.invalid") from None

    @property
    def name(self) -> str:
        return f"sm_{self.compute_capability}{self.suffix}"

    @property
    def arch(self) -> str:
        """What compiler flags take: "90", "90a"."""
        return f"{self.compute_capability}{self.suffix}"

    @property
    def shared_memory_per_block(self) -> int:
        return _SHARED_MEMORY_PER_BLOCK[self.compute_capability]

    def can_run(self, family: str) -> bool:
        if family == "sm90":  # wgmma and TMA multicast exist on sm_90a only (SASS does not carry to sm_100)
            return self.compute_capability == 90
        return self.compute_capability >= FAMILIES[family]

    def for_family(self, family: str) -> "Target":
        """The target a family's code is compiled for: CUTLASS 3.x SM90 kernels need sm_90a's features."""
        if family == "sm90" and self.compute_capability == 90:
            return Target(90, "a")
        return self

    def check_runs(self, family: str, what: str) -> None:
        if not self.can_run(family):
            need = "== 90 (sm_90a)" if family == "sm90" else f">= {FAMILIES[family]}"
            raise DescriptionError(f"{what} uses the {family} template family, which needs compute capability "
                                   f"{need}; target {self.name} cannot run it (its main loop would compile to "
                                   f"nothing)", rule="target.family")

    def __str__(self) -> str:
        return self.name


def family_of(compute_capability: int) -> str:
    """The template family an operation's compute capability selects."""
    if compute_capability in OPERATION_COMPUTE_CAPABILITIES:
        return "sm80"
    raise DescriptionError(f"compute capability {compute_capability!r} is not supported for operations; choose one "
                           f"of {list(OPERATION_COMPUTE_CAPABILITIES)} (Hopper runs the Sm80 family: use 80 or 90)",
                           rule="target.compute_capability")
