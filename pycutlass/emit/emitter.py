"""Renders CUDA C++ from operation descriptions with jinja2 templates.

The prelude lives in ``templates/``; each kernel kind keeps its own template in its folder (``kinds/<kind>/``)
and renders it by path.
"""
from __future__ import annotations

import functools
from pathlib import Path

import jinja2

from . import abi

PACKAGE_DIR = Path(__file__).resolve().parent.parent
TEMPLATE_DIR = Path(__file__).parent / "templates"

BASE_HEADERS = ("cutlass/cutlass.h", "cutlass/numeric_types.h")  # the latter brings fixed-width ints


@functools.lru_cache(maxsize=None)
def environment() -> jinja2.Environment:
    """The one jinja2 environment (templates are package data: a constant, loaded once)."""
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(PACKAGE_DIR)), undefined=jinja2.StrictUndefined,
                              keep_trailing_newline=True, trim_blocks=False, autoescape=False)


def render(template, **context) -> str:
    """``template``: a path inside the package (absolute, or relative to the package root)."""
    path = Path(template)
    if path.is_absolute():
        path = path.resolve().relative_to(PACKAGE_DIR)
    return environment().get_template(path.as_posix()).render(**context)


def prelude(headers, structs, preambles=()) -> str:
    ordered = list(dict.fromkeys([*BASE_HEADERS, *sorted(set(headers) - set(BASE_HEADERS))]))
    return render(TEMPLATE_DIR / "prelude.h.j2", headers=ordered, abi_definitions=abi.cpp_definitions(structs),
                  preambles=list(dict.fromkeys(p for p in preambles if p)))


def translation_unit(operations) -> str:
    """One .cu holding every operation given; each operation's symbols are prefixed by its unique name."""
    operations = list(operations)
    headers = [h for op in operations for h in op.headers()]
    structs = [s for op in operations for s in op.abi_structs()]
    preambles = [p for op in operations for p in _listed(op.preamble())]
    shared = dict.fromkeys(op.shared_code() for op in operations)
    return prelude(headers, structs, preambles) + "".join(shared) + "".join(op.emit_body() for op in operations)


def _listed(preamble) -> list[str]:
    """An operation's preamble: one string, or several (each deduplicated across the unit on its own)."""
    return [preamble] if isinstance(preamble, str) else list(preamble)
