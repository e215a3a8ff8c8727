"""How the server runs (never what the model is: that lives in the artifact's manifest)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeVar

LOG_LEVELS = ("debug", "info", "warning", "error")
OPENAI_TOKEN_IDS = ("cl100k_base", "model")
# Long enough to bridge the gaps between one run's operators, short enough that workers do not spin through the
# event loop's turn between batches: concurrency-16 throughput 1.02-1.11x ONNX Runtime's default at 8 tokens, and the
# same latency at concurrency 1
SPIN_WAIT_US = 50
# A request of at most this many padded tokens (rows x longest), while requests come one at a time, runs on the event
# loop: two thread wake-ups fewer (0.08 ms at concurrency 1 on 2 AVX2 cores), and a stall of the loop bounded by a
# short forward pass
LONE_REQUEST_TOKENS = 64

T = TypeVar("T")


def option(default: T, help: str) -> T:
    """A setting's default and its one help line (`infinity serve --help`)."""
    return field(default=default, metadata={"help": help})  # a Field, which the dataclass makes the default


@dataclass(frozen=True)
class Settings:
    host: str = option("127.0.0.1", "address to bind")
    port: int = option(8080, "port to bind")
    grpc_port: int | None = option(None, "also serve Text Embeddings Inference's gRPC services (tei.v1, with "
                                         "grpc.health.v1 and reflection) on this port, over the same batcher and "
                                         "limits (the grpc extra)")
    threads: int | None = option(None, "ONNX Runtime intra-op threads (default: physical cores)")
    engines: int = option(1, "batches run at once, side by side on one session, each on threads / engines of the "
                             "intra-op threads: more raises a bulk job's throughput (many batches queued) and "
                             "slows a request that runs alone")
    spin_wait: bool = option(True, "let ONNX Runtime's workers busy-wait briefly for more work before they sleep "
                                   "(lower latency on dedicated cores; turn off where the cores are shared, e.g. a "
                                   "sidecar)")
    spin_wait_us: int = option(SPIN_WAIT_US, "microseconds a worker busy-waits before it sleeps, with --spin-wait")
    lone_request_tokens: int = option(LONE_REQUEST_TOKENS, "while requests come one at a time, one of at most this "
                                                           "many padded tokens (rows x longest input) runs on the "
                                                           "event loop instead of the engine thread, saving two thread"
                                                           " wake-ups; 0: never")
    max_batch_tokens: int = option(16384, "padded tokens (rows x longest input) per batch")
    max_batch_size: int = option(32, "rows per batch")
    max_queue: int = option(128, "requests waiting for the engine before new ones get 429")
    max_inputs_per_request: int = option(512, "texts in one request; a request with more than max_batch_size is "
                                              "run as parts of at most that many, cut from its inputs sorted by "
                                              "length, queued together, and answered whole; more than this: 413")
    max_payload_bytes: int = option(1_000_000, "request body limit in bytes")
    chunk_long_inputs: bool = option(False, "run a text longer than the model's maximum length whole, in windows of "
                                            "that length, joined by its task's rule (the chunking field in "
                                            "/openapi.json says this model's; a request's chunking field overrides "
                                            "it)")
    chunk_overlap: int = option(0, "tokens each window repeats from the end of the one before it, with chunking")
    max_chunks_per_input: int = option(64, "windows one text may take with chunking; more is answered 413")
    tokenizer_workers: int = option(2, "threads that tokenize and post-process")
    drain_timeout: float = option(30.0, "seconds to finish in-flight requests after SIGTERM")
    retry_after: int = option(1, "seconds sent in Retry-After with 429; the refused connection is not read again "
                                 "before then")
    max_header_bytes: int = option(16384, "request line and headers in bytes; more is answered 431 without being "
                                          "parsed")
    max_connections: int = option(1024, "open client connections (lowered to fit the open-file limit); past it the "
                                        "longest-idle one is closed to make room, or, with none idle, the new one is "
                                        "answered 503 and closed")
    header_timeout: float = option(10.0, "seconds for a request's headers to arrive; later: 408 and close")
    body_timeout: float = option(30.0, "seconds for a request's body to arrive once its headers have; later: 408 and "
                                       "close")
    keep_alive_timeout: float = option(5.0, "seconds an idle connection stays open between requests")
    allow_cpu_mismatch: bool = option(False, "serve although this CPU lacks the target's required flags (a bundle "
                                             "none of whose targets fits: its first)")
    allow_failed_parity: bool = option(False, "serve an artifact whose parity check failed")
    log_level: str = option("info", "debug, info, warning or error")
    access_log: bool = option(False, "log every request")
    api_keys: tuple[str, ...] = ()  # any of them opens the inference routes; none: no authentication
    public_metadata: bool = option(False, "serve /info, /metrics, /openapi.json, /v1/models and KServe's /v2 metadata "
                                          "without an API key (health probes never need one)")
    json_logs: bool = option(False, "log one JSON object per line, and one line per request with its x-request-id, "
                                    "route, status and timings")
    otlp_endpoint: str | None = option(None, "export a trace span per request to this OTLP/HTTP collector, e.g. "
                                             "http://collector:4318 (needs the otel extra; "
                                             "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT set it"
                                             " too)")
    request_timeout: float = option(0.0, "seconds an inference request may take before it is answered 504; 0: no limit"
                                         " (60 under SageMaker)")
    vertex_predict_route: str = option("/vertex/predict", "route of Vertex AI's predict requests (Vertex sets "
                                                          "AIP_PREDICT_ROUTE)")
    vertex_health_route: str = option("/vertex/health", "route of Vertex AI's health checks (Vertex sets "
                                                        "AIP_HEALTH_ROUTE)")
    lambda_runtime_api: str | None = option(None, "AWS Lambda's Runtime API (host:port): take invocations from it, "
                                                   "each answered by this server as the HTTP request its event "
                                                   "describes (Lambda sets AWS_LAMBDA_RUNTIME_API)")
    served_model_name: str | None = option(None, "the model's name in /v1/models, /info and every answer (default: its"
                                                 " hub id from the manifest, else the directory name it was optimized "
                                                 "from)")
    openai_token_ids: str = option("cl100k_base", "what token-id arrays on /v1/embeddings are: cl100k_base, OpenAI's "
                                                  "tokens (what LangChain's OpenAIEmbeddings sends by default), "
                                                  "decoded and read as text; model, this model's own ids (/tokenize's),"
                                                  " run as given")
    default_prompt_name: str | None = option(None, "the model's prompt put before texts of requests that name none "
                                                   "(default: the model's own default prompt, if any)")

    def __post_init__(self) -> None:
        for name in ("max_batch_tokens", "max_batch_size", "max_queue", "max_inputs_per_request",
                     "max_payload_bytes", "tokenizer_workers", "retry_after", "spin_wait_us",
                     "max_chunks_per_input"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if not 0 <= self.port <= 65535:
            raise ValueError("port must be between 0 and 65535")
        if self.grpc_port is not None and not 0 < self.grpc_port <= 65535:
            raise ValueError("grpc_port must be between 1 and 65535")
        if self.spin_wait_us > 1_000_000:
            raise ValueError("spin_wait_us must be at most 1000000 (one second)")
        if self.chunk_overlap < 0:
            raise ValueError("chunk_overlap must not be negative")
        if self.lone_request_tokens < 0:
            raise ValueError("lone_request_tokens must not be negative")
        if self.threads is not None and self.threads < 1:
            raise ValueError("threads must be at least 1")
        if self.engines < 1:
            raise ValueError("engines must be at least 1")
        if self.threads is not None and self.engines > self.threads:
            raise ValueError(f"engines ({self.engines}) must be at most threads ({self.threads}): each runs on "
                             "threads / engines of them")
        if self.drain_timeout < 0:
            raise ValueError("drain_timeout must not be negative")
        for name in ("header_timeout", "body_timeout", "keep_alive_timeout"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be more than 0")
        if self.max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        if self.max_header_bytes < 1024:
            raise ValueError("max_header_bytes must be at least 1024")
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
        if self.openai_token_ids not in OPENAI_TOKEN_IDS:
            raise ValueError(f"openai_token_ids must be one of {', '.join(OPENAI_TOKEN_IDS)}")
        if self.log_level not in LOG_LEVELS:
            raise ValueError(f"log_level must be one of {', '.join(LOG_LEVELS)}")
