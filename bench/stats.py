"""Latency and throughput figures from raw samples."""
from __future__ import annotations

import math
import statistics


def percentile(samples: list[float], q: float) -> float:
    """Nearest-rank percentile, q in [0, 100]."""
    ordered = sorted(samples)
    rank = max(1, min(len(ordered), math.ceil(q / 100 * len(ordered))))
    return ordered[rank - 1]


def summarize(latencies_ms: list[float], wall_s: float, requests: int) -> dict[str, float]:
    if not latencies_ms:
        return {"requests": 0}
    return {
        "requests": requests,
        "throughput_rps": requests / wall_s if wall_s > 0 else 0.0,
        "min_ms": min(latencies_ms), "max_ms": max(latencies_ms), "avg_ms": statistics.fmean(latencies_ms),
        "p50_ms": percentile(latencies_ms, 50), "p90_ms": percentile(latencies_ms, 90),
        "p95_ms": percentile(latencies_ms, 95), "p99_ms": percentile(latencies_ms, 99),
    }
