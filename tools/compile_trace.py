"""Where an SM90 operation's NVRTC compile spends its time: compile one operation with ``--fdevice-time-trace`` and
summarize the trace by self time (each event's duration less its children's).

    python tools/compile_trace.py [--config 0] [--dtype f16] [--trace /tmp/pycutlass-trace.json] [--child NAME]

``--config`` picks a configuration of benchmarks/gemm_sm90.py's GRID. The trace of one operation is large (1.5 GB
for the f16 128x128x64 cooperative operation) and tracing slows the compile about threefold; ``--reuse`` summarizes
an existing trace without compiling. Prints: self time per event kind, self time of template instantiations by
template (arguments stripped), the outermost instantiations with their inclusive times, and the instantiations
directly under the one whose name contains ``--child`` (default: the kernel's ``GemmUniversal::operator()``).
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

# One complete event of NVRTC's chrome-trace output: {"args":{"detail"|"name":...},"dur":..,"name":..,...,"ts":..}
_EVENT = re.compile(r'\{"args":\{"(?:detail|name)":"((?:[^"\\]|\\.)*)"\},"dur":(\d+),"name":"([^"]+)",'
                    r'"ph":"X","pid":\d+,"tid":\d+,"ts":(\d+)\}')
_DETAIL_CHARS = 300  # enough to name a template; keeps a million events in memory


def compile_with_trace(config: int, dtype: str, trace: str) -> float:
    import gemm_sm90

    import pycutlass as cutlass
    from pycutlass.compiler.backends import NvrtcBackend

    element = {"f16": cutlass.float16, "bf16": cutlass.bfloat16}[dtype]
    op = gemm_sm90.make_op(element, gemm_sm90.GRID[config])
    start = time.perf_counter()
    # NVRTC appends ".json" to the name it is given
    NvrtcBackend(extra_flags=(f"--fdevice-time-trace={trace.removesuffix('.json')}",)).compile(op.emit(), "90a",
                                                                                                 op.name)
    print(f"compiled {op.name} with the trace in {time.perf_counter() - start:.1f} s")
    return time.perf_counter() - start


def read_events(trace: str) -> list[tuple[int, int, str, str]]:
    with open(trace) as f:
        text = f.read()
    events = [(int(m.group(4)), int(m.group(2)), m.group(3), m.group(1).replace('\\"', '"')[:_DETAIL_CHARS])
              for m in _EVENT.finditer(text)]
    events.sort(key=lambda e: (e[0], -e[1]))  # parents (earlier, longer) before their children
    return events


def nesting(events):
    """For each event, the index of its parent (or -1) and its self time."""
    parents, self_times, stack = [], [dur for _, dur, _, _ in events], []
    for i, (ts, dur, _, _) in enumerate(events):
        while stack and events[stack[-1]][0] + events[stack[-1]][1] <= ts:
            stack.pop()
        parent = stack[-1] if stack else -1
        if parent >= 0:
            self_times[parent] -= dur
        parents.append(parent)
        stack.append(i)
    return parents, self_times


def template_of(detail: str) -> str:
    """``name [name<arguments>...]`` (NVRTC's detail of an instantiation) -> ``name``."""
    return detail.split(" [")[0].split("<")[0].strip()


def summarize(events, child: str, top: int = 25) -> None:
    parents, self_times = nesting(events)
    by_kind, by_template, count = collections.Counter(), collections.Counter(), collections.Counter()
    for (_, _, name, detail), own in zip(events, self_times):
        by_kind[name] += own
        if name.startswith("Instantiating"):
            by_template[template_of(detail)] += own
            count[template_of(detail)] += 1
    print("\nself time by event kind")
    for name, us in by_kind.most_common(10):
        print(f"  {us / 1e6:8.2f} s  {name}")
    print(f"\nself time of instantiations by template (top {top})")
    for name, us in by_template.most_common(top):
        print(f"  {us / 1e6:8.2f} s  {count[name]:6d}  {name[:140]}")

    def instantiating_ancestor(i):
        p = parents[i]
        while p >= 0 and not events[p][2].startswith("Instantiating"):
            p = parents[p]
        return p

    outermost = collections.Counter()
    for i, (_, dur, name, detail) in enumerate(events):
        if name.startswith("Instantiating") and instantiating_ancestor(i) < 0:
            outermost[detail[:140]] += dur
    print(f"\noutermost instantiations, inclusive (top 10 of {sum(outermost.values()) / 1e6:.2f} s)")
    for name, us in outermost.most_common(10):
        print(f"  {us / 1e6:8.2f} s  {name}")

    roots = [i for i, e in enumerate(events) if e[2].startswith("Instantiating") and child in e[3]]
    if not roots:
        print(f"\nno instantiation names {child!r}")
        return
    root = max(roots, key=lambda i: events[i][1])
    under = collections.Counter()
    for i in range(root + 1, len(events)):
        if events[i][0] >= events[root][0] + events[root][1]:
            break
        if events[i][2].startswith("Instantiating") and instantiating_ancestor(i) == root:
            under[template_of(events[i][3])] += events[i][1]
    print(f"\ninstantiations directly under {template_of(events[root][3])} ({events[root][1] / 1e6:.2f} s), inclusive")
    for name, us in under.most_common(15):
        print(f"  {us / 1e6:8.2f} s  {name[:140]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=int, default=0, help="index into benchmarks/gemm_sm90.py's GRID")
    parser.add_argument("--dtype", choices=("f16", "bf16"), default="f16")
    parser.add_argument("--trace", default="/tmp/pycutlass-trace.json")
    parser.add_argument("--reuse", action="store_true", help="summarize --trace without compiling")
    parser.add_argument("--child", default="GemmUniversal::operator()")
    args = parser.parse_args()
    if not args.reuse:
        compile_with_trace(args.config, args.dtype, args.trace)
    summarize(read_events(args.trace), args.child)


if __name__ == "__main__":
    main()
