"""Keeping an optimized model: ``save`` writes it with the dispatch's tuning decisions and its report, ``load`` reads
both back, so a new process does not tune again."""
from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn as nn

from ..errors import ArgumentError
from .optimize_report import OptimizeReport


MODEL_FILE = "model.pt"
STATE_FILE = "pycutlass-torch.json"
_FORMAT_VERSION = 1


def _dispatch(dispatch):
    if dispatch is not None:
        return dispatch
    from .dispatch import Dispatch

    return Dispatch.current()


def save(model: nn.Module, directory, *, dispatch=None) -> Path:
    """Writes ``model.pt`` (the whole optimized model) and ``pycutlass-torch.json`` (the dispatch's tuning decisions
    and the report) into ``directory``; returns the directory."""
    if not isinstance(model, nn.Module):
        raise ArgumentError(f"save takes the torch.nn.Module optimize returned, got {type(model).__name__}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    found = getattr(model, "pycutlass_report", None)
    state = {"format": "pycutlass-torch", "version": _FORMAT_VERSION,
             "dispatch": _dispatch(dispatch).export_state(),
             "report": found.to_dict() if isinstance(found, OptimizeReport) else None}
    text = json.dumps(state, indent=1)  # before writing anything: a state that is not JSON fails here
    torch.save(model, directory / MODEL_FILE)
    (directory / STATE_FILE).write_text(text)
    return directory


def load(directory, map_location=None, *, dispatch=None) -> nn.Module:
    """The model ``save`` wrote, with its tuning decisions given to the dispatch (default: the current session's),
    so this process does not tune again."""
    directory = Path(directory)
    missing = [name for name in (MODEL_FILE, STATE_FILE) if not (directory / name).is_file()]
    if missing:
        raise ArgumentError(f"{directory} lacks {', '.join(missing)}: load reads a directory written by "
                            f"pycutlass.torch.save ({MODEL_FILE} and {STATE_FILE})")
    state = json.loads((directory / STATE_FILE).read_text())
    if state.get("format") != "pycutlass-torch" or state.get("version") != _FORMAT_VERSION:
        raise ArgumentError(f"{directory / STATE_FILE} is not a pycutlass-torch state of version {_FORMAT_VERSION} "
                            f"(format {state.get('format')!r}, version {state.get('version')!r})")
    # weights_only=False: the file holds a whole GraphModule (code and module classes), not only tensors.
    model = torch.load(directory / MODEL_FILE, map_location=map_location, weights_only=False)
    _dispatch(dispatch).import_state(state["dispatch"])
    if not isinstance(getattr(model, "pycutlass_report", None), OptimizeReport) and state.get("report"):
        model.pycutlass_report = OptimizeReport.from_dict(state["report"])
    return model
