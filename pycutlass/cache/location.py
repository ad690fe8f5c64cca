"""Where the artifact cache lives by default, and how its directory is made safe to trust.

The cache holds native code that gets loaded and run, so a directory another user can write to
(or one another user owns) would let them plant kernels: such a directory is refused, never used.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

import platformdirs

from pycutlass.errors import CacheError

CACHE_DIR_ENV = "PYCUTLASS_CACHE_DIR"
DEFAULT_DB_NAME = "compiled_cache.db"


def default_cache_dir() -> Path:
    """``$PYCUTLASS_CACHE_DIR`` if set, else the per-user cache directory. Creates nothing.

    Raises :class:`CacheError` at once when the directory (or the nearest part of it that exists) is a file.
    """
    override = os.environ.get(CACHE_DIR_ENV)
    path = Path(override).expanduser() if override else Path(platformdirs.user_cache_dir("pycutlass"))
    for existing in (path, *path.parents):
        if os.path.lexists(existing):
            if not existing.is_dir():
                where = f"{CACHE_DIR_ENV}={override}" if override else "the user cache directory"
                inside = "" if existing == path else f" (its part {existing} is a file)"
                raise CacheError(f"{where}: {path} is not a directory{inside}; the kernel cache is a directory "
                                 f"holding {DEFAULT_DB_NAME}. Set {CACHE_DIR_ENV} to a directory")
            break
    return path


def default_cache_path() -> Path:
    """The default cache database file (inside :func:`default_cache_dir`). Creates nothing."""
    return default_cache_dir() / DEFAULT_DB_NAME


def ensure_cache_dir(path: str | os.PathLike) -> Path:
    """Create ``path`` private to this user (mode 0o700), or check that an existing one is safe.

    Raises :class:`CacheError` if it is not a directory, belongs to another user, or can be written
    by group or others.
    """
    path = Path(path).expanduser()
    try:
        path.mkdir(mode=0o700, parents=True)
        # mkdir's mode is filtered through the umask; make the intent exact.
        os.chmod(path, 0o700)
        return path
    except FileExistsError:
        pass
    except OSError as exc:
        raise CacheError(f"cannot create cache directory {path}: {exc}") from exc

    return check_cache_dir(path)


def check_cache_dir(path: str | os.PathLike) -> Path:
    """Check, without creating or changing anything, that the existing directory ``path`` is safe to trust.

    Raises :class:`CacheError` if it is missing, not a directory, belongs to another user, or can be
    written by group or others.
    """
    path = Path(path).expanduser()
    try:
        info = path.stat()
    except FileNotFoundError as exc:
        raise CacheError(f"cache directory {path} does not exist") from exc
    except OSError as exc:
        raise CacheError(f"cannot inspect cache directory {path}: {exc}") from exc
    if not stat.S_ISDIR(info.st_mode):
        raise CacheError(f"cache directory {path} exists but is not a directory")
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        raise CacheError(
            f"cache directory {path} is owned by uid {info.st_uid}, not by you (uid {os.getuid()}); "
            "the cache holds native code that pycutlass runs, so it must be yours. "
            f"Set {CACHE_DIR_ENV} to a directory you own."
        )
    if os.name == "posix" and info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise CacheError(
            f"cache directory {path} is writable by group or others (mode {stat.S_IMODE(info.st_mode):o}); "
            "anyone who can write there could plant native code that pycutlass would run. "
            f"Run `chmod 700 {path}` or set {CACHE_DIR_ENV} to a private directory."
        )
    return path
