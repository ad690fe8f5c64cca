"""Rule codes: every DescriptionError names the rule it breaks by a stable code from description/rules.py, the code
survives pickling (compile workers and sweeps send errors between processes), tuning groups pruned points by it,
and docs/object-model.md lists every code."""
from __future__ import annotations

import ast
import pickle
from pathlib import Path

import pytest

import pycutlass as cutlass
from pycutlass import DescriptionError
from pycutlass.description.rules import RULES, markdown_table
from pycutlass.tune.space import SearchSpace, reason_of

from .test_conv2d_sm90 import sm90_conv
from .test_gemm_grouped_sm90 import grouped90
from .test_gemm_sm90 import sm90

PACKAGE = Path(cutlass.__file__).parent
DOC = PACKAGE.parent / "docs" / "object-model.md"
D = cutlass.DataType

# DescriptionError(...) calls in kinds/, description/ and epilogue/ that name no rule: none. A new rule gets its code
# in description/rules.py; do not raise this limit.
UNCODED_LIMIT = 0


class _NarrowerError(DescriptionError):
    """A subclass, as code that catches pycutlass errors may define (defined at module level: picklable)."""


def _description_error_calls(root: Path):
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "DescriptionError":
                yield path.relative_to(PACKAGE), node


def _rule_of(call: ast.Call):
    for keyword in call.keywords:
        if keyword.arg == "rule":
            return keyword.value
    return None


def test_the_rule_survives_pickling():
    coded = DescriptionError("tile N must be one of [64, 128], got 96", rule="sm90.tile_n")
    for error in (coded, DescriptionError("no rule"), DescriptionError()):
        again = pickle.loads(pickle.dumps(error))
        assert type(again) is DescriptionError and str(again) == str(error) and again.rule == error.rule
    assert pickle.loads(pickle.dumps(coded)).rule == "sm90.tile_n"
    sub = _NarrowerError("tile too wide", rule="sm90.tile_n")
    again = pickle.loads(pickle.dumps(sub))
    assert type(again) is _NarrowerError and again.rule == "sm90.tile_n" and str(again) == "tile too wide"
    with pytest.raises(DescriptionError) as raised:
        sm90(tile=(128, 96, 64))
    assert pickle.loads(pickle.dumps(raised.value)).rule == raised.value.rule == "sm90.tile_n"
    assert isinstance(raised.value, ValueError)  # still the ValueError PyCUTLASS code catches


def test_every_rule_at_a_raise_site_is_in_the_table():
    used = set()
    for path, call in _description_error_calls(PACKAGE):
        rule = _rule_of(call)
        if rule is None:
            continue
        assert isinstance(rule, ast.Constant) and isinstance(rule.value, str), f"{path}:{call.lineno}: rule must " \
            f"be a string literal (a code of description/rules.py)"
        assert rule.value in RULES, f"{path}:{call.lineno}: unknown rule code {rule.value!r}"
        used.add(rule.value)
    assert used == set(RULES), f"codes in the table that no raise site uses: {sorted(set(RULES) - used)}"


def test_codes_are_short_dotted_and_summaries_one_line():
    for code, text in RULES.items():
        assert code.count(".") == 1 and code == code.lower() and " " not in code, code
        assert text and "\n" not in text and len(text) <= 80, code


def test_raise_sites_without_a_rule_do_not_grow():
    uncoded = [f"{path}:{call.lineno}" for folder in ("kinds", "description", "epilogue")
               for path, call in _description_error_calls(PACKAGE / folder) if _rule_of(call) is None]
    assert len(uncoded) <= UNCODED_LIMIT, f"{len(uncoded) - UNCODED_LIMIT} new DescriptionError(s) without " \
        f"rule=: {uncoded}"


