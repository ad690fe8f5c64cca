"""What the model pass compiles from a cold kernel cache: one round of the parallel compile by default, shared out
by work across the layers, every layer keeping its best-ranked candidate, cached candidates always kept."""
from __future__ import annotations

import contextlib
import types

import pytest

torch = pytest.importorskip("torch")

from pycutlass.errors import ArgumentError  # noqa: E402
from pycutlass.torch import kernels, tuning  # noqa: E402
from pycutlass.torch.calls import OpCall  # noqa: E402


def _ops(*names):
    return [({"rank": i}, types.SimpleNamespace(name=name)) for i, name in enumerate(names)]


def test_budget_goes_to_the_layers_with_the_most_work_per_candidate():
    drawn = {"light": _ops("a", "b", "c"), "heavy": _ops("x", "y", "z", "w"), "mid": _ops("m", "n", "o")}
    weights = {"light": 1.0, "heavy": 100.0, "mid": 60.0}
    kept = tuning.within_budget(drawn, weights, set(), 6)
    names = {key: [op.name for _, op in ranked] for key, ranked in kept.items()}
    # the best of each (3); then heavy 100/2 -> y, 100/3 > 60/2 -> z, then 100/4 < 60/2 -> n
    assert names == {"light": ["a"], "heavy": ["x", "y", "z"], "mid": ["m", "n"]}
    assert [params["rank"] for params, _ in kept["heavy"]] == [0, 1, 2]  # rank order, params with their operation


def test_every_layer_keeps_its_best_even_past_the_budget_and_cached_ones_always_stay():
    drawn = {f"layer{i}": _ops(f"best{i}", f"second{i}", "shared") for i in range(4)}
    weights = {f"layer{i}": float(i) for i in range(4)}
    kept = tuning.within_budget(drawn, weights, {"second1", "shared"}, 2)
    names = {key: [op.name for _, op in ranked] for key, ranked in kept.items()}
    assert names == {f"layer{i}": [f"best{i}"] + (["second1"] if i == 1 else []) + ["shared"] for i in range(4)}
    new = {name for ranked in names.values() for name in ranked} - {"second1", "shared"}
    assert len(new) == 4  # a budget of 2, but four layers each need one candidate


def test_a_candidate_shared_by_layers_counts_once():
    drawn = {"up": _ops("p", "q", "r"), "down": _ops("p", "q", "s")}
    kept = tuning.within_budget(drawn, {"up": 2.0, "down": 1.5}, set(), 2)
    assert {key: [op.name for _, op in ranked] for key, ranked in kept.items()} == {"up": ["p", "q"],
                                                                                    "down": ["p", "q"]}
    assert tuning.within_budget(drawn, {}, set(), None) is drawn  # no budget: every layer's top_k


@pytest.mark.parametrize("bad", [0, -3, 2.5, "all", True])
def test_max_compiles_is_checked_before_anything_runs(bad):
    with pytest.raises(ArgumentError, match="max_compiles"):
        tuning.check_max_compiles(bad)
    from pycutlass.torch.model_pass import optimize

    with pytest.raises(ArgumentError, match="max_compiles"):
        optimize(torch.nn.Linear(8, 8), torch.randn(2, 8), max_compiles=bad)


class _Dispatch:
    """What tune_calls asks of a dispatch, with nothing tuned yet."""

    session = None

    def __init__(self):
        self.choices = {}

    def lookup(self, key):
        return None

    def candidates(self, cls):
        return []

    def register_kernel(self, operation, params):
        pass

    def set_choice(self, key, choice, count):
        self.choices[key] = (choice, count)


def _vit_calls():
    """ViT-B/16's six GEMM layers at batch 32 (bf16, SM90): identity, GELU and residual classes."""
    plain = kernels.GemmClass("bfloat16", True, False, 8, "identity", True, False, 90)
    gelu = kernels.GemmClass("bfloat16", True, False, 8, "gelu", True, False, 90)
    residual = kernels.GemmClass("bfloat16", True, False, 8, "identity", True, True, 90)
    layers = [("patch", plain, (6272, 768, 768), 1), ("qkv", plain, (6304, 2304, 768), 12),
              ("proj", residual, (6304, 768, 768), 12), ("fc1", gelu, (6304, 3072, 768), 12),
              ("fc2", residual, (6304, 768, 3072), 12), ("head", plain, (32, 1000, 768), 1)]
    return [OpCall("gemm", name, f"{name}-key", (), (), 0, cls, problem)
            for name, cls, problem, count in layers for _ in range(count)]


