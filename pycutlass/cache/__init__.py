"""The on-disk cache of compiled kernels: verified, shared between processes, built once per key."""
from pycutlass.cache.location import (
    CACHE_DIR_ENV,
    DEFAULT_DB_NAME,
    default_cache_dir,
    default_cache_path,
    ensure_cache_dir,
)
from pycutlass.cache.store import (
    MEMORY,
    SCHEMA_VERSION,
    Artifact,
    ArtifactCache,
)
from pycutlass.cache.current import CacheState, get_cache, set_cache_path

__all__ = [
    "CACHE_DIR_ENV",
    "DEFAULT_DB_NAME",
    "MEMORY",
    "SCHEMA_VERSION",
    "Artifact",
    "ArtifactCache",
    "CacheState",
    "default_cache_dir",
    "default_cache_path",
    "ensure_cache_dir",
    "get_cache",
    "set_cache_path",
]
