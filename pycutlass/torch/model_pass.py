"""The model pass: TVM's CUTLASS BYOC flow (partition -> tune -> build) for a ``torch.nn.Module``.

``optimize(model, example_inputs)`` traces the model with ``torch.fx``, replaces every Linear and Conv2d (module or
functional call) together with a following eval-mode BatchNorm2d (folded into the weights) and activation by one
fused :class:`CutlassLinear` / :class:`CutlassConv2d`, and, on a GPU, tunes each call the model makes on the example
inputs. ``save`` / ``load`` keep the model together with the tuning decisions, so a new process does not re-tune.

This module is the entry; the pass's jobs live beside it: :mod:`.match` (tracing, finding the patterns),
:mod:`.rewrite` (swapping in the fused layers of :mod:`.layers`), :mod:`.measure` (tuning the calls, the end-to-end
check), :mod:`.plans` (``save`` / ``load``) and :mod:`.optimize_report` (the report).
"""
from __future__ import annotations

import torch
import torch.fx as fx
import torch.nn as nn

from ..errors import ArgumentError, NoGpuError
from .graphs import CUDAGraphed
from .layers import CutlassConv2d, CutlassLinear
from .match import _Evaluating, _find, _Shapes, _trace
# (the end-to-end check's names that tests and benchmarks reach for stay importable from here)
from .measure import (_E2E_EAGER, _E2E_MARGIN, _E2E_NOISE_FACTOR, _E2E_TRACED, _E2E_TRACED_MARGIN,  # noqa: F401
                      _GRAPHS_MARGIN, _choose_end_to_end, _choose_graphs, _end_to_end_candidates, _fill_rows,
                      _record_end_to_end, _shallow_copy, _Site, _tensors, _time_interleaved, _tune)
from .optimize_report import OptimizeReport
from .plans import MODEL_FILE, STATE_FILE, _dispatch, load, save  # noqa: F401
from .rewrite import _keep_views_working, _remove_orphans, _rewrite

__all__ = ["optimize", "report", "save", "load", "OptimizeReport", "CutlassLinear", "CutlassConv2d"]


def _tuple(example_inputs) -> tuple:
    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,)
    if isinstance(example_inputs, (list, tuple)):
        return tuple(example_inputs)
    raise ArgumentError(f"example_inputs must be a tensor or a tuple of the model's positional arguments, "
                        f"got {type(example_inputs).__name__}")


def _on_cuda(gm: fx.GraphModule, example_inputs: tuple) -> bool:
    return any(t.device.type == "cuda" for t in _tensors(example_inputs) + list(gm.parameters()))


def _graph_if_faster(gm: nn.Module, model: nn.Module, example_inputs: tuple, report: OptimizeReport) -> nn.Module:
    if model.training:
        report.end_to_end["graphs"] = {"kept": False, "why": "the model is in training mode"}
    else:
        gm, report.end_to_end["graphs"] = _choose_graphs(gm, example_inputs)
    graphs = report.end_to_end["graphs"]
    if "why" in graphs:
        report.notes.append(f"cuda_graphs: not replayed from CUDA graphs: {graphs['why']}")
    else:
        report.notes.append(f"cuda_graphs: replayed {graphs['graphed_ms']:.3f} ms vs {graphs['plain_ms']:.3f} ms per "
                            "forward; " + ("kept the CUDA-graph replay" if graphs["kept"] else
                                           f"not {_GRAPHS_MARGIN:.0%} faster, kept the plain module"))
    return gm


