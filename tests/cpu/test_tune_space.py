"""SearchSpace (pycutlass.tune.space): files, canonical form, pruning by the descriptions' rules, params <-> operation.
Pure Python: nothing compiles."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from pycutlass.errors import ArgumentError, DescriptionError
from pycutlass.tune.space import (BUILTIN_FILTERS, DTYPE_COMBOS, MAX_POINTS, SearchSpace, build_operation,
                                  reason_of, resolve_params)

REPO_ROOT = Path(__file__).resolve().parents[2]
SMALL = dict(threadblock_shape=[[128, 128, 32], [64, 128, 32]], stages=[3, 4], warp_count=[2, 2, 1])


@pytest.fixture(scope="module")
def built_presets():
    return {name: SearchSpace.preset(name).build() for name in SearchSpace.presets()}


def test_a_space_of_defaults_is_one_sensible_sm80_gemm():
    built = SearchSpace().build()
    assert built.summary() == "1 valid, 0 pruned"
    params = built.params_of(built.operations[0])
    assert params["threadblock_shape"] == [128, 128, 32] and params["warp_count"] == [2, 2, 1]
    assert params["stages"] == 3 and params["instruction_shape"] == [16, 8, 16] and params["alignment"] == [8, 8, 8]
    sm90 = SearchSpace(compute_capability=90).build()
    p90 = sm90.params_of(sm90.operations[0])
    assert (p90["threadblock_shape"], p90["warp_count"], p90["stages"]) == ([128, 128, 64], None, 0)
    assert p90["instruction_shape"] == [64, 128, 16]


def test_from_dict_and_to_dict_round_trip():
    d = {"compute_capability": 80, "dtypes": ["f16_f32acc", {"element_a": "bf16", "element_accumulator": "f32",
                                                              "element_c": "f32"}],
         "layouts": ["rcr", "RRR"], "alignment": ["max", 4, [8, 8, 4]], "epilogue": ["relu", "linear_combination"],
         **SMALL}
    space = SearchSpace.from_dict(d)
    canonical = space.to_dict()
    assert canonical["compute_capability"] == [80] and canonical["layouts"] == ["rcr", "rrr"]
    assert canonical["alignment"] == ["max", [4, 4, 4], [8, 8, 4]] and canonical["warp_count"] == [[2, 2, 1]]
    assert canonical["dtypes"][1]["element_a"] == "bfloat16" and canonical["dtypes"][1]["element_b"] == "bfloat16"
    again = SearchSpace.from_dict(json.loads(json.dumps(canonical)))
    assert again == space and again.to_dict() == canonical and again.fingerprint == space.fingerprint
    assert "conv_kind" not in canonical and "precompute_mode" not in canonical  # gemm only


def test_from_toml_and_json_files(tmp_path):
    (tmp_path / "space.toml").write_text(
        'name = "mine"\ncompute_capability = 80\ndtypes = "f16_f32acc"\n'
        'threadblock_shape = [[128, 128, 32], [64, 128, 32]]\nstages = [3, 4]\nwarp_count = [2, 2, 1]\n')
    from_toml = SearchSpace.from_file(tmp_path / "space.toml")
    assert from_toml.name == "mine" and from_toml == SearchSpace(**SMALL)
    (tmp_path / "space.json").write_text(json.dumps(from_toml.to_dict()))
    assert SearchSpace.from_file(tmp_path / "space.json") == from_toml
    if importlib.util.find_spec("yaml") is not None:
        (tmp_path / "space.yaml").write_text(
            "name: mine\ncompute_capability: 80\ndtypes: f16_f32acc\n"
            "threadblock_shape: [[128, 128, 32], [64, 128, 32]]\nstages: [3, 4]\nwarp_count: [2, 2, 1]\n")
        assert SearchSpace.from_file(tmp_path / "space.yaml") == from_toml
        (tmp_path / "list.yml").write_text("- 1\n- 2\n")
        with pytest.raises(ArgumentError, match="table of dimensions"):
            SearchSpace.from_file(tmp_path / "list.yml")
    with pytest.raises(ArgumentError, match=r"use \.toml, \.json or \.yaml"):
        SearchSpace.from_file(tmp_path / "space.ini")
    for empty, text in (("empty.toml", ""), ("comments.toml", "# nothing yet\n"), ("empty.json", "{}")):
        (tmp_path / empty).write_text(text)
        with pytest.raises(ArgumentError, match=r"is empty: set at least one of \[.*'threadblock_shape'.*sm80-f16"):
            SearchSpace.from_file(tmp_path / empty)
    (tmp_path / "broken.toml").write_text("stages = [3,\n")
    with pytest.raises(ArgumentError, match="cannot be parsed"):
        SearchSpace.from_file(tmp_path / "broken.toml")
    (tmp_path / "typo.toml").write_text("stage = [3]\n")
    with pytest.raises(ArgumentError, match=r"unknown field\(s\) \['stage'\]; allowed: .*'stages'"):
        SearchSpace.from_file(tmp_path / "typo.toml")


@pytest.mark.parametrize("file, preset", [("sm80_f16.toml", "sm80-f16"), ("sm90_f16.toml", "sm90-f16")])
def test_example_space_files_are_the_presets(file, preset):
    assert SearchSpace.from_file(REPO_ROOT / "examples" / "spaces" / file) == SearchSpace.preset(preset)


def test_fingerprint_is_stable_and_sensitive():
    a = SearchSpace(**SMALL)
    spelled = SearchSpace(kind="gemm", compute_capability=[80], dtypes="f16_f32acc", layouts="rcr", **SMALL)
    assert a.fingerprint == spelled.fingerprint == SearchSpace(**SMALL, name="other").fingerprint
    assert len(a.fingerprint) == 64
    assert a.fingerprint != SearchSpace(**{**SMALL, "stages": [3, 5]}).fingerprint
    assert a.fingerprint != SearchSpace(**{**SMALL, "stages": [4, 3]}).fingerprint  # order is the sweep's order
    assert a.fingerprint != SearchSpace(**SMALL, filters=["warp_m_at_most_64"]).fingerprint
    assert a.fingerprint != SearchSpace(**SMALL, filters=[lambda p: True]).fingerprint


def test_points_are_deterministic_and_json_able():
    space = SearchSpace.preset("sm80-f16-small")
    first = [p.params for p in space.points()]
    assert first == [p.params for p in space.points()]
    assert json.loads(json.dumps(first)) == first


def test_pruned_points_are_grouped_by_rule():
    """128x256x64 float16 takes 48 KiB per stage: Sm80 (163 KiB) fits 3 stages; SM90 (227 KiB with 32 KiB kept for
    the epilogue) fits 4. Both rules' messages differ but count as one reason."""
    sm80 = SearchSpace(threadblock_shape=[128, 256, 64], warp_count=[2, 4, 1], stages=list(range(2, 11))).build()
    assert sm80.pruned_by_reason == {"too much shared memory": 7} and len(sm80.operations) == 2
    assert len({p.message for p in sm80.pruned}) == 7  # each says how much it needs
    sm90 = SearchSpace(compute_capability=90, threadblock_shape=[128, 256, 64], stages=[2, 3, 4, 5, 6]).build()
    assert sm90.pruned_by_reason == {"too much shared memory": 2}
    both = SearchSpace(compute_capability=[80, 90], threadblock_shape=[128, 256, 64], warp_count=["auto", [2, 4, 1]],
                       stages=[3, 4, 5]).build()
    # 80 (auto = [2, 4, 1] warps, then the explicit ones): 4 and 5 stages each; 90 (SM90, then Sm80 kernels on 227
    # KiB): 5 stages each.
    assert both.pruned_by_reason == {"too much shared memory": 2 + 2 + 1 + 1}
    assert both.summary() == "5 valid (1 duplicate dropped), 6 pruned: 6 too much shared memory"  # auto = [2, 4, 1]


