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
import threading
from typing import TypeVar

from .errors import ArgumentError

_S = TypeVar("_S", bound="SessionState")

_OPTIONS = ("backend", "target", "cache_path", "device", "progress")


class Session:
    """Compiler settings, compiled kernels, the artifact cache, loaded modules and memory, per device.

    Options (all optional; each layer validates its own when first used):
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
