"""tools/compile_trace.py's summary on a small hand-made trace: event parsing, nesting and self times."""
from __future__ import annotations

import json
import sys
from pathlib import Path

TOOLS = Path(__file__).resolve().parents[2] / "tools"
sys.path.insert(0, str(TOOLS))

import compile_trace  # noqa: E402


def _event(name, detail, ts, dur):
    return {"args": {"detail": detail}, "dur": dur, "name": name, "ph": "X", "pid": 0, "tid": 0, "ts": ts}


def _write(tmp_path, events):
    path = tmp_path / "trace.json"
    # NVRTC writes the events without spaces; json.dumps with these separators does the same
    path.write_text(json.dumps({"traceEvents": [{}, *events]}, separators=(",", ":")))
    return str(path)


def test_self_times_subtract_children_and_templates_lose_their_arguments(tmp_path, capsys):
    kernel = 'K::operator() [K<int, "x">::operator()()]'  # NVRTC escapes such quotes; the reader unescapes them
    trace = _write(tmp_path, [
        _event("Instantiating Template Function", kernel, 100, 1000),
        _event("Instantiating Template Function", "E::store [E<A>::store()]", 150, 600),
        _event("Instantiating Template Class", "cuda::std::tuple_element [tuple_element<0, T>]", 200, 250),
        _event("Instantiating Template Class", "cuda::std::tuple_element [tuple_element<1, T>]", 500, 150),
        _event("Instantiating Template Function", "M::mma [M<B>::mma()]", 800, 200),
        _event("CUDA C++ Front-End", "", 0, 2000),
    ])
    events = compile_trace.read_events(trace)
    assert [e[2] for e in events][0] == "CUDA C++ Front-End" and len(events) == 6
    parents, self_times = compile_trace.nesting(events)
    by_detail = {e[3]: (p, own) for e, p, own in zip(events, parents, self_times)}
    assert by_detail["E::store [E<A>::store()]"][1] == 600 - 250 - 150
    assert by_detail['K::operator() [K<int, "x">::operator()()]'][1] == 1000 - 600 - 200
    assert by_detail[""][1] == 2000 - 1000
    assert compile_trace.template_of("cuda::std::tuple_element [tuple_element<0, T>]") == "cuda::std::tuple_element"

    compile_trace.summarize(events, "K::operator()")
    out = capsys.readouterr().out
    assert "0.00 s       2  cuda::std::tuple_element" in out  # 400 us over two instantiations
    assert "instantiations directly under K::operator() (0.00 s)" in out
    under = out.split("instantiations directly under")[1]
    assert under.index("E::store") < under.index("M::mma")  # 600 us before 200 us
    assert "tuple_element" not in under  # grandchildren are not direct children