def test_reason_normalization_strips_values():
    assert reason_of(DescriptionError("Foo(90): tile Q must be 3 or 5, got 7")) == "tile Q must be # or #"
    assert reason_of(DescriptionError("Bar: widget [1, 2] of 'x' is (too) wide; use y")) == "widget of is wide"
    assert reason_of(DescriptionError("Bar: widget [3, 4] of 'z' is (far too) wide. Use w")) == "widget of is wide"


def test_every_valid_point_of_every_preset_rebuilds_from_its_params(built_presets):
    for name, built in built_presets.items():
        assert built.operations, name
        for point in built.space.points():
            if point.valid:
                params = json.loads(json.dumps(point.params))  # as a bundle or a results row carries them
                assert build_operation(params).name == point.operation.name
                assert resolve_params(params) == point.params
        for op in built.operations:
            assert build_operation(built.params_of(op)).name == op.name


def test_preset_sizes(built_presets):
    assert len(built_presets["sm80-f16"].operations) >= 150
    assert 4 <= len(built_presets["sm80-f16-small"].operations) <= 8
    assert 4 <= len(built_presets["sm90-f16-small"].operations) <= 8
    assert len(built_presets["sm90-f16"].operations) >= 100
    sm80 = built_presets["sm80-f16"]
    assert {op.tile_description.stages for op in sm80.operations} == {3, 4, 5}
    assert len({op.swizzling_functor.name for op in sm80.operations}) == 3
    assert sm80.pruned_by_reason["warp tile taller than 64 rows"] > 0  # the example grid's own filter
    with pytest.raises(ArgumentError, match=r"preset: 'sm70' is not allowed; choose from \['sm80-f16'"):
        SearchSpace.preset("sm70")


