"""OpenTelemetry traces over OTLP/HTTP (the `otel` extra): one server span per request, child of the caller's
`traceparent`, with child spans for tokenization, queue, inference and post-processing. The children carry the
durations the core measured (the x-*-time headers), laid end to end so that post-processing ends when the answer
starts; reading and checking the body come before them. Nothing here is imported unless tracing is on.

The event loop only notes each answered request (a tuple on a deque); a thread of its own samples the notes,
encodes them as OTLP spans and posts them in batches. Made by the OpenTelemetry SDK, the five spans of a request
cost about 185 us of the event loop's time and its exporter 120 us more to encode them, a third of the server's
requests per second at concurrency 16; encoded here from the notes, about 12 us, off the loop. The SDK still reads
what it reads anywhere: the resource (OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES), the sampler
(OTEL_TRACES_SAMPLER, OTEL_TRACES_SAMPLER_ARG) and the caller's trace context."""
from __future__ import annotations

import atexit
import gzip
import logging
import os
import random
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from infinity.preflight import StartupError

SPANS_PER_REQUEST = 5  # the request and its four stages
TRACES_PATH = "/v1/traces"
RETRIED = (429, 502, 503, 504)  # statuses OTLP/HTTP says to retry
log = logging.getLogger("infinity.tracing")

Opened = tuple[str, str, "str | None", "str | None", int]  # method, path, traceparent, tracestate, start ns
Noted = tuple[Opened, int, dict[str, float], int]  # opened, status, measured, answered ns


def traces_url(endpoint: str) -> str:
    """A collector's base URL gets the OTLP/HTTP traces path; a URL with a path is used as it is."""
    return endpoint.rstrip("/") + TRACES_PATH if urlsplit(endpoint).path in ("", "/") else endpoint


def stages(measured: dict[str, float], answered_ns: int) -> list[tuple[str, int, int]]:
    """(name, start, end) in ns of each stage the answer's headers measured, the last ending at answered_ns."""
    if "inference_ms" not in measured:
        return []
    post = max(0.0, measured["compute_ms"] - measured["tokenization_ms"] - measured["inference_ms"])
    inference = answered_ns - int(post * 1e6)
    queue = inference - int(measured["inference_ms"] * 1e6)
    tokenization = queue - int(measured["queue_ms"] * 1e6)
    start = tokenization - int(measured["tokenization_ms"] * 1e6)
    return [("tokenization", start, tokenization), ("queue", tokenization, queue), ("inference", queue, inference),
            ("post-processing", inference, answered_ns)]


def whole(environ: Mapping[str, str], name: str, default: int) -> int:
    """A variable that must be a whole number, or `default` where it is unset or empty."""
    value = environ.get(name, "").strip()
    if not value:
        return default
    if not value.isdigit():
        raise StartupError(f"{name}={value} is not a whole number")
    return int(value)


@dataclass(frozen=True)
class Destination:
    """Where and how batches are posted, from OTLP/HTTP's variables (the traces-specific one first); the timeout
    in seconds, as OpenTelemetry's Python exporter reads it."""
    url: str
    headers: dict[str, str]
    timeout: float
    compressed: bool
    tls: ssl.SSLContext | None

    @classmethod
    def from_environ(cls, url: str, environ: Mapping[str, str]) -> Destination:
        from opentelemetry.util.re import parse_env_headers

        def variable(name: str) -> str:
            return environ.get(f"OTEL_EXPORTER_OTLP_TRACES_{name}") or environ.get(f"OTEL_EXPORTER_OTLP_{name}") or ""

        compression = variable("COMPRESSION").strip().lower() or "none"
        if compression not in ("none", "gzip"):
            raise StartupError(f"OTEL_EXPORTER_OTLP_COMPRESSION={compression} is not supported: use gzip or none")
        try:
            timeout = float(variable("TIMEOUT") or 10)
        except ValueError:
            raise StartupError(f"OTEL_EXPORTER_OTLP_TIMEOUT={variable('TIMEOUT')} is not a number of seconds") from None
        headers = {**parse_env_headers(variable("HEADERS"), liberal=True), "content-type": "application/x-protobuf"}
        if compression == "gzip":
            headers["content-encoding"] = "gzip"
        tls = None
        if url.startswith("https:"):
            tls = ssl.create_default_context(cafile=variable("CERTIFICATE") or None)
            if variable("CLIENT_CERTIFICATE"):
                tls.load_cert_chain(variable("CLIENT_CERTIFICATE"), variable("CLIENT_KEY") or None)
        return cls(url, headers, timeout, compression == "gzip", tls)

    def post(self, body: bytes, stopping: threading.Event) -> None:
        """One batch, retried with backoff while the collector is busy or away, within the timeout, until the
        server stops: a missing collector must not hold it up."""
        data = gzip.compress(body) if self.compressed else body
        deadline, wait = time.monotonic() + self.timeout, 0.5
        while True:
            try:
                request = urllib.request.Request(self.url, data, self.headers, method="POST")
                with urllib.request.urlopen(request, timeout=self.timeout, context=self.tls) as answer:
                    answer.read()
                return
            except (urllib.error.URLError, OSError) as error:
                status = error.code if isinstance(error, urllib.error.HTTPError) else None
                if status not in (*RETRIED, None) or time.monotonic() + wait > deadline or stopping.wait(wait):
                    raise
                wait *= 2


