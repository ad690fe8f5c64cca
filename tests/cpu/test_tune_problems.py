"""Problem sets (pycutlass.tune.problems): keys, JSON forms, generators and the command line's spec strings."""
from __future__ import annotations

import json

import numpy as np
import pytest

from pycutlass.errors import ArgumentError
from pycutlass.tune.problems import (BUILTIN_MODELS, Conv2dProblem, GemmProblem, GroupedGemmProblem, LayerShape,
                                     ModelShapes, ProblemSet, explicit_problems, gemm_range, grouped_problems,
                                     model_problems, parse_problems, problem_from_dict, resnet50_conv_problems,
                                     square_problems)

SAMPLES = [GemmProblem(4096, 4096, 4096), GemmProblem(4096, 4096, 4096, batch=8), GemmProblem(1, 6144, 4096),
           Conv2dProblem(32, 56, 56, 64, 64, 3, 3, pad=(1, 1)),
           Conv2dProblem(32, 224, 224, 3, 64, 7, 7, pad=(3, 3), stride=(2, 2)),
           Conv2dProblem(2, 9, 9, 8, 16, 3, 3, dilation=(2, 2)),
           GroupedGemmProblem(((128, 4096, 1024), (7, 4096, 1024)))]


def test_keys_are_readable_stable_and_unique():
    assert GemmProblem(4096, 4096, 4096).key == "gemm 4096x4096x4096"
    assert GemmProblem(4096, 4096, 4096, 8).key == "gemm 4096x4096x4096 b8"
    assert SAMPLES[3].key == "conv2d 32x56x56x64 k64 3x3 pad1,1"
    assert SAMPLES[4].key == "conv2d 32x224x224x3 k64 7x7 pad3,3 stride2,2"
    grouped = SAMPLES[6]
    assert grouped.key.startswith("grouped_gemm 2 groups ") and grouped.key == \
        GroupedGemmProblem([[128, 4096, 1024], [7, 4096, 1024]]).key
    assert GroupedGemmProblem(((7, 4096, 1024), (128, 4096, 1024))).key != grouped.key  # order matters
    assert len({p.key for p in SAMPLES}) == len(SAMPLES)


@pytest.mark.parametrize("problem", SAMPLES, ids=lambda p: p.key)
def test_to_dict_round_trips_through_json(problem):
    d = json.loads(json.dumps(problem.to_dict()))
    assert d["kind"] == problem.kind
    back = problem_from_dict(d)
    assert back == problem and hash(back) == hash(problem) and back.key == problem.key


def test_flops_and_shapes():
    assert GemmProblem(2, 3, 4, batch=5).flops == 2 * 2 * 3 * 4 * 5
    assert GemmProblem(2, 3, 4).shape == (2, 3, 4)
    stem = SAMPLES[4]
    assert stem.output_size == (112, 112)
    assert stem.gemm_shape() == (32 * 112 * 112, 64, 7 * 7 * 3)
    assert stem.gemm_shape("dgrad") == (32 * 224 * 224, 3, 7 * 7 * 64)
    assert stem.gemm_shape("wgrad") == (64, 7 * 7 * 3, 32 * 112 * 112)
    assert stem.flops == 2 * 32 * 112 * 112 * 64 * 147
    assert SAMPLES[5].output_size == (5, 5)  # dilation 2: the 3x3 filter spans 5
    assert SAMPLES[6].flops == 2 * 4096 * 1024 * (128 + 7)
    assert tuple(stem.to_problem_size().implicit_gemm_size("fprop")) == stem.gemm_shape()
    with pytest.raises(ArgumentError, match="fprop"):
        stem.gemm_shape("bprop")


def test_ordering_is_sane_across_kinds():
    ordered = sorted(SAMPLES)
    assert [p.kind for p in ordered] == ["conv2d"] * 3 + ["gemm"] * 3 + ["grouped_gemm"]
    assert GemmProblem(1, 2, 3) < GemmProblem(1, 2, 4) < GemmProblem(2, 1, 1)


@pytest.mark.parametrize("bad", [0, -1, 1.0, "8", True, None])
def test_sizes_must_be_positive_integers(bad):
    with pytest.raises(ArgumentError, match="positive integer"):
        GemmProblem(bad, 1, 1)
    with pytest.raises(ArgumentError, match="positive integer"):
        Conv2dProblem(1, 8, 8, 8, 8, bad, 1)


