"""How the server runs (never what the model is: that lives in the artifact's manifest)."""
from __future__ import annotations

from dataclasses import dataclass

LOG_LEVELS = ("debug", "info", "warning", "error")
# Long enough to bridge the gaps between one run's operators, short enough that workers do not spin through the
# event loop's turn between batches: concurrency-16 throughput 1.02-1.11x ONNX Runtime's default at 8 tokens, and the
# same latency at concurrency 1
SPIN_WAIT_US = 50
# A request of at most this many padded tokens (rows x longest), while requests come one at a time, runs on the event
# loop: two thread wake-ups fewer (0.08 ms at concurrency 1 on 2 AVX2 cores), and a stall of the loop bounded by a
# short forward pass
LONE_REQUEST_TOKENS = 64


@dataclass(frozen=True)
class Settings:
    host: str = "127.0.0.1"
    port: int = 8080
    threads: int | None = None  # ONNX Runtime intra-op threads; None: physical cores
    spin_wait: bool = True  # ONNX Runtime workers busy-wait briefly for more work before they sleep
    spin_wait_us: int = SPIN_WAIT_US  # ... for this long
    lone_request_tokens: int = LONE_REQUEST_TOKENS  # a lone request this small runs on the event loop; 0: never
    max_batch_tokens: int = 16384  # padded tokens (rows x longest) per batch
    max_batch_size: int = 32  # rows per batch
    max_queue: int = 128  # requests waiting for the engine
    max_inputs_per_request: int = 32
    max_payload_bytes: int = 1_000_000
    tokenizer_workers: int = 2
    drain_timeout: float = 30.0
    retry_after: int = 1
    max_header_bytes: int = 16384  # request line and headers; more: 431
    max_connections: int = 1024  # open client connections; more: 503 and close
    header_timeout: float = 10.0  # seconds for a request's headers to arrive
    body_timeout: float = 30.0  # seconds for a request's body to arrive once its headers have
    keep_alive_timeout: float = 5.0  # seconds an idle connection stays open between requests
    allow_cpu_mismatch: bool = False
    allow_failed_parity: bool = False
    log_level: str = "info"
    access_log: bool = False
    api_keys: tuple[str, ...] = ()  # any of them opens the inference routes; none: no authentication
    public_metadata: bool = False  # /info, /metrics, /openapi.json and /v1/models open without a key
    json_logs: bool = False  # one JSON object per log line, and a request id and log line per request
    otlp_endpoint: str | None = None  # an OTLP/HTTP collector for traces; None: no tracing
    request_timeout: float = 0.0  # seconds an inference request may wait for the engine; 0: no limit
    vertex_predict_route: str = "/vertex/predict"  # Vertex AI sets these through AIP_PREDICT_ROUTE ...
    vertex_health_route: str = "/vertex/health"  # ... and AIP_HEALTH_ROUTE
    served_model_name: str | None = None  # the model's name in every answer; None: the manifest's hub id
    default_prompt_name: str | None = None  # the prompt for requests that name none; None: the model's default

    def __post_init__(self) -> None:
        for name in ("max_batch_tokens", "max_batch_size", "max_queue", "max_inputs_per_request",
                     "max_payload_bytes", "tokenizer_workers", "retry_after", "spin_wait_us"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if not 0 <= self.port <= 65535:
            raise ValueError("port must be between 0 and 65535")
        if self.spin_wait_us > 1_000_000:
            raise ValueError("spin_wait_us must be at most 1000000 (one second)")
        if self.lone_request_tokens < 0:
            raise ValueError("lone_request_tokens must not be negative")
        if self.threads is not None and self.threads < 1:
            raise ValueError("threads must be at least 1")
        if self.drain_timeout < 0:
            raise ValueError("drain_timeout must not be negative")
        for name in ("header_timeout", "body_timeout", "keep_alive_timeout"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be more than 0")
        if self.max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        if self.max_header_bytes < 1024:
            raise ValueError("max_header_bytes must be at least 1024")
        if self.max_inputs_per_request > self.max_batch_size:
            # a request is never split across batches
            raise ValueError("max_inputs_per_request must not exceed max_batch_size")
        if any(not key or key != key.strip() or any(c in key for c in ", \n") for key in self.api_keys):
            raise ValueError("an API key must be non-empty, without spaces, commas or surrounding blanks")
        if self.request_timeout < 0:
            raise ValueError("request_timeout must not be negative")
        for name in ("vertex_predict_route", "vertex_health_route"):
            if not getattr(self, name).startswith("/"):
                raise ValueError(f"{name} must start with /")
        for name in ("served_model_name", "default_prompt_name"):
            value = getattr(self, name)
            if value is not None and (not value.strip() or value != value.strip()):
                raise ValueError(f"{name} must be non-empty, without surrounding blanks")
        if self.log_level not in LOG_LEVELS:
            raise ValueError(f"log_level must be one of {', '.join(LOG_LEVELS)}")
