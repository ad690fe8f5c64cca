"""Renders CUDA C++ from operation descriptions with the jinja2 templates in ``templates/``."""
from __future__ import annotations

import functools
from pathlib import Path

import jinja2

from . import abi

TEMPLATE_DIR = Path(__file__).parent / "templates"

BASE_HEADERS = ("cutlass/cutlass.h", "cutlass/numeric_types.h")  # the latter brings fixed-width ints


@functools.lru_cache(maxsize=None)
def environment() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)), undefined=jinja2.StrictUndefined,
                              keep_trailing_newline=True, trim_blocks=False, autoescape=False)


def render(template: str, **context) -> str:
    return environment().get_template(template).render(**context)


def prelude(headers) -> str:
    ordered = list(dict.fromkeys([*BASE_HEADERS, *sorted(set(headers) - set(BASE_HEADERS))]))
    return render("prelude.h.j2", headers=ordered, abi_definitions=abi.cpp_definitions())


def translation_unit(operations) -> str:
    """One .cu holding every operation given; each operation's symbols are prefixed by its unique name."""
    operations = list(operations)
    headers = [h for op in operations for h in op.headers()]
    return prelude(headers) + "".join(op.emit_body() for op in operations)