def test_numpy_integers_are_sizes_and_bad_problems_say_why():
    assert GemmProblem(np.int64(8), 8, 8).m == 8 and type(GemmProblem(np.int64(8), 8, 8).m) is int
    with pytest.raises(ArgumentError, match="does not fit"):
        Conv2dProblem(1, 2, 2, 8, 8, 3, 3)
    with pytest.raises(ArgumentError, match="pad"):
        Conv2dProblem(1, 8, 8, 8, 8, 3, 3, pad=(1, -1))
    with pytest.raises(ArgumentError, match="at least one"):
        GroupedGemmProblem(())
    with pytest.raises(ArgumentError, match=r"shapes\[1\]"):
        GroupedGemmProblem(((1, 2, 3), (1, 2)))
    with pytest.raises(ArgumentError, match="unknown field"):
        problem_from_dict({"kind": "gemm", "m": 1, "n": 1, "k": 1, "l": 2})
    with pytest.raises(ArgumentError, match="'kind' one of"):
        problem_from_dict({"m": 1})


def test_problem_set_is_ordered_deduplicated_and_immutable(tmp_path):
    a = explicit_problems([(64, 64, 64), (128, 128, 128), (64, 64, 64), (64, 64, 64, 2)], name="a")
    assert [p.key for p in a] == ["gemm 64x64x64", "gemm 128x128x128", "gemm 64x64x64 b2"]
    b = ProblemSet("b", [GemmProblem(128, 128, 128), SAMPLES[3]])
    both = a + b
    assert both.name == "a+b" and len(both) == 4 and both.kinds == ("gemm", "conv2d")
    with pytest.raises(AttributeError):
        a.name = "c"
    path = both.to_json(tmp_path / "set.json")
    assert ProblemSet.from_json(path) == both
    assert ProblemSet.from_dict(json.loads(path.read_text())) == both
    (tmp_path / "bare.json").write_text(json.dumps([p.to_dict() for p in b]))
    assert ProblemSet.from_json(tmp_path / "bare.json") == ProblemSet("bare", b)
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(ArgumentError, match="not valid JSON"):
        ProblemSet.from_json(tmp_path / "broken.json")
    with pytest.raises(ArgumentError, match="cannot read"):
        ProblemSet.from_json(tmp_path / "missing.json")


def test_square_and_range_generators():
    assert [p.m for p in square_problems(128, 512, 128)] == [128, 256, 384, 512]  # end included
    assert len(square_problems(128, 256, 128)) == 2
    grid = gemm_range([1, 16], 4096, (1024, 3072, 1024))
    assert [p.shape for p in grid][:3] == [(1, 4096, 1024), (1, 4096, 2048), (1, 4096, 3072)] and len(grid) == 6
    assert len(gemm_range(range(64, 256, 64), 8, 8, batch=[1, 4])) == 6  # Python's range: end excluded
    with pytest.raises(ArgumentError, match="below start"):
        square_problems(256, 128, 128)
    with pytest.raises(ArgumentError, match="start, end, step"):
        gemm_range((1, 2), 8, 8)


def test_model_shapes_come_from_the_configs():
    """Llama-3-8B: hidden 4096, intermediate 14336, 32 heads, 8 KV heads of 128."""
    layers = {layer.name: layer for layer in ModelShapes.default().layers("llama-3-8b")}
    assert (layers["qkv_proj"].k, layers["qkv_proj"].n) == (4096, 6144)
    assert (layers["o_proj"].k, layers["o_proj"].n) == (4096, 4096)
    assert (layers["gate_up_proj"].k, layers["gate_up_proj"].n) == (4096, 28672)
    assert (layers["down_proj"].k, layers["down_proj"].n) == (14336, 4096)
    gemma = {layer.name: layer for layer in BUILTIN_MODELS["gemma-7b"]}
    assert (gemma["qkv_proj"].n, gemma["o_proj"].k, gemma["o_proj"].n) == (12288, 4096, 3072)  # head_dim 256
    assert {layer.name: layer.n for layer in BUILTIN_MODELS["llama-2-70b"]}["qkv_proj"] == 10240
    for name in ("llama-2-7b", "llama-2-13b", "llama-2-70b", "llama-3-8b", "llama-3-70b", "mistral-7b",
                 "mixtral-8x7b", "qwen2-7b", "gemma-7b"):
        assert name in ModelShapes.default()


