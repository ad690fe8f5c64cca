"""The on-disk cache of compiled kernels: verified, shared between processes, built once per key."""
from pycutlass.cache.location import (
    CACHE_DIR_ENV,
    DEFAULT_DB_NAME,
    check_cache_dir,
    default_cache_dir,
    default_cache_path,
    ensure_cache_dir,
)
from pycutlass.cache.store import (
    APPLICATION_ID,
    MEMORY,
    SCHEMA_VERSION,
    Artifact,
    ArtifactCache,
    CacheCorruptError,
    identify_file,
    moved_aside_files,
    remove_moved_aside_files,
)
from pycutlass.cache.current import CacheState, get_cache, set_cache_path

__all__ = [
    "APPLICATION_ID",
    "CACHE_DIR_ENV",
    "DEFAULT_DB_NAME",
    "MEMORY",
    "SCHEMA_VERSION",
    "Artifact",
    "ArtifactCache",
    "CacheCorruptError",
    "CacheState",
    "check_cache_dir",
    "default_cache_dir",
    "default_cache_path",
    "ensure_cache_dir",
    "get_cache",
    "identify_file",
    "moved_aside_files",
    "remove_moved_aside_files",
    "set_cache_path",
]
