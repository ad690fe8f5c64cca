"""Stand-ins shared by the tuning tests and shipped to their worker processes: a benchmark worker that answers like
the real one without a GPU (faults or hangs on the tiles named in FAKE_WORKER_MARKERS, times the rest from a
formula), and a GEMM that is valid as a description but does not compile."""
from __future__ import annotations

import os
import signal
import time



def broken_gemm():
    """A valid description whose source fails to compile (a configuration CUTLASS would reject late)."""
    import inspect
    from pathlib import Path

    import pycutlass as cutlass
    from pycutlass.emit.emitter import render
    from pycutlass.kinds.gemm.operation import GemmOperationUniversal

    folder = Path(inspect.getfile(GemmOperationUniversal)).parent

    class BrokenGemm(GemmOperationUniversal):
        def _signature(self):
            return (*super()._signature(), "broken")

        def render(self, template, **context):  # the templates live beside the real kind
            return render(folder / template, **context)

        def emit_body(self):
            return super().emit_body() + "\n#error deliberately broken for the compile-memo test\n"

    f16 = cutlass.float16
    math_inst = cutlass.MathInstruction([16, 8, 16], f16, f16, cutlass.float32, cutlass.OpClass.TensorOp,
                                        cutlass.MathOperation.multiply_add)
    tensor = cutlass.TensorDescription(f16, cutlass.RowMajor, 8)
    column = cutlass.TensorDescription(f16, cutlass.ColumnMajor, 8)
    return BrokenGemm(80, cutlass.TileDescription([64, 64, 32], 3, [2, 2, 1], math_inst), tensor, column, tensor,
                      cutlass.LinearCombination(f16, 8, cutlass.float32, cutlass.float32))


def fake_worker_main(conn, ordinal, session_options, config_json, bundle_path):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:
        message = conn.recv()
        if message is None:
            return
        if message[0] == "facts":
            uuid = os.environ.get("FAKE_WORKER_UUID", f"GPU-fake-{ordinal}")
            conn.send({"name": f"fake GPU {uuid}", "uuid": uuid, "compute_capability": 90, "host": "fake"})
            continue
        if message[0] == "adopt":
            conn.send({"adopted": message[1].name})
            continue
        if message[0] == "baseline":
            conn.send({"measurement": {"status": "ok", "seconds": 1e-4, "repetitions": 50}})
            continue
        _, operation, problem = message
        tile = operation.tile_description.threadblock_shape
        marker = os.environ.get("FAKE_WORKER_MARKERS", "")
        if f"fault:{tile[0]}x{tile[1]}" in marker:
            os._exit(3)  # what a CUDA fault looks like from outside: the process is gone
        if f"hang:{tile[0]}x{tile[1]}" in marker:
            time.sleep(3600)
        time.sleep(float(os.environ.get("FAKE_WORKER_DELAY", "0")))
        seconds = 1e-6 * (problem["m"] * problem["n"] * problem["k"]) ** (1 / 3) / tile[0] * 64
        conn.send({"measurement": {"status": "ok", "seconds": seconds, "seconds_min": seconds * 0.98,
                                   "seconds_iqr": seconds * 0.01, "repetitions": 50, "rel_error": 1e-4},
                   "resources": {"registers": tile[0], "threads": 128}})