@pytest.mark.parametrize("max_compiles,jobs,cached", [("auto", 16, 0), ("auto", 2, 0), (10, 16, 0), (None, 16, 0),
                                                      ("auto", 16, 5)])
def test_the_model_pass_compiles_one_round_by_default(monkeypatch, max_compiles, jobs, cached):
    compiled, timed = [], {}
    calls = _vit_calls()
    full = tuning.call_candidates(_Dispatch(), calls, 8)
    union = {op.name for ranked in full.values() for _, op in ranked}
    in_cache = {op.name for ranked in full.values() for _, op in ranked[-1:]}
    in_cache = set(sorted(in_cache)[:cached])

    monkeypatch.setattr(tuning, "cached_operation_names", lambda operations, session: in_cache & {
        op.name for op in operations})
    monkeypatch.setattr(tuning, "_compile", lambda compiler, operations, jobs_: compiled.extend(
        op.name for op in operations) or set())
    monkeypatch.setattr(tuning.Compiler, "of", staticmethod(lambda session: None))
    monkeypatch.setattr(tuning, "_tune_one", lambda dispatch, call, candidates, *rest: timed.setdefault(
        call.key, [op.name for _, op in candidates]) and {"kernel": candidates[0][1].name, "us": 1.0,
                                                           "torch_us": 2.0})
    import pycutlass.tune.bench as bench

    monkeypatch.setattr(bench, "GemmBench", lambda config, device: object())
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())

    dispatch = _Dispatch()
    phases = []

    @contextlib.contextmanager
    def phase(name):
        phases.append(name)
        yield

    choices = tuning.tune_calls(dispatch, calls, jobs=jobs, progress=False, prefer_faster=False, repetitions=3,
                                max_compiles=max_compiles, timed=phase)
    assert phases == ["rank", "compile", "tune"]
    assert len(choices) == len(calls) and set(timed) == {call.key for call in calls}
    assert len(compiled) == len(set(compiled))
    if max_compiles is None:
        assert set(compiled) == union  # every layer's 8 best-ranked
        return
    budget = jobs if max_compiles == "auto" else max_compiles
    new = set(compiled) - in_cache
    assert len(new) == max(budget, len({ranked[0][1].name for ranked in full.values()})) or new == union - in_cache
    for key, names in timed.items():
        ranked = [op.name for _, op in full[key]]
        assert names[0] == ranked[0]  # every layer keeps its best-ranked candidate
        assert names == [name for name in ranked if name in names]  # in rank order
        assert in_cache & set(ranked) <= set(names)  # cached candidates always stay
    # the heaviest layers get the second picks: the MLP (GELU, 6304x3072x768 x 12), not the classifier head
    assert len(timed["fc1-key"]) >= len(timed["head-key"])
    if max_compiles == "auto" and jobs == 16 and not cached:
        assert len(new) == 16 and len(timed["head-key"]) == 1 and len(timed["fc1-key"]) >= 3


def test_a_candidate_that_leaves_its_output_unwritten_fails_the_check(monkeypatch):
    """Each candidate's check runs into memory left NaN: a kernel that writes nothing must not inherit the correct
    values the previous candidate left in the block the allocator hands out again."""
    block = {"values": None}  # the one block a same-size allocation gets, as torch's caching allocator does

    def poison(expected):
        block["values"] = torch.full_like(expected, float("nan"))

    def run(dispatch, call, tensors, kernel):
        if kernel == "writes":
            block["values"] = torch.ones(4, 4)
        return block["values"].clone()  # "lazy" leaves whatever the block holds

    monkeypatch.setattr(tuning, "_poison_like", poison)
    monkeypatch.setattr(tuning, "_run", run)
    monkeypatch.setattr(tuning, "_inputs", lambda call, generator: [])
    monkeypatch.setattr(tuning, "_reference", lambda call, tensors: torch.ones(4, 4))
    monkeypatch.setattr(tuning, "_eager", lambda call, tensors: None)
    monkeypatch.setattr(tuning, "_median_us", lambda bench, fn: 1.0)
    call = types.SimpleNamespace(specs=[((4, 4), (4, 1), torch.float16)])
    candidates = [({}, types.SimpleNamespace(name="writes")), ({}, types.SimpleNamespace(name="lazy"))]
    choice = tuning._tune_one(None, call, candidates, None, None, set(), False)
    assert choice["candidates"] == 1 and choice["kernel"] == "writes"