class Tracing:
    """A span per HTTP request, exported over OTLP/HTTP in the background: OTEL_BSP_SCHEDULE_DELAY (ms) between
    exports, OTEL_BSP_MAX_EXPORT_BATCH_SIZE and OTEL_BSP_MAX_QUEUE_SIZE in spans, five per request."""

    def __init__(self, endpoint: str, service_name: str = "infinity") -> None:
        try:
            from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope
            from opentelemetry.proto.resource.v1.resource_pb2 import Resource as ResourceProto
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
        except ImportError:
            raise StartupError("tracing needs the otel extra: pip install 'infinity-multiverse[otel]'") from None
        environ = os.environ  # as the SDK reads it, for the resource and the sampler
        self.destination = Destination.from_environ(traces_url(endpoint), environ)
        # OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES as the SDK reads them; our name where they give none
        resource = Resource.create()
        if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
            resource = resource.merge(Resource({"service.name": service_name}))
        self.resource = ResourceProto(attributes=[key_value(key, value) for key, value in resource.attributes.items()])
        self.scope = InstrumentationScope(name="infinity")
        self.sampler = TracerProvider(resource=resource, shutdown_on_exit=False).sampler
        self.propagator = TraceContextTextMapPropagator()
        self.delay = whole(environ, "OTEL_BSP_SCHEDULE_DELAY", 5000) / 1000
        self.batch = max(1, whole(environ, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512) // SPANS_PER_REQUEST)
        self.limit = max(1, whole(environ, "OTEL_BSP_MAX_QUEUE_SIZE", 2048) // SPANS_PER_REQUEST)
        self.enabled = environ.get("OTEL_SDK_DISABLED", "").strip().lower() != "true"
        self.noted: deque[Noted] = deque()
        self.described: dict[tuple[str, str, int], tuple[str, dict[str, str], list[Any]]] = {}
        self.dropped = 0
        self.wake, self.stopping = threading.Event(), threading.Event()
        self.worker = threading.Thread(target=self._export, name="otlp-export", daemon=True)
        self.worker.start()
        atexit.register(self.close)

    def start(self, method: str, path: str, traceparent: str | None, tracestate: str | None) -> Opened:
        """The request as it arrives; nothing is decided until it is answered."""
        return method, path, traceparent, tracestate, time.time_ns()

    def finish(self, opened: Opened, status: int, measured: dict[str, float]) -> None:
        """Noted as the answer starts; the export thread makes its spans."""
        if not self.enabled:
            return
        if len(self.noted) >= self.limit:
            self.dropped += 1
            return
        self.noted.append((opened, status, measured, time.time_ns()))
        if len(self.noted) >= self.batch:
            self.wake.set()

    def close(self) -> None:
        """Exports what is noted, then stops the thread."""
        self.stopping.set()
        self.wake.set()
        self.worker.join(self.destination.timeout + 1)

    def _export(self) -> None:
        while not self.stopping.is_set():
            self.wake.wait(self.delay)
            self.wake.clear()
            self._drain()
        self._drain()

    def _drain(self) -> None:
        while self.noted:
            taken = [self.noted.popleft() for _ in range(min(self.batch, len(self.noted)))]
            try:
                self.destination.post(self.encode(taken), self.stopping)
            except Exception as error:  # noqa: BLE001  the collector's trouble must never reach the requests
                log.warning("dropped %d spans: the collector at %s did not take them (%s)",
                            len(taken) * SPANS_PER_REQUEST, self.destination.url, error)
            if self.dropped:
                log.warning("dropped %d spans: more requests than OTEL_BSP_MAX_QUEUE_SIZE between exports",
                            self.dropped * SPANS_PER_REQUEST)
                self.dropped = 0

    def encode(self, taken: list[Noted]) -> bytes:
        """An OTLP ExportTraceServiceRequest of the sampled requests' spans."""
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
        from opentelemetry.proto.trace.v1.trace_pb2 import Span, SpanFlags, Status
        from opentelemetry.sdk.trace.sampling import Decision
        from opentelemetry.trace import INVALID_SPAN_CONTEXT, SpanKind, get_current_span

        request = ExportTraceServiceRequest()
        spans = request.resource_spans.add(resource=self.resource).scope_spans.add(scope=self.scope).spans
        local, remote = (SpanFlags.SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK,
                         SpanFlags.SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK | SpanFlags.SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK)
        for (method, path, traceparent, tracestate, started), status, measured, answered in taken:
            name, attributes, encoded = self._described(method, path, status)
            context, parent = None, INVALID_SPAN_CONTEXT
            if traceparent:
                carrier = {"traceparent": traceparent} if tracestate is None else \
                    {"traceparent": traceparent, "tracestate": tracestate}
                context = self.propagator.extract(carrier)
                parent = get_current_span(context).get_span_context()
            trace_id = parent.trace_id if parent.is_valid else random.getrandbits(128)
            sampled = self.sampler.should_sample(context, trace_id, name, SpanKind.SERVER, attributes)
            if sampled.decision is not Decision.RECORD_AND_SAMPLE:
                continue
            trace, ids = trace_id.to_bytes(16, "big"), random.randbytes(8 * SPANS_PER_REQUEST)
            state = sampled.trace_state.to_header() if sampled.trace_state else ""
            server = spans.add(trace_id=trace, span_id=ids[:8], trace_state=state, name=name,
                               kind=Span.SPAN_KIND_SERVER, start_time_unix_nano=started,
                               end_time_unix_nano=answered, flags=remote if parent.is_valid else local)
            server.attributes.extend(encoded)
            if parent.is_valid:
                server.parent_span_id = parent.span_id.to_bytes(8, "big")
            if status >= 500:
                server.status.code = Status.STATUS_CODE_ERROR
            for i, (stage, start, end) in enumerate(stages(measured, answered), 1):
                spans.add(trace_id=trace, span_id=ids[8 * i:8 * i + 8], trace_state=state, parent_span_id=ids[:8],
                          name=stage, kind=Span.SPAN_KIND_INTERNAL, start_time_unix_nano=start,
                          end_time_unix_nano=end, flags=local)
        body: bytes = request.SerializeToString()
        return body

    def _described(self, method: str, path: str, status: int) -> tuple[str, dict[str, str], list[Any]]:
        """A server span's name, the attributes the sampler sees and all of them encoded; remembered for the
        routes' few answers (any path a client sends may come here: the memory is bounded)."""
        key = (method, path, status)
        described = self.described.get(key)
        if described is None:
            attributes = {"http.request.method": method, "url.path": path}
            described = (f"{method} {path}", attributes, [key_value(key, value) for key, value in
                                                          {**attributes, "http.response.status_code": status}.items()])
            if len(self.described) < 256:
                self.described[key] = described
        return described


def key_value(key: str, value: Any) -> Any:
    """An OTLP attribute: a string, bool, int, float or a sequence of them."""
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue

    def any_value(value: Any) -> AnyValue:
        if isinstance(value, bool):
            return AnyValue(bool_value=value)
        if isinstance(value, int):
            return AnyValue(int_value=value)
        if isinstance(value, float):
            return AnyValue(double_value=value)
        if isinstance(value, (list, tuple)):
            return AnyValue(array_value=ArrayValue(values=[any_value(item) for item in value]))
        return AnyValue(string_value=str(value))

    return KeyValue(key=key, value=any_value(value))