def test_sm90_points_build_sm90_operations(built_presets):
    for name in ("sm90-f16", "sm90-f16-small"):
        assert {type(op).__name__ for op in built_presets[name].operations} == {"GemmOperationSm90"}
    for name in ("sm80-f16", "sm80-f16-small"):
        assert {type(op).__name__ for op in built_presets[name].operations} == {"GemmOperationUniversal"}
    # An Sm80 warp arrangement at compute capability 90 keeps the CUTLASS 2.x kernel, as in GemmOperationUniversal.
    ops = SearchSpace(compute_capability=90, warp_count=[2, 2, 1]).build().operations
    assert [type(op).__name__ for op in ops] == ["GemmOperationUniversal"] and ops[0].family == "sm80"


def test_sm90_only_values_are_pruned_on_sm80():
    built = SearchSpace(cluster_shape=[[1, 1, 1], [2, 1, 1]], tile_scheduler=["Default", "StreamK"]).build()
    assert len(built.operations) == 1
    assert built.pruned_by_reason == {"SM90-only value in an Sm80-family kernel": 3}


def test_duplicates_are_dropped_keeping_order():
    """Auto resolves to the cooperative schedule for a 128-row tile: both spell one kernel."""
    built = SearchSpace(compute_capability=90, kernel_schedule=["Auto", "TmaWarpSpecializedCooperative"]).build()
    assert len(built.operations) == 1 and len(built.duplicates) == 1
    assert built.params_of(built.operations[0])["kernel_schedule"] == "Auto"
    assert built.summary() == "1 valid (1 duplicate dropped), 0 pruned"


def test_filters_are_counted_under_their_own_reason():
    def no_four_stages(params):
        return "four stages skipped" if params["stages"] == 4 else True

    def only_wide(params):
        return params["threadblock_shape"][0] >= 128

    built = SearchSpace(**SMALL, filters=[no_four_stages, only_wide]).build()
    assert len(built.operations) == 1
    assert built.pruned_by_reason == {"four stages skipped": 2, "filtered by test_filters_are_counted_under_their_"
                                      "own_reason.<locals>.only_wide": 1}
    builtin = SearchSpace(threadblock_shape=[256, 128, 32], warp_count=[[2, 2, 1], [4, 2, 1]],
                          filters="warp_m_at_most_64").build()
    assert builtin.pruned_by_reason == {"warp tile taller than 64 rows": 1}
    assert "warp_m_at_most_64" in BUILTIN_FILTERS


def test_size_guard():
    big = dict(threadblock_shape=[[m, n, 32] for m in range(16, 1040, 16) for n in range(16, 1040, 16)],
               stages=[2, 3, 4, 5, 6], warp_count=[[1, 1, 1], [2, 2, 1], [4, 2, 1], [2, 4, 1], [4, 4, 1]])
    with pytest.raises(ArgumentError, match=f"more than max_points={MAX_POINTS:,}"):
        SearchSpace(**big)
    assert SearchSpace(**big, max_points=200_000).size == 64 * 64 * 5 * 5


