"""Sessions: the one place where pycutlass keeps state.

A :class:`Session` holds everything that outlives a call: compiler settings and the table of compiled kernels, the
artifact cache, loaded modules and memory tracking per device, and compile reports. Each layer keeps its own part of
that state in a class with ``of(session)`` (see :class:`SessionState`), so this module depends on no other and every
layer can depend on it. The seed's simple API (``pycutlass.compiler.add_module``, ``op.run``) uses the current
session: the one activated in this context (``with session.activate():``), else the process's default session,
created on first use. Tests and tuners make their own.
"""
from __future__ import annotations

import contextlib
import contextvars
import os
import re
import threading
from typing import TypeVar

from .errors import ArgumentError

_S = TypeVar("_S", bound="SessionState")

_OPTIONS = ("backend", "target", "cache_path", "device", "progress")
_BACKENDS = ("nvcc", "nvrtc")

# The compute capabilities pycutlass compiles for. They live here, the bottom layer, so that a Session checks its
# ``target`` when it is made; pycutlass.description.target builds its Target on the same list and reading.
SUPPORTED_COMPUTE_CAPABILITIES = (80, 86, 87, 89, 90)
_TARGET_TEXT = re.compile(r"^(?:sm_?|compute_)?(\d+)([a-z]?)$")


def target_problem(compute_capability, suffix: str = "") -> str | None:
    """Why (compute capability, suffix) is not a supported target, or None when it is one."""
    cc = compute_capability
    if isinstance(cc, bool) or not isinstance(cc, int) or cc not in SUPPORTED_COMPUTE_CAPABILITIES:
        return (f"compute capability {cc!r} is not a supported target; choose one of "
                f"{list(SUPPORTED_COMPUTE_CAPABILITIES)} (e.g. 90, '90', 'sm_90', '90a')")
    if suffix not in ("", "a"):
        return f"target suffix {suffix!r} is not supported; use '' or 'a'"
    if suffix == "a" and cc != 90:
        return f"the 'a' feature suffix exists for sm_90 only, got sm_{cc}a"
    return None


def read_target(value) -> tuple[int, str]:
    """(compute capability, suffix) of a target written ``90``, ``"90"``, ``"sm_90"``, ``"sm90"``, ``"90a"``,
    ``"sm_90a"`` or ``"compute_90"`` (or a Target); ValueError saying what is supported otherwise."""
    if hasattr(value, "compute_capability") and hasattr(value, "suffix"):  # a Target (checked when it was made)
        return value.compute_capability, value.suffix
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"target must be a compute capability such as 90 or 'sm_90', got {value!r}")
    if isinstance(value, int):
        found = (value, "")
    else:
        match = _TARGET_TEXT.match(value.strip().lower())
        if not match:
            raise ValueError(f"cannot read {value!r} as a target; write it as 90, '90', 'sm_90' or '90a' (supported "
                             f"compute capabilities: {list(SUPPORTED_COMPUTE_CAPABILITIES)})")
        found = (int(match.group(1)), match.group(2))
    problem = target_problem(*found)
    if problem is not None:
        raise ValueError(problem)
    return found


def _check_option(name: str, value) -> None:
    """A typed error naming what is allowed, when the session is made (not at the first compile)."""
    if value is None:
        return
    if name == "backend":
        is_backend = all(hasattr(value, attr) for attr in ("name", "flags", "compile"))
        if (isinstance(value, str) and value not in _BACKENDS) or (not isinstance(value, str) and not is_backend):
            raise ArgumentError(f"Session backend must be 'nvcc' or 'nvrtc' (or a compiler backend object: "
                                f"pycutlass.compiler.nvcc(), .nvrtc()), got {value!r}")
    elif name == "target":
        try:
            read_target(value)
        except ValueError as error:
            raise ArgumentError(f"Session target: {error}") from None
    elif name == "progress":
        if not isinstance(value, bool):
            raise ArgumentError(f"Session progress must be True, False or None (None: bars on a terminal only), "
                                f"got {value!r}")
    elif name == "cache_path":
        if not isinstance(value, (str, os.PathLike)) or os.fspath(value) == "":
            raise ArgumentError(f"Session cache_path must be a file path (str or os.PathLike), ':memory:' or None "
                                f"(None: the default cache), got {value!r}")


class Session:
    """Compiler settings, compiled kernels, the artifact cache, loaded modules and memory, per device.

    Options (all optional; each is checked here, a typed error naming what is allowed):
      ``backend``    "nvcc" or "nvrtc" (default: nvcc when a toolkit is found, else NVRTC);
      ``target``     the GPU to compile for (``90``, ``"sm_90"``, ``"90a"``; default: the device's own);
      ``cache_path`` the artifact database (default: ``$PYCUTLASS_CACHE_DIR`` or the user cache directory);
      ``device``     the default device ordinal for host tensors (default: the thread's current CUDA device);
      ``progress``   show progress bars for long compiles (default: only on a terminal).
    """

    def __init__(self, **options):
        unknown = set(options) - set(_OPTIONS)
        if unknown:
            raise ArgumentError(f"unknown Session option(s) {sorted(unknown)}; allowed: {list(_OPTIONS)}")
        for name, value in options.items():
            _check_option(name, value)
        self.options = dict(options)
        self._states: dict[type, SessionState] = {}
        self._lock = threading.RLock()

    def state(self, cls: type[_S]) -> _S:
        """This session's instance of a layer's state class, created on first use."""
        found = self._states.get(cls)
        if found is None:
            with self._lock:
                found = self._states.get(cls)
                if found is None:
                    found = self._states[cls] = cls(self)
        return found

    def set_option(self, name: str, value) -> None:
        if name not in _OPTIONS:
            raise ArgumentError(f"unknown Session option {name!r}; allowed: {list(_OPTIONS)}")
        _check_option(name, value)
        with self._lock:
            self.options[name] = value
            for state in self._states.values():
                state.option_changed(name)

    @contextlib.contextmanager
    def activate(self):
        """Make this the current session in this context (thread or task) for the duration of the block."""
        token = _current.set(self)
        try:
            yield self
        finally:
            _current.reset(token)

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={v!r}" for k, v in self.options.items())
        return f"<pycutlass.Session {shown}>"


class SessionState:
    """Base of the per-session state of one layer (compiler, cache, devices). Subclasses read ``session.options``."""

    def __init__(self, session: Session):
        self.session = session

    @classmethod
    def of(cls: type[_S], session: Session | None = None) -> _S:
        return (session or current()).state(cls)

    def option_changed(self, name: str) -> None:
        """Called when a session option changes; states drop what depended on it."""


_current: contextvars.ContextVar[Session | None] = contextvars.ContextVar("pycutlass_session", default=None)
_default_holder: list[Session] = []  # the process's default session, created on first use
_default_lock = threading.Lock()


def default() -> Session:
    if not _default_holder:
        with _default_lock:
            if not _default_holder:
                _default_holder.append(Session())
    return _default_holder[0]


def current() -> Session:
    """The session activated in this context, else the default session."""
    return _current.get() or default()