# --- the public API -------------------------------------------------------------------------------------------------
def optimize(model: nn.Module, example_inputs, *, tune: bool = True, fold_batchnorm: bool = True,
             prefer_faster: bool = True, jobs: int | None = None, max_compiles="auto", progress: bool = True,
             dispatch=None, end_to_end: bool = True, cuda_graphs: bool = False, pack=None) -> nn.Module:
    """Traces ``model``, fuses its Linear/Conv2d (+ BatchNorm2d) (+ activation) into pycutlass ops and tunes them.

    Returns a ``torch.fx.GraphModule`` computing what ``model`` computes; ``report(result)`` (also
    ``result.pycutlass_report``) says what was replaced and tuned. ``model`` itself is not changed; the result
    shares the parameters of the layers it kept and of the Linear layers it fused. ``example_inputs``: the model's
    positional arguments (a tensor or a tuple), run once to learn shapes and, with ``tune``, to record the calls to
    tune. Tuning needs a GPU and happens only for a model on CUDA; a CPU model runs torch's math and is not tuned.
    ``jobs``: parallel compile processes (default: one per core that memory allows). ``max_compiles``: how many
    candidates outside the kernel cache tuning compiles: ``"auto"`` (default) one round of ``jobs``, taken rank by
    rank across the layers, the heaviest layers first, every layer keeping its best-ranked candidate; an int; or
    ``None`` for every layer's 8 best-ranked (docs/torch.md: what a first ``optimize`` costs).
    ``dispatch``: the :class:`~pycutlass.torch.dispatch.Dispatch` to tune with (default: the current session's).
    ``end_to_end`` (after tuning on CUDA): time whole forwards of ``model`` and of the result with a few placements
    of its layers (as tuned, only clear wins on kernels, all on torch) on ``example_inputs`` and keep the fastest,
    so a host-bound model is not slower than torch's; the report's ``end_to_end`` records the times. When no
    placement beats torch by 2%, the result runs torch only: ``model`` itself as a shallow copy (a module of its
    class sharing its layers; ``end_to_end["chosen"] == "eager"``) or, where that was 10% faster, its plain
    ``torch.fx`` trace (``"traced"``).
    ``cuda_graphs`` (with ``end_to_end``, an eval-mode model on CUDA): also time the chosen result replayed from CUDA
    graphs (:func:`~pycutlass.torch.cuda_graphed`: one capture per input signature, inputs copied in, outputs
    copied out) and return that :class:`~pycutlass.torch.CUDAGraphed` where it was 10% faster (a host-bound model:
    small batches, many layers); ``end_to_end["graphs"]`` records both times. The graphs replay only for calls
    without autograd (``torch.no_grad()`` / ``torch.inference_mode()``); other calls run the module directly.
    ``pack`` (a path; needs ``tune``): also write the GEMM kernels tuning chose into a kernel pack, which a serving
    process loads with ``pycutlass.torch.use_pack(path)`` to run the same kernels without compiling
    (docs/packs.md).
    """
    from .tuning import check_max_compiles

    check_max_compiles(max_compiles)
    if pack is not None and not tune:
        raise ArgumentError("pack= writes the kernels tuning chose: it needs tune=True")
    for name, value in (("end_to_end", end_to_end), ("cuda_graphs", cuda_graphs)):
        if not isinstance(value, bool):
            raise ArgumentError(f"{name} must be True or False, got {value!r}")
    example_inputs = _tuple(example_inputs)
    report = OptimizeReport()
    with report.timed("trace"):
        gm = _trace(model)
        shapes = _Shapes(gm)
        try:
            with _Evaluating(gm), torch.no_grad():
                shapes.run(*example_inputs)
        except Exception as exc:
            where = f" at {shapes.node.format_node()}" if shapes.node is not None else ""
            raise ArgumentError(f"the traced model failed on example_inputs{where} ({type(exc).__name__}: {exc}); "
                                "pass the model's positional arguments, as a tensor or a tuple") from exc

        matches = _find(gm, fold_batchnorm, model.training, report)
        attrs_before = {n.target for n in gm.graph.nodes if n.op == "get_attr"}
        conv_nodes = _rewrite(gm, model, matches)
        _keep_views_working(gm.graph, conv_nodes)
        gm.graph.eliminate_dead_code()
        _remove_orphans(gm, model, attrs_before)
        gm.delete_all_unused_submodules()
        gm.graph.lint()
        gm.recompile()
    report.rows = [{"layer": m.layer, "op": m.op, "pattern": m.pattern, "shape": m.shape, "kernel": "-",
                    "cutlass_us": None, "torch_us": None, "speedup": None} for m in matches]

    if tune and not matches:
        report.notes.append("nothing to tune: no layer was replaced")
    elif tune and not _on_cuda(gm, example_inputs):
        report.notes.append("not tuned: the model and its inputs are on the CPU, where the ops run torch's math "
                            "(move both to CUDA to tune)")
    elif tune:
        if not torch.cuda.is_available():
            raise NoGpuError("tuning needs a GPU: the model is on CUDA but torch sees no usable GPU")
        choices, sites = _tune(gm, example_inputs, _dispatch(dispatch), jobs, progress, prefer_faster,
                               max_compiles, report.timed)
        if pack is not None:
            from .packs import write_choices

            written = write_choices(pack, choices, _dispatch(dispatch))
            report.notes.append(f"pack: wrote the tuned GEMM kernels to {written}" if written else
                                "pack: not written (no GEMM layer chose a pycutlass kernel)")
        rows = _fill_rows(report, choices)
        if end_to_end and sites:
            with report.timed("end_to_end"):
                traced = _trace(model)
                record, moved = _choose_end_to_end(gm, model, example_inputs, sites, traced=traced)
            _record_end_to_end(report, rows, sites, record, moved)
            if record["chosen"] == _E2E_TRACED:
                gm = traced
            elif record["chosen"] == _E2E_EAGER:
                gm = _shallow_copy(model)
            if cuda_graphs:
                with report.timed("graphs"):
                    gm = _graph_if_faster(gm, model, example_inputs, report)
    if cuda_graphs and not isinstance(gm, CUDAGraphed) and not (report.end_to_end or {}).get("graphs"):
        report.notes.append("cuda_graphs: not tried (it needs the end-to-end check: a tuned model on CUDA with "
                            "end_to_end=True)")
    gm.pycutlass_report = report
    return gm


def report(model: nn.Module) -> OptimizeReport:
    """The :class:`OptimizeReport` of a model ``optimize`` (or ``load``) returned."""
    found = getattr(model, "pycutlass_report", None)
    if not isinstance(found, OptimizeReport):
        raise ArgumentError(f"{type(model).__name__} has no pycutlass report: pass a model returned by "
                            "pycutlass.torch.optimize or pycutlass.torch.load")
    return found
