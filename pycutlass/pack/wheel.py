"""Packs as wheels: ``pycutlass pack wheel OUT.pack --name NAME`` writes a pure-Python wheel that installs the pack as
package data and registers it under the entry point group ``pycutlass.packs``; ``installed_packs()`` lists them.

The wheel holds ``<package>/__init__.py`` (``pack_path()`` returns the file), ``<package>/kernels.pack`` and the
dist-info (METADATA, WHEEL, entry_points.txt, RECORD), written here with the standard library: the format is small
and fixed (PEP 427), and a build backend would add a dependency for nothing.
"""
from __future__ import annotations

import base64
import hashlib
import re
import warnings
import zipfile
from pathlib import Path

from ..errors import ArgumentError
from .format import PackFile

ENTRY_POINT_GROUP = "pycutlass.packs"
_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$")
_VERSION = re.compile(r"^\d+(\.\d+)*([a-z]+\d+)?$")
_INIT = '''"""The pycutlass kernel pack {name}: load it with ``pycutlass.load_pack({name!r})``."""
from pathlib import Path


def pack_path() -> Path:
    return Path(__file__).with_name("kernels.pack")
'''


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def build_wheel(pack_path: str | Path, *, name: str, out_dir: str | Path = ".", version: str = "0.1.0",
                summary: str | None = None) -> Path:
    """Write ``<name>-<version>-py3-none-any.whl`` holding the pack into ``out_dir``; returns its path."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise ArgumentError(f"wheel name {name!r}: use letters, digits, '.', '-' and '_', starting and ending with a "
                            f"letter or digit")
    if not isinstance(version, str) or not _VERSION.match(version):
        raise ArgumentError(f"wheel version {version!r}: use a release version such as 1.0.0")
    pack = PackFile(pack_path)  # refuses a damaged pack before anything is written
    data = pack.path.read_bytes()
    distribution = re.sub(r"[-_.]+", "_", name).lower()
    package = distribution if distribution.isidentifier() else f"pack_{distribution}"
    info = pack.manifest
    summary = summary or (f"pycutlass kernel pack: {len(info['kernels'])} kernels for sm_"
                          f"{info['target']['compute_capability']}")
    dist_info = f"{distribution}-{version}.dist-info"
    files = {
        f"{package}/__init__.py": _INIT.format(name=name).encode(),
        f"{package}/kernels.pack": data,
        f"{dist_info}/METADATA": (f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\nSummary: {summary}\n"
                                  f"Requires-Dist: pycutlass\n").encode(),
        f"{dist_info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: pycutlass\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{dist_info}/entry_points.txt": f"[{ENTRY_POINT_GROUP}]\n{name} = {package}:pack_path\n".encode(),
    }
    record = "".join(f"{path},{_record_hash(content)},{len(content)}\n" for path, content in files.items())
    files[f"{dist_info}/RECORD"] = (record + f"{dist_info}/RECORD,,\n").encode()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    wheel = out_dir / f"{distribution}-{version}-py3-none-any.whl"
    partial = wheel.with_name(wheel.name + ".partial")
    try:
        with zipfile.ZipFile(partial, "w", compression=zipfile.ZIP_DEFLATED) as archive:
            for path, content in files.items():
                archive.writestr(path, content)
        partial.replace(wheel)
    finally:
        partial.unlink(missing_ok=True)
    return wheel


def installed_packs() -> dict[str, Path]:
    """``{name: path}`` of the packs installed as wheels (entry point group ``pycutlass.packs``)."""
    from importlib.metadata import entry_points

    found = {}
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        try:
            found[entry.name] = Path(entry.load()())
        except Exception as exc:  # a broken pack wheel must not hide the others
            warnings.warn(f"the installed pack {entry.name} ({entry.value}) cannot be located: "
                          f"{type(exc).__name__}: {exc}", stacklevel=2)
    return dict(sorted(found.items()))
