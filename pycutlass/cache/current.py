"""The current session's artifact cache: ``get_cache()`` and ``set_cache_path()``."""
from __future__ import annotations

import os
import threading

from ..session import Session, SessionState, current
from .location import default_cache_path
from .store import ArtifactCache


class CacheState(SessionState):
    """A session's artifact cache, opened on first use (its directory is created then, not before)."""

    def __init__(self, session: Session):
        super().__init__(session)
        self._cache: ArtifactCache | None = None
        self._lock = threading.Lock()

    @property
    def cache(self) -> ArtifactCache:
        with self._lock:
            if self._cache is None:
                path = self.session.options.get("cache_path")
                self._cache = ArtifactCache(default_cache_path(), private_dir=True) if path is None else \
                    ArtifactCache(path)
            return self._cache

    def option_changed(self, name: str) -> None:
        if name == "cache_path":
            with self._lock:
                if self._cache is not None:
                    self._cache.close()
                self._cache = None


def get_cache(session: Session | None = None) -> ArtifactCache:
    """The session's cache (default: the current session): its ``cache_path``, else ``$PYCUTLASS_CACHE_DIR`` or the
    user cache directory's ``compiled_cache.db``."""
    return CacheState.of(session).cache


def set_cache_path(path: str | os.PathLike | None, session: Session | None = None) -> ArtifactCache:
    """Point the session's cache (default: the current session's) at ``path`` (``":memory:"`` for in-memory, None
    for the default location)."""
    (session or current()).set_option("cache_path", None if path is None else os.fspath(path))
    return get_cache(session)