@pytest.mark.parametrize("kwargs, message", [
    (dict(stage=[3]), r"unknown field\(s\) \['stage'\]; allowed: \['kind'"),
    (dict(kind="gemv"), r"kind: 'gemv' is not allowed; choose from \['gemm', 'grouped_gemm', 'conv2d'\]"),
    (dict(compute_capability=75), r"compute_capability: 75 is not allowed; choose from \[80, 86, 89, 90\]"),
    (dict(dtypes="fp16"), r"dtypes: 'fp16' is not a known combination; choose from \['f16_f32acc'"),
    (dict(dtypes={"element_a": "f16"}), r"missing \['element_accumulator', 'element_c'\]"),
    (dict(dtypes={"element_a": "half", "element_accumulator": "f32", "element_c": "f16"}),
     r"dtypes.element_a: 'half' is not allowed; choose from \['float64'"),
    (dict(layouts="tn"), "three letters for A, B and C, each r .RowMajor. or c"),
    (dict(alignment="min"), 'give "max"'),
    (dict(epilogue="swish"), r"epilogue: 'swish' is not allowed; choose from \['linear_combination', 'clamp'"),
    (dict(swizzle="Identity8"), r"swizzle: 'Identity8' is not allowed; choose from \['IdentitySwizzle1'"),
    (dict(kernel_schedule="Cooperative"), r"kernel_schedule: 'Cooperative' is not allowed; choose from \['Auto'"),
    (dict(threadblock_shape=[128, 128]), r"threadblock_shape: 128 is not allowed; give 3 positive integers"),
    (dict(threadblock_shape=[[128, 128, 0]]), "threadblock_shape: .* give 3 positive integers"),
    (dict(stages=-1), "stages: -1 is not allowed"),
    (dict(stages=[]), "stages: give at least one value"),
    (dict(conv_kind="fprop"), r"conv_kind applies to kind \['conv2d'\] only; this space's kinds are \['gemm'\]"),
    (dict(filters=["fast_only"]), r"filters: 'fast_only' is not allowed; choose from \['warp_m_at_most_64'"),
])
def test_bad_fields_and_values_name_the_field_and_what_is_allowed(kwargs, message):
    with pytest.raises(ArgumentError, match=message):
        SearchSpace(**kwargs)


def test_build_operation_fills_defaults_and_rejects_bad_params():
    op = build_operation({"kind": "gemm", "threadblock_shape": [64, 128, 32], "stages": 4})
    assert op.tile_description.threadblock_shape == (64, 128, 32) and op.tile_description.stages == 4
    with pytest.raises(DescriptionError, match="shared memory"):
        build_operation({"threadblock_shape": [256, 256, 64], "warp_count": [4, 4, 1], "stages": 5})
    with pytest.raises(ArgumentError, match=r"unknown field\(s\) \['tile'\]"):
        build_operation({"tile": [1, 2, 3]})
    with pytest.raises(ArgumentError, match="disagrees"):
        build_operation({"dtypes": "bf16", **DTYPE_COMBOS["f16_f32acc"].to_params()})


def test_grouped_and_conv_kinds():
    space = SearchSpace(kind=["gemm", "grouped_gemm", "conv2d"], conv_kind=["fprop", "dgrad", "wgrad"],
                        stride_support=["unity"], precompute_mode=["Device", "Host"], dtypes=["f16_f32acc", "tf32"])
    built = space.build()
    classes = [type(op).__name__ for op in built.operations]
    assert classes.count("GemmOperationUniversal") == 2 and classes.count("GemmOperationGrouped") == 4
    assert classes.count("Conv2dOperation") == 6
    conv = [op for op in built.operations if type(op).__name__ == "Conv2dOperation"]
    params = built.params_of(conv[0])
    assert "layouts" not in params and params["conv_kind"] == "fprop" and params["alignment"] == [8, 8, 8]
    tf32 = built.params_of([op for op in conv if op.A.element.label == "float32"][0])
    assert tf32["element_a"] == "tfloat32" and tf32["alignment"] == [4, 4, 4]  # float32 memory, 16 bytes
    for op in built.operations:
        assert build_operation(built.params_of(op)).name == op.name


