"""OpenTelemetry traces over OTLP/HTTP (the `otel` extra): one server span per request, child of the caller's
`traceparent`, with child spans for tokenization, queue, inference and post-processing. The children carry the
durations the core measured (the x-*-time headers), laid end to end so that post-processing ends when the answer
starts; reading and checking the body come before them. Nothing here is imported unless tracing is on."""
from __future__ import annotations

import time
from typing import Any
from urllib.parse import urlsplit

from infinity.preflight import StartupError

STAGES = (("tokenization", "tokenization_ms"), ("queue", "queue_ms"), ("inference", "inference_ms"),
          ("post-processing", "postprocess_ms"))
TRACES_PATH = "/v1/traces"


def traces_url(endpoint: str) -> str:
    """A collector's base URL gets the OTLP/HTTP traces path; a URL with a path is used as it is."""
    return endpoint.rstrip("/") + TRACES_PATH if urlsplit(endpoint).path in ("", "/") else endpoint


def stages(measured: dict[str, float], answered_ns: int) -> list[tuple[str, int, int]]:
    """(name, start, end) in ns of each stage the answer's headers measured, the last ending at answered_ns."""
    if "inference_ms" not in measured:
        return []
    measured = {**measured, "postprocess_ms": max(0.0, measured["compute_ms"] - measured["tokenization_ms"]
                                                  - measured["inference_ms"])}
    spans, end = [], answered_ns
    for name, field in reversed(STAGES):
        start = end - int(measured[field] * 1e6)
        spans.append((name, start, end))
        end = start
    return spans[::-1]


class Tracing:
    """A span per HTTP request, exported over OTLP/HTTP in the background."""

    def __init__(self, endpoint: str, service_name: str = "infinity") -> None:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
            from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
        except ImportError:
            raise StartupError("tracing needs the otel extra: pip install 'infinity-multiverse[otel]'") from None
        # Resource.create also reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES, as the SDK does everywhere
        self.provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
        self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=traces_url(endpoint))))
        self.tracer = self.provider.get_tracer("infinity")
        self.propagator = TraceContextTextMapPropagator()

    def start(self, method: str, path: str, traceparent: str | None, tracestate: str | None) -> Any:
        """The request's server span, child of the caller's trace where its headers name one."""
        from opentelemetry.trace import SpanKind

        carrier = {name: value for name, value in (("traceparent", traceparent), ("tracestate", tracestate))
                   if value is not None}
        return self.tracer.start_span(f"{method} {path}", context=self.propagator.extract(carrier),
                                      kind=SpanKind.SERVER, start_time=time.time_ns(),
                                      attributes={"http.request.method": method, "url.path": path})

    def finish(self, span: Any, status: int, measured: dict[str, float]) -> None:
        """Ends the span as the answer starts, with a child span per stage the answer's headers measured."""
        from opentelemetry import trace
        from opentelemetry.trace import StatusCode

        answered = time.time_ns()
        inside = trace.set_span_in_context(span)
        for name, start, end in stages(measured, answered):
            self.tracer.start_span(name, context=inside, start_time=start).end(end_time=end)
        span.set_attribute("http.response.status_code", status)
        if status >= 500:
            span.set_status(StatusCode.ERROR)
        span.end(end_time=answered)
