"""Prometheus text exposition, by hand: histograms per stage, batch shape, queue depth, failures."""
from __future__ import annotations

import bisect
import threading
from typing import Callable

SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
ROWS = (1, 2, 4, 8, 16, 32, 64, 128)
TOKENS = (16, 64, 256, 1024, 4096, 16384, 65536)


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


class Histogram:
    """A histogram, optionally one series per value of one label (e.g. route)."""

    def __init__(self, name: str, help: str, buckets: tuple[float, ...], label: str | None = None) -> None:
        self.name, self.help, self.buckets, self.label = name, help, buckets, label
        self._series: dict[str, tuple[list[int], list[float]]] = {}
        self._lock = threading.Lock()

    def observe(self, value: float, label_value: str = "") -> None:
        with self._lock:
            counts, total = self._series.setdefault(label_value, ([0] * (len(self.buckets) + 1), [0.0]))
            counts[bisect.bisect_left(self.buckets, value)] += 1
            total[0] += value

    def render(self) -> list[str]:
        with self._lock:
            series = {key: (list(counts), total[0]) for key, (counts, total) in sorted(self._series.items())}
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        for key, (counts, total) in (series or {"": ([0] * (len(self.buckets) + 1), 0.0)}).items():
            tag = f'{self.label}="{key}",' if self.label else ""
            plain = f"{{{tag[:-1]}}}" if tag else ""
            cumulative = 0
            for bound, count in zip(self.buckets, counts):
                cumulative += count
                lines.append(f'{self.name}_bucket{{{tag}le="{_number(bound)}"}} {cumulative}')
            cumulative += counts[-1]
            lines += [f'{self.name}_bucket{{{tag}le="+Inf"}} {cumulative}', f"{self.name}_sum{plain} {total!r}",
                      f"{self.name}_count{plain} {cumulative}"]
        return lines


class Counter:
    def __init__(self, name: str, help: str, labels: tuple[str, ...]) -> None:
        self.name, self.help, self.labels = name, help, labels
        self._values: dict[tuple[str, ...], int] = {}
        self._lock = threading.Lock()

    def inc(self, *label_values: str) -> None:
        with self._lock:
            self._values[label_values] = self._values.get(label_values, 0) + 1

    def render(self) -> list[str]:
        with self._lock:
            values = sorted(self._values.items())
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} counter"]
        for key, value in values:
            tags = ",".join(f'{label}="{item}"' for label, item in zip(self.labels, key))
            lines.append(f"{self.name}{{{tags}}} {value}")
        return lines


class Gauge:
    def __init__(self, name: str, help: str, read: Callable[[], float]) -> None:
        self.name, self.help, self.read = name, help, read

    def render(self) -> list[str]:
        return [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} gauge", f"{self.name} {_number(self.read())}"]


class Metrics:
    def __init__(self, queue_depth: Callable[[], float]) -> None:
        self.request = Histogram("infinity_request_duration_seconds", "Time from body received to response ready.",
                                 SECONDS, label="route")
        self.tokenization = Histogram("infinity_tokenization_duration_seconds", "Tokenization time per request.", SECONDS)
        self.queue = Histogram("infinity_queue_duration_seconds", "Time a request waited for its batch.", SECONDS)
        self.inference = Histogram("infinity_inference_duration_seconds", "Model time per batch.", SECONDS)
        self.batch_size = Histogram("infinity_batch_size", "Rows per batch.", ROWS)
        self.batch_tokens = Histogram("infinity_batch_tokens", "Padded tokens (rows x longest) per batch.", TOKENS)
        self.requests = Counter("infinity_requests_total", "Inference requests by route and HTTP status.",
                                ("route", "status"))
        self.failures = Counter("infinity_failures_total", "Failed requests by route and error type.",
                                ("route", "error_type"))
        self.rejected = Counter("infinity_socket_refusals_total",
                                "Answered on the socket without the app: header_too_large (431), timeout (408), "
                                "too_many_connections (503); idle_evicted: an idle connection closed to make room.",
                                ("reason",))
        self.depth = Gauge("infinity_queue_depth", "Requests waiting for the engine.", queue_depth)

    def refused(self, route: str) -> None:
        """A 429 given on the socket (the handler's refusals are counted by its failure path)."""
        self.failures.inc(route, "overloaded")
        self.requests.inc(route, "429")

    def render(self) -> str:
        parts = (self.request, self.tokenization, self.queue, self.inference, self.batch_size, self.batch_tokens,
                 self.requests, self.failures, self.rejected, self.depth)
        return "\n".join(line for part in parts for line in part.render()) + "\n"