def test_sm90_grouped_and_conv_points_take_clusters_schedules_and_stages():
    grouped = SearchSpace(kind=["grouped_gemm"], compute_capability=[90], dtypes=["bf16"],
                          threadblock_shape=[[128, 256, 64], [64, 128, 64]], cluster_shape=[[1, 1, 1], [2, 1, 1]],
                          kernel_schedule=["TmaWarpSpecializedCooperative", "TmaWarpSpecializedPingpong"],
                          filters=["no_register_spills"]).build()
    found = {(op.tile_description.threadblock_shape[0], tuple(op.tile_description.cluster_shape)[:2],
              op.tile_description.kernel_schedule.name) for op in grouped.operations}
    assert all(op.name.startswith("pycutlass_gemm_grouped_sm90_") for op in grouped.operations)
    assert found == {(128, (1, 1), "TmaWarpSpecializedCooperative"), (128, (2, 1), "TmaWarpSpecializedCooperative"),
                     (64, (1, 1), "TmaWarpSpecializedPingpong"), (64, (2, 1), "TmaWarpSpecializedPingpong")}
    reasons = " ".join(grouped.pruned_by_reason)
    assert "spill" in reasons and "cooperative schedule needs tile M" in reasons  # ping-pong 128x256; coop M 64
    for op in grouped.operations:
        assert build_operation(grouped.params_of(op)).name == op.name

    conv = SearchSpace(kind=["conv2d"], compute_capability=[90, 80], threadblock_shape=[[128, 64, 64]],
                       stages=[0, 4], cluster_shape=[[1, 1, 1], [1, 2, 1]]).build()
    sm90 = [op for op in conv.operations if op.name.startswith("pycutlass_conv2d_sm90_")]
    assert {(op.tile_description.stages, tuple(op.tile_description.cluster_shape)[:2]) for op in sm90} == \
        {(0, (1, 1)), (0, (1, 2)), (4, (1, 1)), (4, (1, 2))}
    assert {op.ctas_per_sm for op in sm90 if op.tile_description.stages == 4} == {2}
    sm80 = [op for op in conv.operations if op not in sm90]  # cc 80: the CUTLASS 2.x kernel, no cluster
    assert [(op.tile_description.stages, tuple(op.tile_description.cluster_shape)) for op in sm80] == [(4, (1, 1, 1))]
    assert conv.pruned_by_reason == {"SM90-only value in an Sm80-family kernel": 3}  # cc 80: stages 0, a cluster

    # the spill filter knows conv's schedules: CUTLASS's one-warpgroup kernel on 128x256, the cooperative on 256x256
    spills = SearchSpace(kind=["conv2d"], compute_capability=[90], threadblock_shape=[[128, 256, 64], [256, 256, 64],
                                                                                      [256, 128, 64]],
                         kernel_schedule=["Auto", "TmaWarpSpecializedCooperative"],
                         filters=["no_register_spills"]).build()
    assert sorted(op.name.split("_nhwc_")[1][:18] for op in spills.operations) == \
        ["128x256x64_c1x1_co", "256x128x64_c1x1_co"]
    assert "warpspecialized 128x256 tile, 256 per consumer thread" in " ".join(spills.pruned_by_reason)
    assert "cooperative 256x256 tile, 256 per consumer thread" in " ".join(spills.pruned_by_reason)


def test_conv_spaces_build_the_filter_taps_wgrad():
    """A wgrad tile of N = 9*64 in a space builds the filter-tap-reuse kernel: its instruction is one 64-wide wgmma
    per filter tap, its clusters lie along z, and the spill filter counts its three consumer warpgroups (96
    accumulators each)."""
    space = SearchSpace(kind=["conv2d"], compute_capability=[90], conv_kind=["wgrad"], dtypes=["f16_f32acc"],
                        threadblock_shape=[[64, 576, 64], [64, 576, 128]], cluster_shape=[[1, 1, 1], [1, 1, 2]],
                        filters=["no_register_spills"]).build()
    assert len(space.operations) == 4 and all(op.filter_taps for op in space.operations)
    assert {tuple(op.tile_description.math_instruction.instruction_shape) for op in space.operations} == {(64, 64, 16)}
    for op in space.operations:
        assert build_operation(space.params_of(op)).name == op.name


def test_a_space_is_immutable_and_its_built_form_checks_lookups():
    space = SearchSpace(**SMALL)
    with pytest.raises(AttributeError):
        space.stages = [3]
    with pytest.raises(TypeError):
        space.dimensions["stages"] = (3,)
    with pytest.raises(ArgumentError, match="not an operation of this space"):
        space.build().params_of("pycutlass_gemm_nothing")
