"""A stand-in for the GPU benchmark worker (spawned by tests of the sweep runner): it answers like the real one,
faults (exits) on kernels named in FAULT, hangs on HANG, and times everything else from a formula."""
from __future__ import annotations

import os
import signal
import time



def fake_worker_main(conn, ordinal, session_options, config_json, bundle_path):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:
        message = conn.recv()
        if message is None:
            return
        if message[0] == "facts":
            conn.send({"name": f"fake GPU {ordinal}", "uuid": f"GPU-fake-{ordinal}", "compute_capability": 90})
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