def test_model_problems_split_by_tensor_parallel_size():
    problems = model_problems("llama-3-8b", tp_sizes=(1, 2), batch_sizes=(16,))
    keys = [p.key for p in problems]
    assert keys == ["gemm 16x6144x4096", "gemm 16x4096x4096", "gemm 16x28672x4096", "gemm 16x4096x14336",
                    "gemm 16x3072x4096", "gemm 16x4096x2048", "gemm 16x14336x4096", "gemm 16x4096x7168"]
    assert len(model_problems("llama-2-7b")) == 4 * 7  # the default batch sizes
    with pytest.raises(ArgumentError, match=r"tp=3 does not divide o_proj \(K=4096\).*down_proj \(K=14336\)"):
        model_problems("llama-3-8b", tp_sizes=(3,))
    with pytest.raises(ArgumentError, match="known models: .*llama-3-8b"):
        model_problems("llama-9")


def test_model_registry_is_held_by_the_user():
    registry = ModelShapes.default().register("tiny", [("up", 64, 256, "n"), LayerShape("down", 256, 64, "k")])
    assert registry.names()[-1] == "tiny" and "tiny" not in ModelShapes.default()
    assert [p.shape for p in model_problems("tiny", (2,), (8,), registry=registry)] == [(8, 128, 64), (8, 64, 128)]
    with pytest.raises(ArgumentError, match="already registered"):
        registry.register("tiny", [("up", 64, 256, "n")])
    with pytest.raises(ArgumentError, match="tp_split"):
        registry.register("bad", [("up", 64, 256, "m")])


def test_resnet50_has_23_distinct_convolutions():
    convs = resnet50_conv_problems(batch=8)
    assert len(convs) == 23 and convs.kinds == ("conv2d",)
    keys = {p.key for p in convs}
    assert "conv2d 8x224x224x3 k64 7x7 pad3,3 stride2,2" in keys  # the stem, C = 3
    assert "conv2d 8x56x56x128 k128 3x3 pad1,1 stride2,2" in keys  # conv3_1's strided 3x3 (v1.5)
    assert "conv2d 8x14x14x1024 k2048 1x1 stride2,2" in keys  # conv5_1's projection shortcut
    assert "conv2d 8x7x7x2048 k512 1x1" in keys
    assert all(p.n == 8 for p in convs)


def test_grouped_problems_are_deterministic_by_seed():
    a = grouped_problems(8, (1, 512), 4096, 1024, seed=3, sets=2)
    assert len(a) == 2 and all(p.count == 8 for p in a)
    assert a == grouped_problems(8, (1, 512), 4096, 1024, seed=3, sets=2)
    assert a[0] != grouped_problems(8, (1, 512), 4096, 1024, seed=4)[0]
    assert all(1 <= m <= 512 and (n, k) == (4096, 1024) for p in a for m, n, k in p.shapes)
    with pytest.raises(ArgumentError, match="m_range"):
        grouped_problems(8, (512, 1), 4096, 1024)


@pytest.mark.parametrize("spec, count, first", [
    ("square:128:256:128", 2, "gemm 128x128x128"),
    ("gemm:4096x4096x4096,1024x8192x4096", 2, "gemm 4096x4096x4096"),
    ("gemm:64x64x64x4", 1, "gemm 64x64x64 b4"),
    ("range:m=1,16,128:n=4096:k=4096", 3, "gemm 1x4096x4096"),
    ("range:m=128..512..128:n=64:k=64:batch=1,2", 8, "gemm 128x64x64"),
    ("model:llama-3-8b:tp=1,2:batch=1,16,128", 24, "gemm 1x6144x4096"),
    ("model:mixtral-8x7b", 28, "gemm 1x6144x4096"),
    ("resnet50:batch=32", 23, "conv2d 32x224x224x3 k64 7x7 pad3,3 stride2,2"),
    ("resnet50", 23, "conv2d 32x224x224x3 k64 7x7 pad3,3 stride2,2"),
])
def test_parse_problems_forms(spec, count, first):
    problems = parse_problems(spec)
    assert len(problems) == count and problems[0].key == first


def test_parse_problems_grouped_and_file(tmp_path):
    grouped = parse_problems("grouped:count=4:m=1..64:n=256:k=128:seed=7")
    assert grouped == grouped_problems(4, (1, 64), 256, 128, seed=7)
    path = (grouped + square_problems(64, 64, 64)).to_json(tmp_path / "problems.json")
    assert list(parse_problems(f"file:{path}")) == list(grouped) + [GemmProblem(64, 64, 64)]


