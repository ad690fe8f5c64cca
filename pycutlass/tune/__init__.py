"""Sweeps, autotuning and kernel selection.

Light to import: the heavy parts (scipy for selection, matplotlib for plots, CUDA for timing) load when used.

- ``space``     SearchSpace: a declarative grid over descriptions, pruned by their own validation
- ``problems``  problem sets: squares, ranges, lists, LLM layer shapes, ResNet-50 convs, grouped lists
- ``db``        ResultsDB: the SQLite results database (devices, kernels, problems, runs, compile status, tuning)
- ``sweep``     compile a space (parallel, with a compile-status memo) and benchmark it over problems
- ``bench``     the timing harness (warm-up, CUDA events, L2 flush, graphs, argument pools, verification)
- ``rank``      rank(): a space ordered for a problem before compiling (GPU-free model; what cannot win)
- ``autotune``  autotune(), key policies and the ``Tuned`` dispatcher (compiling the ranked top K)
- ``select``    select_kernels(): the minimum kernel set at an efficiency threshold, Pareto curve, dispatch tables
- ``plots``     heatmaps, ratio bars, Pareto and resource plots
- ``bundle``    compile here, run there
"""
