"""The pack file: one zip holding a manifest, its hash and the kernels' binaries.

    manifest.json      format, versions, target, how it was built, per operation class its call signature, kernels
                       and dispatch entries (with the measurements behind each), per kernel its parameters, symbols
                       and the hashes of its binary and emitted source
    manifest.sha256    sha256 of manifest.json
    binaries/<sha256>.cubin

Opening a pack reads and checks the manifest only; a kernel's binary is read and checked when that kernel is first
used, so a pack of a thousand kernels costs nothing for the kernels a process never calls.
"""
from __future__ import annotations

import hashlib
import json
import os
import zipfile
from pathlib import Path

from ..errors import ArgumentError, PyCutlassError

FORMAT = "pycutlass-pack/1"
MANIFEST, MANIFEST_HASH = "manifest.json", "manifest.sha256"
# What emission depends on: a pack compiled by a pycutlass whose files here hash alike emits the same sources.
_EMITTER_FOLDERS = ("description", "emit", "epilogue", "kinds")
_EMITTER_SUFFIXES = (".py", ".j2", ".cuh", ".h")


class PackError(PyCutlassError, RuntimeError):
    """A pack cannot be used; the subclass says why."""


class PackDamagedError(PackError):
    """The file is not a pack, or its manifest or a binary fails its hash check (damaged or altered)."""


class PackTargetError(PackError):
    """The pack's binaries were built for another GPU architecture than the one asked to run them."""


class PackSourceError(PackError):
    """A kernel of the pack emits a different source with this pycutlass than the one that compiled its binary."""


class PackCoverageError(ArgumentError):
    """The pack holds no kernel for a call's operation class (or, with the "exact" policy, for its shape)."""


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def emitter_digest() -> str:
    """sha256 over the files emission reads (descriptions, emitters, epilogues, kinds and their templates)."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    files = []
    for folder in _EMITTER_FOLDERS:
        for root, folders, names in os.walk(os.path.join(package, folder)):
            folders[:] = [name for name in folders if name != "__pycache__"]
            files += [os.path.join(root, name) for name in names if name.endswith(_EMITTER_SUFFIXES)]
    digest = hashlib.sha256()
    for path in sorted(files):
        digest.update(os.path.relpath(path, package).replace(os.sep, "/").encode() + b"\0")
        with open(path, "rb") as file:
            digest.update(file.read())
    return digest.hexdigest()


def write(path: str | Path, manifest: dict, binaries: dict[str, bytes]) -> Path:
    """Write a pack atomically: a reader never sees half a file."""
    path = Path(path)
    if path.is_dir():
        raise ArgumentError(f"{path} is a directory; give the pack's file name (e.g. {path / 'kernels.pack'})")
    path.parent.mkdir(parents=True, exist_ok=True)
    manifest_bytes = json.dumps(manifest, indent=1, sort_keys=True).encode()
    partial = path.with_name(path.name + ".partial")
    try:
        with zipfile.ZipFile(partial, "w", compression=zipfile.ZIP_DEFLATED) as archive:
            archive.writestr(MANIFEST, manifest_bytes)
            archive.writestr(MANIFEST_HASH, sha256(manifest_bytes))
            for digest, binary in sorted(binaries.items()):
                archive.writestr(f"binaries/{digest}.cubin", binary)
        partial.replace(path)
    finally:
        partial.unlink(missing_ok=True)
    return path


class PackFile:
    """An opened pack file: its checked manifest, and its binaries read on demand."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.is_file():
            what = "a directory" if self.path.is_dir() else "missing"
            raise PackDamagedError(f"{self.path} is {what}; give the path of a .pack file (pycutlass pack build)")
        try:
            with zipfile.ZipFile(self.path) as archive:
                manifest_bytes = archive.read(MANIFEST)
                recorded = archive.read(MANIFEST_HASH).decode().strip()
        except (zipfile.BadZipFile, KeyError, OSError, UnicodeDecodeError) as exc:
            raise PackDamagedError(f"{self.path} is not a readable pycutlass pack ({type(exc).__name__}: {exc})") \
                from None
        if sha256(manifest_bytes) != recorded:
            raise PackDamagedError(f"{self.path}: {MANIFEST} does not match its recorded hash (altered or damaged)")
        try:
            self.manifest = json.loads(manifest_bytes)
        except json.JSONDecodeError as exc:
            raise PackDamagedError(f"{self.path}: {MANIFEST} is not JSON ({exc})") from None
        if not isinstance(self.manifest, dict) or self.manifest.get("format") != FORMAT:
            found = self.manifest.get("format") if isinstance(self.manifest, dict) else None
            raise PackDamagedError(f"{self.path}: format {found!r}; this pycutlass reads {FORMAT}")

    def binary(self, digest: str, kernel: str) -> bytes:
        """The binary with this sha256, checked."""
        try:
            with zipfile.ZipFile(self.path) as archive:
                data = archive.read(f"binaries/{digest}.cubin")
        except (zipfile.BadZipFile, KeyError, OSError) as exc:
            raise PackDamagedError(f"{self.path}: the binary of {kernel} cannot be read ({type(exc).__name__}: "
                                   f"{exc})") from None
        except Exception as exc:  # zlib.error, CRC mismatch (BadZipFile covers most)
            raise PackDamagedError(f"{self.path}: the binary of {kernel} is damaged ({exc})") from None
        if sha256(data) != digest:
            raise PackDamagedError(f"{self.path}: the binary of {kernel} fails its hash check (altered or damaged)")
        return data
