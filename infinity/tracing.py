"""OpenTelemetry traces over OTLP/HTTP (the `otel` extra): one server span per request, child of the caller's
`traceparent`, with child spans for tokenization, queue, inference and post-processing. The children carry the
durations the core measured (the x-*-time headers), laid end to end so that post-processing ends when the answer
starts; reading and checking the body come before them. Nothing here is imported unless tracing is on."""
from __future__ import annotations

import time
from typing import Any
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from infinity.logs import timings
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
    """ASGI middleware exporting a span per HTTP request."""

    def __init__(self, app: ASGIApp, endpoint: str, service_name: str = "infinity") -> None:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
            from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
        except ImportError:
            raise StartupError("tracing needs the otel extra: pip install 'infinity-multiverse[otel]'") from None
        self.app = app
        # Resource.create also reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES, as the SDK does everywhere
        self.provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
        self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=traces_url(endpoint))))
        self.tracer = self.provider.get_tracer("infinity")
        self.propagator = TraceContextTextMapPropagator()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        from opentelemetry import trace
        from opentelemetry.trace import SpanKind, StatusCode

        carrier = {name.decode("latin-1"): value.decode("latin-1") for name, value in scope["headers"]}
        span = self.tracer.start_span(f"{scope['method']} {scope['path']}", context=self.propagator.extract(carrier),
                                      kind=SpanKind.SERVER, start_time=time.time_ns(),
                                      attributes={"http.request.method": scope["method"], "url.path": scope["path"]})
        answer: dict[str, Any] = {"status": 500, "measured": {}, "at": 0}

        async def watched_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                answer.update(status=message["status"], measured=timings(list(message.get("headers", []))),
                              at=time.time_ns())
            await send(message)

        try:
            await self.app(scope, receive, watched_send)
        finally:
            inside = trace.set_span_in_context(span)
            for name, start, end in stages(answer["measured"], answer["at"]):
                self.tracer.start_span(name, context=inside, start_time=start).end(end_time=end)
            span.set_attribute("http.response.status_code", answer["status"])
            if answer["status"] >= 500:
                span.set_status(StatusCode.ERROR)
            span.end(end_time=time.time_ns())