@pytest.mark.parametrize("spec, message", [
    ("cube:1:2:3", "unknown form 'cube'"),
    ("square:128:4096", "START:END:STEP"),
    ("gemm:4096x4096", "MxNxK"),
    ("range:m=1:n=2", r"missing \['k'\]"),
    ("range:m=1:n=2:k=x", "not a positive integer"),
    ("model:llama-3-8b:tp=3", "does not divide"),
    ("model:llama-3-8b:pp=2", "is not one of"),
    ("resnet50:batch=0", "not a positive integer"),
    ("", "empty"),
])
def test_parse_problems_errors_list_the_forms(spec, message):
    with pytest.raises(ArgumentError, match=message) as info:
        parse_problems(spec)
    if "does not divide" not in message:
        assert "square:START:END:STEP" in str(info.value) and "file:PATH.json" in str(info.value)


# --- MoE expert GEMMs ------------------------------------------------------------------------------------------------
from pycutlass.tune.problems import (MOE_MODELS, MaskedGroupedProblem, moe_problems, moe_sets,  # noqa: E402
                                     routed_counts)


def test_routing_draws_are_seeded_skewed_and_complete():
    counts = routed_counts(32, 16384, seed=3)
    assert sum(counts) == 16384 and len(counts) == 32
    assert counts == routed_counts(32, 16384, seed=3) and counts != routed_counts(32, 16384, seed=4)
    assert 1.3 < max(counts) / (16384 / 32) < 5  # skewed, not pathological
    uniform = routed_counts(32, 16384, seed=3, skew=0)
    assert max(uniform) / (16384 / 32) < 1.2
    for bad in (dict(skew=-1), dict(skew=True), dict(seed=-1), dict(seed=1.5)):
        with pytest.raises(ArgumentError):
            routed_counts(8, 100, **bad)


def test_moe_forward_contiguous_groups_are_each_experts_tokens():
    found = moe_problems("mixtral-8x7b", (4096, 65536), seed=0)
    spec = MOE_MODELS["mixtral-8x7b"]
    assert len(found) == 4
    for tokens, (up, down) in zip((4096, 65536), (found[0:2], found[2:4])):
        counts = [c for c in routed_counts(8, tokens, 0) if c]
        assert up.shapes == tuple((c, spec.intermediate, spec.hidden) for c in counts)
        assert down.shapes == tuple((c, spec.hidden, spec.intermediate) for c in counts)
        assert up.flops == 2 * tokens * spec.intermediate * spec.hidden


def test_moe_masked_layout_keeps_every_expert_at_a_fixed_capacity():
    found = moe_problems("deepseek-v3", (4096,), layout="masked", ep=32, seed=1)
    up = found[0]
    counts = routed_counts(8, 4096, 1)
    assert isinstance(up, MaskedGroupedProblem) and up.experts == 8 and up.counts == counts
    assert up.capacity % 128 == 0 and max(counts) <= up.capacity < max(counts) + 128
    assert (up.n, up.k) == (2048, 7168) and (found[1].n, found[1].k) == (7168, 2048)
    assert problem_from_dict(up.to_dict()) == up
    with pytest.raises(ArgumentError, match="counts\\[0\\]"):
        MaskedGroupedProblem(2, 128, 64, 64, (129, 0))
    with pytest.raises(ArgumentError, match="2 counts for 3 experts"):
        MaskedGroupedProblem(3, 128, 64, 64, (1, 2))


def test_moe_weight_gradients_are_k_grouped():
    [up, down] = moe_problems("qwen3-30b-a3b", 4096, pass_="wgrad", seed=2)
    counts = [c for c in routed_counts(128, 4096, 2) if c]
    assert up.shapes == tuple((768, 2048, c) for c in counts)  # groups share M and N, differ in K
    assert down.shapes == tuple((2048, 768, c) for c in counts)
    with pytest.raises(ArgumentError, match="layout 'contiguous' only"):
        moe_problems("qwen3-30b-a3b", 4096, pass_="wgrad", layout="masked")


def test_moe_sets_and_spec_form():
    sets = moe_sets()
    assert len(sets) == 12  # 3 models (DeepSeek-V3 at ep 8 and 32) x 3 kinds of set
    assert all(len(found) == 6 for found in sets.values())  # 3 token counts x (up, down)
    parsed = parse_problems("moe:deepseek-v3:tokens=4096,16384:layout=masked:ep=8:seed=5")
    assert parsed == moe_problems("deepseek-v3", (4096, 16384), layout="masked", ep=8, seed=5)
    for spec, why in (("moe", "needs a model"), ("moe:gpt-5", "unknown MoE model"),
                      ("moe:mixtral-8x7b:ep=3", "do not spread evenly"),
                      ("moe:mixtral-8x7b:layout=sparse", "layout must be one of"),
                      ("moe:mixtral-8x7b:tokens=1..4", "tokens takes a list")):
        with pytest.raises(ArgumentError, match=why):
            parse_problems(spec)
