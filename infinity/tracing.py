"""OpenTelemetry traces over OTLP/HTTP (the `otel` extra): one server span per request, child of the caller's
`traceparent`, with child spans for tokenization, queue, inference and post-processing. The children carry the
durations the core measured (the x-*-time headers), laid end to end so that post-processing ends when the answer
starts; reading and checking the body come before them. Nothing here is imported unless tracing is on.

The event loop only notes each answered request (a tuple on a deque); a thread of its own samples the notes,
encodes them as OTLP spans and posts them in batches. Made by the OpenTelemetry SDK, the five spans of a request
cost about 185 us of the event loop's time and its exporter 120 us more to encode them, a third of the server's
requests per second at concurrency 16; written here from the notes, about 4 us, off the loop. The SDK still reads
what it reads anywhere: the resource (OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES), the sampler
(OTEL_TRACES_SAMPLER, OTEL_TRACES_SAMPLER_ARG) and the caller's trace context."""
from __future__ import annotations

import atexit
import gzip
import http.client
import logging
import os
import random
import ssl
import struct
import threading
import time
import urllib.request
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from infinity.errors import StartupError

SPANS_PER_REQUEST = 5  # the request and its four stages
TRACES_PATH = "/v1/traces"
RETRIED = (429, 502, 503, 504)  # statuses OTLP/HTTP says to retry
log = logging.getLogger("infinity.tracing")

Opened = tuple[str, str, "str | None", "str | None", int]  # method, path, traceparent, tracestate, start ns
Noted = tuple[Opened, int, dict[str, float], int]  # opened, status, measured, answered ns

# protobuf's wire format for the few fields of OTLP's Span that vary (opentelemetry/proto/trace/v1/trace.proto)
# start_time_unix_nano (7) and end_time_unix_nano (8), fixed64, then flags (16), fixed32
TIMES_FLAGS = struct.Struct("<BQBQ2sI")
LOCAL, REMOTE = 0x100, 0x300  # SpanFlags: the context's remoteness known, and remote
INTERNAL, SERVER = 1, 2  # SpanKind
ERROR = b"\x7a\x02\x18\x02"  # status (15) with code (3) STATUS_CODE_ERROR


def varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7f:
        out.append(value & 0x7f | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def length_delimited(tag: int, payload: bytes) -> bytes:
    """A field of wire type 2; `tag` is its one-byte key (field number << 3 | 2)."""
    size = len(payload)
    return bytes((tag, size)) + payload if size < 0x80 else bytes((tag,)) + varint(size) + payload


def named(name: str, kind: int) -> bytes:
    """A span's name (5) and kind (6)."""
    return length_delimited(0x2a, name.encode()) + bytes((0x30, kind))


def span(ids: bytes, described: bytes, start: int, end: int, flags: int) -> bytes:
    """One entry of ScopeSpans.spans (2): its ids, what it shares with others of its kind, times and flags."""
    return length_delimited(0x12, ids + described + TIMES_FLAGS.pack(0x39, start, 0x41, end, b"\x85\x01", flags))


STAGES = {stage: named(stage, INTERNAL) for stage in ("tokenization", "queue", "inference", "post-processing")}


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


@dataclass
class Destination:
    """Where and how batches are posted, from OTLP/HTTP's variables (the traces-specific one first); the timeout
    in seconds, as OpenTelemetry's Python exporter reads it. Batches go over one kept connection (through the
    proxy that the usual *_PROXY variables name, if any), as the SDK's exporter sends them."""
    url: str
    headers: dict[str, str]
    timeout: float
    compressed: bool
    tls: ssl.SSLContext | None
    connection: http.client.HTTPConnection | None = field(default=None, repr=False, compare=False)
    target: str = field(default="", repr=False, compare=False)  # the request line's: the URL's path, or all of it

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
            status: int | None = None
            try:
                status = self._send(data)
                if status < 300:
                    return
                failure: Exception = Refused(status)
            except (OSError, http.client.HTTPException) as error:
                self.close()
                failure = error
            if status not in (*RETRIED, None) or time.monotonic() + wait > deadline or stopping.wait(wait):
                raise failure
            wait *= 2

    def close(self) -> None:
        if self.connection is not None:
            self.connection.close()
            self.connection = None

    def _send(self, data: bytes) -> int:
        """The collector's status for one batch; a kept connection that the collector closed while idle is opened
        again once."""
        if self.connection is not None:
            try:
                return self._exchange(self.connection, data)
            except ConnectionError:
                self.close()
        self.connection = self._connect()
        return self._exchange(self.connection, data)

    def _exchange(self, connection: http.client.HTTPConnection, data: bytes) -> int:
        connection.request("POST", self.target, data, self.headers)
        with connection.getresponse() as answer:
            answer.read()
            return answer.status

    def _connect(self) -> http.client.HTTPConnection:
        url = urlsplit(self.url)
        host = url.hostname or ""
        proxy = None if urllib.request.proxy_bypass(host) else urllib.request.getproxies().get(url.scheme)
        through = urlsplit(proxy if "://" in proxy else f"http://{proxy}") if proxy else url
        # a plain HTTP proxy is sent the whole URL; through a tunnel or straight, the path
        self.target = self.url if proxy and self.tls is None else url._replace(scheme="", netloc="").geturl() or "/"
        if self.tls is None:
            return http.client.HTTPConnection(through.hostname or "", through.port, timeout=self.timeout)
        connection = http.client.HTTPSConnection(through.hostname or "", through.port, timeout=self.timeout,
                                                 context=self.tls)
        if proxy:
            connection.set_tunnel(host, url.port)
        return connection


class Refused(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(f"it answered HTTP {status}")


class Tracing:
    """A span per HTTP request, exported over OTLP/HTTP in the background: OTEL_BSP_SCHEDULE_DELAY (ms) between
    exports, OTEL_BSP_MAX_EXPORT_BATCH_SIZE and OTEL_BSP_MAX_QUEUE_SIZE in spans, five per request."""

    def __init__(self, endpoint: str, service_name: str = "infinity") -> None:
        try:
            from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope
            from opentelemetry.proto.resource.v1.resource_pb2 import Resource as ResourceProto
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.sampling import ALWAYS_ON, DEFAULT_ON
            from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
        except ImportError:
            raise StartupError("tracing needs the otel extra: pip install 'infinity-multiverse[otel]'") from None
        environ = os.environ  # as the SDK reads it, for the resource and the sampler
        self.destination = Destination.from_environ(traces_url(endpoint), environ)
        # OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES as the SDK reads them; our name where they give none
        resource = Resource.create()
        if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
            resource = resource.merge(Resource({"service.name": service_name}))
        self.resource = length_delimited(0x0a, ResourceProto(attributes=[
            key_value(key, value) for key, value in resource.attributes.items()]).SerializeToString())
        self.scope = length_delimited(0x0a, InstrumentationScope(name="infinity").SerializeToString())
        self.sampler = TracerProvider(resource=resource, shutdown_on_exit=False).sampler
        self.roots_sampled = self.sampler in (ALWAYS_ON, DEFAULT_ON)  # asked nothing for a request without a parent
        self.propagator = TraceContextTextMapPropagator()
        self.delay = whole(environ, "OTEL_BSP_SCHEDULE_DELAY", 5000) / 1000
        self.batch = max(1, whole(environ, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512) // SPANS_PER_REQUEST)
        self.limit = max(1, whole(environ, "OTEL_BSP_MAX_QUEUE_SIZE", 2048) // SPANS_PER_REQUEST)
        self.enabled = environ.get("OTEL_SDK_DISABLED", "").strip().lower() != "true"
        self.noted: deque[Noted] = deque()
        self.described: dict[tuple[str, str, int], tuple[str, dict[str, str], bytes]] = {}
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
        self.destination.close()

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
        """An OTLP ExportTraceServiceRequest of the sampled requests' spans, written as protobuf's wire format
        directly: built as protobuf messages, a request's five spans took 12 us of the interpreter, here about 4."""
        from opentelemetry.sdk.trace.sampling import Decision
        from opentelemetry.trace import SpanKind, get_current_span

        spans = []
        for (method, path, traceparent, tracestate, started), status, measured, answered in taken:
            name, attributes, server = self._described(method, path, status)
            context, trace_id, parent, flags = None, random.getrandbits(128), b"", LOCAL
            if traceparent:
                carrier = {"traceparent": traceparent} if tracestate is None else \
                    {"traceparent": traceparent, "tracestate": tracestate}
                context = self.propagator.extract(carrier)
                remote = get_current_span(context).get_span_context()
                if remote.is_valid:
                    trace_id, parent, flags = remote.trace_id, b"\x22\x08" + remote.span_id.to_bytes(8, "big"), REMOTE
            head = b"\x0a\x10" + trace_id.to_bytes(16, "big")
            if context is not None or not self.roots_sampled:
                sampled = self.sampler.should_sample(context, trace_id, name, SpanKind.SERVER, attributes)
                if sampled.decision is not Decision.RECORD_AND_SAMPLE:
                    continue
                if sampled.trace_state:
                    head += length_delimited(0x1a, sampled.trace_state.to_header().encode())
            head += b"\x12\x08"  # each span's id follows
            ids = random.randbytes(8 * SPANS_PER_REQUEST)
            spans.append(span(head + ids[:8] + parent, server, started, answered, flags))
            child = b"\x22\x08" + ids[:8]
            for i, (stage, start, end) in enumerate(stages(measured, answered), 1):
                spans.append(span(head + ids[8 * i:8 * i + 8] + child, STAGES[stage], start, end, LOCAL))
        scope_spans = self.scope + b"".join(spans)
        return length_delimited(0x0a, self.resource + length_delimited(0x12, scope_spans))

    def _described(self, method: str, path: str, status: int) -> tuple[str, dict[str, str], bytes]:
        """A server span's name, the attributes the sampler sees, and its fields that are the same for every
        request with that answer, encoded; remembered for the routes' few answers (any path a client sends may
        come here: the memory is bounded)."""
        key = (method, path, status)
        described = self.described.get(key)
        if described is None:
            name, attributes = f"{method} {path}", {"http.request.method": method, "url.path": path}
            encoded = b"".join(length_delimited(0x4a, key_value(attribute, value).SerializeToString()) for
                               attribute, value in {**attributes, "http.response.status_code": status}.items())
            described = (name, attributes, named(name, SERVER) + encoded + (ERROR if status >= 500 else b""))
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
