"""Resources vs performance: which kernel resource predicts time, per problem class.

Times are normalized per problem (time / best time of that problem) so problems of different sizes compare; the
Spearman rank correlation of each resource with that ratio is reported per problem class (by default the M bucket:
small-M, decode-like problems and large ones favour different kernels).
"""
from __future__ import annotations

import math

from .db import ResultsDB

RESOURCES = ("registers", "local_bytes", "static_smem", "dynamic_smem", "threads", "max_active_blocks", "occupancy")


def m_class(problem_spec: dict) -> str:
    m = problem_spec.get("m")
    if m is None:
        return problem_spec.get("kind", "other")
    return "M<=64" if m <= 64 else "M<=512" if m <= 512 else "M>512"


def resource_points(db: ResultsDB, *, device: str | None = None, classify=m_class) -> list[dict]:
    """One dict per (kernel, problem) timing with the kernel's resources, its normalized time and problem class."""
    import json

    sql = ("select r.kernel, r.problem, r.device, r.seconds, p.spec, s.* from runs r "
           "join resources s on s.kernel = r.kernel and s.device = r.device "
           "join problems p on p.key = r.problem where r.status = 'ok'")
    args = []
    if device is not None:
        sql += " and r.device = ?"
        args.append(device)
    rows = db.query(sql, args)
    best: dict[tuple, float] = {}
    for row in rows:
        key = (row["problem"], row["device"])
        best[key] = min(best.get(key, math.inf), row["seconds"])
    points = []
    for row in rows:
        point = {name: row.get(name) for name in RESOURCES}
        point.update(kernel=row["kernel"], problem=row["problem"], seconds=row["seconds"],
                     ratio=row["seconds"] / best[(row["problem"], row["device"])],
                     problem_class=classify(json.loads(row["spec"])))
        points.append(point)
    return points


def correlation_report(points: list[dict]) -> list[dict]:
    """Spearman rank correlation of each resource with the normalized time, per problem class (and over all)."""
    from scipy.stats import spearmanr

    groups: dict[str, list[dict]] = {"all": points}
    for point in points:
        groups.setdefault(point["problem_class"], []).append(point)
    report = []
    for group, members in groups.items():
        for resource in RESOURCES:
            pairs = [(p[resource], p["ratio"]) for p in members if p.get(resource) is not None]
            if len(pairs) < 3 or len({x for x, _ in pairs}) < 2:
                continue
            result = spearmanr([x for x, _ in pairs], [y for _, y in pairs])
            rho = float(result.statistic if hasattr(result, "statistic") else result[0])
            report.append({"class": group, "resource": resource, "spearman": rho, "n": len(pairs),
                           "p_value": float(result.pvalue)})
    report.sort(key=lambda r: (r["class"] != "all", r["class"], -abs(r["spearman"]) if not math.isnan(
        r["spearman"]) else 0))
    return report
