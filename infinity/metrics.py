"""Prometheus metrics, one registry per service: histograms per stage, batch shape, queue depth, answers and
failures by route (a route's path from the route table, never a raw path), and the process's own figures."""
from __future__ import annotations

from collections.abc import Callable, Sequence

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)

from infinity.errors import ErrorType

SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
ROWS = (1, 2, 4, 8, 16, 32, 64, 128)
TOKENS = (16, 64, 256, 1024, 4096, 16384, 65536)
CONTENT_TYPE = CONTENT_TYPE_LATEST

disable_created_metrics()  # type: ignore[no-untyped-call]  # no *_created series: a scrape carries the values alone


class Metrics:
    def __init__(self, queue_depth: Callable[[], float]) -> None:
        self.registry = registry = CollectorRegistry()
        ProcessCollector(registry=registry)
        self.request = Histogram("infinity_request_duration_seconds", "Time from body received to response ready.",
                                 ("route",), buckets=SECONDS, registry=registry)
        self.tokenization = Histogram("infinity_tokenization_duration_seconds", "Tokenization time per request.",
                                      buckets=SECONDS, registry=registry)
        self.queue = Histogram("infinity_queue_duration_seconds", "Time a request waited for its batch.",
                               buckets=SECONDS, registry=registry)
        self.inference = Histogram("infinity_inference_duration_seconds", "Model time per batch.", buckets=SECONDS,
                                   registry=registry)
        self.batch_size = Histogram("infinity_batch_size", "Rows per batch.", buckets=ROWS, registry=registry)
        self.batch_tokens = Histogram("infinity_batch_tokens", "Padded tokens (rows x longest) per batch.",
                                      buckets=TOKENS, registry=registry)
        self.padded_tokens = Counter("infinity_padded_tokens", "Tokens the engine ran, padding included (rows x "
                                     "longest of each batch); over infinity_real_tokens: the padding's share.",
                                     registry=registry)
        self.real_tokens = Counter("infinity_real_tokens", "The inputs' own tokens the engine ran.", registry=registry)
        self.requests = Counter("infinity_requests", "Inference requests by route and HTTP status (a gRPC method: "
                                "its status code's name).", ("route", "status"), registry=registry)
        self.failures = Counter("infinity_failures", "Failed requests by route and error type.",
                                ("route", "error_type"), registry=registry)
        self.rejected = Counter("infinity_socket_refusals",
                                "Answered on the socket without the app: header_too_large (431), timeout (408), "
                                "bad_request (400, 501, 505), too_many_connections (503); idle_evicted: an idle "
                                "connection closed to make room.", ("reason",), registry=registry)
        self.depth = Gauge("infinity_queue_depth", "Requests waiting for the engine.", registry=registry)
        self.depth.set_function(queue_depth)
        self.target = Info("infinity_target", "The hardware target served; bundle: the targets of the bundle it was "
                           "chosen from, best first (empty: a single-target artifact).", registry=registry)

    def serving(self, target: str, bundle: Sequence[str] = ()) -> None:
        self.target.info({"target": target, "bundle": ",".join(bundle)})

    def answered(self, route: str, status: int | str) -> None:
        self.requests.labels(route, str(status)).inc()

    def failed(self, route: str, kind: ErrorType, status: int | str | None = None) -> None:
        """An error answer: its type, and its status where the route's family changes the table's."""
        self.failures.labels(route, kind.value).inc()
        self.answered(route, kind.status if status is None else status)

    def refused(self, route: str) -> None:
        """A 429 given on the socket (the handler's refusals are counted by its failure path)."""
        self.failed(route, ErrorType.OVERLOADED)

    def count_rejection(self, reason: str) -> None:
        self.rejected.labels(reason).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