@pytest.mark.parametrize("build, rule", [
    (lambda: sm90(tile=(128, 96, 64)), "sm90.tile_n"),
    (lambda: grouped90(tile=(128, 160, 64)), "sm90.tile_n"),
    (lambda: sm90_conv(tile=(128, 32, 64)), "sm90.tile_n"),
    (lambda: sm90(tile=(128, 128, 32)), "sm90.tile_k_bytes"),
    (lambda: grouped90(tile=(128, 128, 32)), "sm90.tile_k_bytes"),
    (lambda: sm90_conv(tile=(128, 128, 32)), "sm90.tile_k_bytes"),
    (lambda: sm90(cluster=(2, 2, 1)), "sm90.cluster_shape"),
    (lambda: grouped90(cluster=(2, 2, 1)), "sm90.cluster_shape"),
    (lambda: sm90_conv(cluster=(2, 2, 1)), "sm90.cluster_shape"),
    (lambda: sm90(align=4), "sm90.alignment_16b"),
    (lambda: sm90_conv(align=4), "sm90.alignment_16b"),
    (lambda: sm90(warps=[4, 1, 1]), "sm90.warp_count_derived"),
    (lambda: grouped90(warps=[4, 1, 1]), "sm90.warp_count_derived"),
    (lambda: sm90(tile=(64, 128, 64), kernel=cutlass.KernelScheduleType.TmaWarpSpecializedCooperative),
     "sm90.cooperative_tile_m"),
    (lambda: grouped90(tile=(64, 128, 64), kernel=cutlass.KernelScheduleType.TmaWarpSpecializedCooperative),
     "sm90.cooperative_tile_m"),
    (lambda: sm90(tile=(256, 128, 64), kernel=cutlass.KernelScheduleType.TmaWarpSpecializedPingpong),
     "sm90.schedule_tile_m"),
    (lambda: sm90_conv(tile=(256, 128, 64), kernel_schedule=cutlass.KernelScheduleType.TmaWarpSpecialized),
     "sm90.schedule_tile_m"),
    (lambda: sm90_conv(tile=(64, 128, 64), kernel_schedule=cutlass.KernelScheduleType.TmaWarpSpecializedCooperative),
     "sm90.cooperative_tile_m"),
    (lambda: sm90(stages=8, tile=(128, 256, 64)), "smem.capacity"),
    (lambda: grouped90(stages=8, tile=(128, 256, 64)), "smem.capacity"),
    (lambda: sm90(element=D.float8_e4m3, tile=(128, 128, 128), layouts=(cutlass.RowMajor,) * 3, out=D.float16),
     "sm90.k_major"),
    (lambda: grouped90(element=D.float8_e4m3, out=D.bfloat16, tile=(128, 128, 128),
                       layouts=(cutlass.RowMajor,) * 3), "sm90.k_major"),
])
def test_one_rule_one_code_in_every_sm90_kind(build, rule):
    with pytest.raises(DescriptionError) as raised:
        build()
    assert raised.value.rule == rule


def test_sm80_rules_carry_their_codes():
    math = cutlass.MathInstruction([16, 8, 16], D.float16, D.float16, D.float32, cutlass.OpClass.TensorOp)
    for shape, warps, rule in (([128, 128, 64], [3, 2, 1], "sm80.warp_divides_tile"),
                               ([128, 128, 64], [2, 2, 2], "sm80.warp_count_k"),
                               ([128, 128, 16], [2, 2, 1], "sm80.tile_k_steps")):
        with pytest.raises(DescriptionError) as raised:
            cutlass.TileDescription(shape, 3, warps, math)
        assert raised.value.rule == rule, shape
    with pytest.raises(DescriptionError) as raised:
        cutlass.TensorDescription(D.float16, cutlass.RowMajor, 3)
    assert raised.value.rule == "alignment.invalid"


def test_pruned_points_are_grouped_by_the_rule_code():
    """SM90 kinds state tile N once: every width the kind does not build is one reason, named by the table."""
    built = SearchSpace(compute_capability=90, threadblock_shape=[[128, n, 64] for n in (96, 160, 224, 128)]).build()
    assert built.pruned_by_reason == {RULES["sm90.tile_n"]: 3} and len(built.operations) == 1
    assert {p.message for p in built.pruned} != {RULES["sm90.tile_n"]}  # each point keeps its own message
    assert reason_of(DescriptionError("Foo(90): anything at all, got 7", rule="sm90.cluster_shape")) == \
        RULES["sm90.cluster_shape"]
    # Without a rule (or with a code the table lacks), the message is normalized instead.
    assert reason_of(DescriptionError("Foo(90): tile Q must be 3 or 5, got 7")) == "tile Q must be # or #"
    assert reason_of(DescriptionError("Foo(90): tile Q must be 3 or 5, got 7", rule="no.such")) == \
        "tile Q must be # or #"


def test_object_model_lists_every_code():
    text = DOC.read_text()
    start, end = "<!-- rule codes: generated from pycutlass/description/rules.py -->", "<!-- end of rule codes -->"
    assert start in text and end in text
    block = text.split(start, 1)[1].split(end, 1)[0].strip()
    assert block == markdown_table(), "regenerate the table: python -c 'from pycutlass.description.rules import " \
        "markdown_table; print(markdown_table())'"
    for code in RULES:
        assert f"`{code}`" in block
