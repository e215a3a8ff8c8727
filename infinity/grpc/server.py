"""Text Embeddings Inference's gRPC services (tei.v1) beside HTTP, in the same process and event loop: each RPC's
message becomes the body of the TEI route that answers it over HTTP, and goes through the same admission, batcher
and operation (infinity.api.endpoint.compute), so its numbers are the route's, bit for bit. Streams start each
message as it arrives and answer in order: what arrives while the engine is busy is batched with everything else.
"""
from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from grpc_reflection.v1alpha import reflection

from infinity.api.auth import matches, presented_key
from infinity.api.endpoint import Answered, Endpoint, compute
from infinity.api.ops import served_name, version
from infinity.api.router import Router
from infinity.errors import ErrorType, InfinityError, TimedOut, TooLong, ValidationError

log = logging.getLogger("infinity.grpc")

PACKAGE = "tei.v1"
STREAM_WINDOW = 64  # messages of one stream in flight at once; the next is read as the first is answered
DIRECTIONS = ("right", "left")  # TruncationDirection's values, in its numbers' order
CODES = {400: grpc.StatusCode.INVALID_ARGUMENT, 401: grpc.StatusCode.UNAUTHENTICATED,
         404: grpc.StatusCode.UNIMPLEMENTED, 413: grpc.StatusCode.INVALID_ARGUMENT,
         422: grpc.StatusCode.INVALID_ARGUMENT, 429: grpc.StatusCode.RESOURCE_EXHAUSTED,
         503: grpc.StatusCode.UNAVAILABLE, 504: grpc.StatusCode.DEADLINE_EXCEEDED}
UNAUTHENTICATED = "a valid API key is required: send authorization: Bearer <key> metadata"


def _load() -> tuple[Any, Any]:
    """tei.proto's messages and services, made from the file at import (grpcio-tools' protoc, no generated code)."""
    here = str(Path(__file__).parent)
    sys.path.insert(0, here)
    try:
        return grpc.protos_and_services("tei.proto")  # type: ignore[no-any-return]
    finally:
        sys.path.remove(here)


pb, services = _load()


def _direction(message: Any) -> str:
    return DIRECTIONS[message.truncation_direction] if message.truncation_direction < len(DIRECTIONS) else "right"


def _floats(row: Any) -> list[float]:
    """A row as Python floats: protobuf reads a list of them 6x faster than an ndarray's elements."""
    return row.tolist() if hasattr(row, "tolist") else list(row)


def _optional(message: Any, *names: str) -> dict[str, Any]:
    return {name: getattr(message, name) for name in names if message.HasField(name)}


class Calls:
    """What every RPC shares: the router's routes and service, and one call's way from message to answer."""

    def __init__(self, router: Router) -> None:
        self.router, self.service = router, router.service
        self.task = router.service.model.task.name

    def endpoint(self, path: str, rpc: str) -> Endpoint:
        endpoint = self.router.inference.get(path)
        if endpoint is None:
            raise _NotServed(f"{PACKAGE}.{rpc} is not served: this server runs a {self.task} model")
        return endpoint

    async def answer(self, rpc: str, path: str, body: dict[str, Any], chars: int,
                     context: grpc.aio.ServicerContext) -> tuple[Any, Any]:
        """(the route's answer, the Metadata message) for one message; errors abort the call with their code."""
        started = time.perf_counter()
        endpoint = self.endpoint(path, rpc)
        remaining = context.time_remaining()
        if remaining is not None and remaining <= 0:
            raise TimedOut("the call's deadline passed before it was started")
        # never on the event loop: grpc's next messages wait unread while it is busy, and each would run alone
        work = compute(endpoint, self.service, body, chars, lone=False)
        answered: Answered | None = await (asyncio.wait_for(work, remaining) if remaining is not None else work)
        assert answered is not None  # no watch: the call's own cancellation stops it
        done = time.perf_counter()
        metadata = pb.Metadata(compute_chars=chars, total_time_ns=int((done - started) * 1e9))
        if answered.result is not None:
            timings = answered.result.timings
            metadata.compute_tokens = answered.result.tokens
            metadata.tokenization_time_ns = int(timings.tokenization_s * 1e9)
            metadata.queue_time_ns = int(timings.queue_s * 1e9)
            metadata.inference_time_ns = int(timings.inference_s * 1e9)
        self.service.metrics.request.labels(f"/{PACKAGE}.{rpc}").observe(done - started)
        self.service.metrics.answered(f"/{PACKAGE}.{rpc}", "OK")
        return answered.answer, metadata

    async def settle(self, call: Callable[[], Awaitable[Any]]) -> Any:
        """The call's answer, or the Refusal its error maps to. Only the handler's own task aborts a call: an abort
        from the task of one of a stream's messages could leave the call open until its deadline."""
        try:
            return await call()
        except _NotServed as exc:
            return Refusal(grpc.StatusCode.UNIMPLEMENTED, str(exc), ErrorType.NOT_FOUND)
        except TooLong as exc:
            return Refusal.of(exc.advising("truncate"))
        except InfinityError as exc:
            return Refusal.of(exc)
        except asyncio.TimeoutError:
            return Refusal.of(TimedOut("no answer before the call's deadline"))

    async def unary(self, rpc: str, call: Callable[[], Awaitable[Any]], context: grpc.aio.ServicerContext) -> Any:
        return await self.answered(rpc, await self.settle(call), context)

    async def stream(self, rpc: str, requests: AsyncIterator[Any], one: Callable[[Any, Any], Awaitable[Any]],
                     context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        """Each message started as it arrives (STREAM_WINDOW at most in flight), answered in order; the first refusal,
        a message's or the stream's own (one that is not protobuf), ends the call after the answers before it."""
        started: asyncio.Queue[asyncio.Future[Any] | Refusal | None] = asyncio.Queue(STREAM_WINDOW)

        def call(message: Any) -> Callable[[], Awaitable[Any]]:
            return lambda: one(message, context)

        async def read() -> None:
            try:
                async for message in requests:
                    await started.put(asyncio.ensure_future(self.settle(call(message))))
            except InfinityError as exc:
                await started.put(Refusal.of(exc))
            finally:
                await started.put(None)

        reader = asyncio.ensure_future(read())
        pending: list[asyncio.Future[Any]] = []
        try:
            while (item := await started.get()) is not None:
                outcome = item
                if isinstance(item, asyncio.Future):
                    pending.append(item)
                    outcome = await item
                    pending.remove(item)
                yield await self.answered(rpc, outcome, context)
        finally:
            reader.cancel()
            for task in pending + [t for t in _drain(started) if isinstance(t, asyncio.Future)]:
                task.cancel()

    async def answered(self, rpc: str, outcome: Any, context: grpc.aio.ServicerContext) -> Any:
        """The outcome itself, unless it is a Refusal: then the call ends with its code (counted in the metrics)."""
        if isinstance(outcome, Refusal):
            self.service.metrics.failed(f"/{PACKAGE}.{rpc}", outcome.kind, outcome.code.name)
            trailing = ((("retry-after", str(self.service.settings.retry_after)),)
                        if outcome.kind is ErrorType.OVERLOADED else ())
            await context.abort(outcome.code, outcome.message, trailing_metadata=trailing)
        return outcome


@dataclass(frozen=True)
class Refusal:
    """How a call ends when it is not answered: its status code, message and the error's kind for the metrics."""
    code: grpc.StatusCode
    message: str
    kind: ErrorType

    @classmethod
    def of(cls, exc: InfinityError) -> Refusal:
        return cls(CODES.get(exc.status_code, grpc.StatusCode.INTERNAL), exc.message, exc.error_type)


class _NotServed(Exception):
    pass


def _drain(queue: asyncio.Queue[Any]) -> list[Any]:
    items = []
    while not queue.empty():
        items.append(queue.get_nowait())
    return items


def unary(rpc: str, handle: str) -> Callable[..., Awaitable[Any]]:
    """A unary RPC's method: the servicer's `handle` (message, context) through Calls.unary."""
    async def method(self: Any, request: Any, context: Any) -> Any:
        return await self.calls.unary(rpc, lambda: getattr(self, handle)(request, context), context)
    return method


def streamed(rpc: str, handle: str) -> Callable[..., AsyncIterator[Any]]:
    """A streaming RPC's method (an async generator, as grpc.aio wants): each message through `handle`."""
    async def method(self: Any, requests: Any, context: Any) -> AsyncIterator[Any]:
        async for answer in self.calls.stream(rpc, requests, getattr(self, handle), context):
            yield answer
    return method


class Embed(services.EmbedServicer):  # type: ignore[misc,name-defined]
    def __init__(self, calls: Calls) -> None:
        self.calls = calls

    async def _embed(self, m: Any, context: Any) -> Any:
        body = {"inputs": m.inputs, "truncate": m.truncate, "truncation_direction": _direction(m),
                **_optional(m, "normalize", "prompt_name", "dimensions")}
        answer, metadata = await self.calls.answer("Embed/Embed", "/embed", body, len(m.inputs), context)
        return pb.EmbedResponse(embeddings=_floats(answer[0]), metadata=metadata)

    async def _sparse(self, m: Any, context: Any) -> Any:
        body = {"inputs": m.inputs, "truncate": m.truncate, "truncation_direction": _direction(m),
                **_optional(m, "prompt_name")}
        answer, metadata = await self.calls.answer("Embed/EmbedSparse", "/embed_sparse", body, len(m.inputs), context)
        values = [pb.SparseValue(index=entry["index"], value=entry["value"]) for entry in answer[0]]
        return pb.EmbedSparseResponse(sparse_embeddings=values, metadata=metadata)

    async def _all(self, m: Any, context: Any) -> Any:
        body = {"inputs": m.inputs, "truncate": m.truncate, "truncation_direction": _direction(m),
                **_optional(m, "prompt_name")}
        answer, metadata = await self.calls.answer("Embed/EmbedAll", "/embed_all", body, len(m.inputs), context)
        tokens = [pb.TokenEmbedding(embeddings=_floats(row)) for row in answer[0]]
        return pb.EmbedAllResponse(token_embeddings=tokens, metadata=metadata)

    Embed = unary("Embed/Embed", "_embed")
    EmbedStream = streamed("Embed/EmbedStream", "_embed")
    EmbedSparse = unary("Embed/EmbedSparse", "_sparse")
    EmbedSparseStream = streamed("Embed/EmbedSparseStream", "_sparse")
    EmbedAll = unary("Embed/EmbedAll", "_all")
    EmbedAllStream = streamed("Embed/EmbedAllStream", "_all")


class Predict(services.PredictServicer):  # type: ignore[misc,name-defined]
    """Sequence classification through /predict, every label best first (TEI's answer)."""

    def __init__(self, calls: Calls) -> None:
        self.calls = calls

    async def _predict(self, rpc: str, inputs: Any, chars: int, m: Any, context: Any) -> Any:
        if self.calls.task != "sequence-classification":
            raise _NotServed(f"{PACKAGE}.{rpc} is not served: this server runs a {self.calls.task} model")
        labels = len(self.calls.service.model.manifest.task.id2label or {}) or None
        parameters = {"raw_scores": m.raw_scores, "truncate": m.truncate, "truncation_direction": _direction(m),
                      **({"top_k": labels} if labels else {})}
        answer, metadata = await self.calls.answer(rpc, "/predict", {"inputs": inputs, "parameters": parameters},
                                                   chars, context)
        return pb.PredictResponse(predictions=[pb.Prediction(score=p["score"], label=p["label"]) for p in answer],
                                  metadata=metadata)

    def _single_streamed(self, m: Any, context: Any) -> Awaitable[Any]:
        return self._predict("Predict/PredictStream", m.inputs, len(m.inputs), m, context)

    def _pair(self, m: Any, context: Any) -> Awaitable[Any]:
        if len(m.inputs) != 2:
            raise ValidationError(f"PredictPair takes two inputs, a text and its pair, not {len(m.inputs)}")
        pair = {"text": m.inputs[0], "text_pair": m.inputs[1]}
        return self._predict("Predict/PredictPair", pair, len(m.inputs[0]) + len(m.inputs[1]), m, context)

    async def Predict(self, request: Any, context: Any) -> Any:
        return await self.calls.unary("Predict/Predict", lambda: self._predict(
            "Predict/Predict", request.inputs, len(request.inputs), request, context), context)

    PredictPair = unary("Predict/PredictPair", "_pair")
    PredictStream = streamed("Predict/PredictStream", "_single_streamed")
    PredictPairStream = streamed("Predict/PredictPairStream", "_pair")


class Rerank(services.RerankServicer):  # type: ignore[misc,name-defined]
    def __init__(self, calls: Calls) -> None:
        self.calls = calls

    async def _rerank(self, rpc: str, query: str, texts: list[str], first: Any, context: Any) -> Any:
        body = {"query": query, "texts": texts, "truncate": first.truncate, "raw_scores": first.raw_scores,
                "return_text": first.return_text, "truncation_direction": _direction(first)}
        chars = len(query) * len(texts) + sum(map(len, texts))
        answer, metadata = await self.calls.answer(rpc, "/rerank", body, chars, context)
        ranks = [pb.Rank(index=r["index"], score=r["score"], **({"text": r["text"]} if "text" in r else {}))
                 for r in answer]
        return pb.RerankResponse(ranks=ranks, metadata=metadata)

    async def Rerank(self, request: Any, context: Any) -> Any:
        return await self.calls.unary("Rerank/Rerank", lambda: self._rerank(
            "Rerank/Rerank", request.query, list(request.texts), request, context), context)

    async def RerankStream(self, requests: Any, context: Any) -> Any:
        """One text per message, against the first message's query and options; one answer at the end."""
        async def call() -> Any:
            messages = [message async for message in requests]
            if not messages:
                raise ValidationError("RerankStream needs at least one message")
            first = messages[0]
            return await self._rerank("Rerank/RerankStream", first.query, [m.text for m in messages], first, context)

        return await self.calls.unary("Rerank/RerankStream", call, context)


class Tokenize(services.TokenizeServicer):  # type: ignore[misc,name-defined]
    def __init__(self, calls: Calls) -> None:
        self.calls = calls

    async def _tokenize(self, m: Any, context: Any) -> Any:
        if m.HasField("prompt_name"):
            raise ValidationError("prompt_name is not applied by Tokenize here: send the prompt in inputs")
        body = {"inputs": m.inputs, "add_special_tokens": m.add_special_tokens}
        answer, _ = await self.calls.answer("Tokenize/Tokenize", "/tokenize", body, len(m.inputs), context)
        return pb.EncodeResponse(tokens=[pb.SimpleToken(id=t["id"], text=t["text"], special=t["special"],
                                                        **({} if t["start"] is None else
                                                           {"start": t["start"], "stop": t["stop"]}))
                                         for t in answer[0]])

    async def _decode(self, m: Any, context: Any) -> Any:
        body = {"ids": list(m.ids), "skip_special_tokens": m.skip_special_tokens}
        answer, _ = await self.calls.answer("Tokenize/Decode", "/decode", body, len(m.ids), context)
        return pb.DecodeResponse(text=answer[0])

    Tokenize = unary("Tokenize/Tokenize", "_tokenize")
    TokenizeStream = streamed("Tokenize/TokenizeStream", "_tokenize")
    Decode = unary("Tokenize/Decode", "_decode")
    DecodeStream = streamed("Tokenize/DecodeStream", "_decode")


MODEL_TYPES = {"sequence-classification": "MODEL_TYPE_CLASSIFIER", "ranking": "MODEL_TYPE_RERANKER"}


class Info(services.InfoServicer):  # type: ignore[misc,name-defined]
    def __init__(self, calls: Calls) -> None:
        self.calls = calls

    async def Info(self, request: Any, context: Any) -> Any:
        service = self.calls.service
        manifest, settings = service.model.manifest, service.settings
        return pb.InfoResponse(
            version=version(), model_id=served_name(manifest, settings),
            model_dtype=str(manifest.model.precision),
            model_type=pb.ModelType.Value(MODEL_TYPES.get(self.calls.task, "MODEL_TYPE_EMBEDDING")),
            max_concurrent_requests=settings.max_queue, max_input_length=manifest.tokenizer.max_length,
            max_batch_tokens=settings.max_batch_tokens, max_batch_requests=settings.max_batch_size,
            max_client_batch_size=settings.max_inputs_per_request, tokenization_workers=settings.tokenizer_workers,
            **({"model_sha": manifest.source.revision} if manifest.source.revision else {}))


class Malformed:
    """A message that is not protobuf: its call ends INVALID_ARGUMENT (a deserializer's exception would be UNKNOWN)."""

    def __init__(self, error: str) -> None:
        self.refusal = f"the message is not valid protobuf: {error}"


def _lenient(deserialize: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def read(data: bytes) -> Any:
        try:
            return deserialize(data)
        except DecodeError as exc:
            return Malformed(str(exc))
    return read


async def _checked(requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """A stream's messages; one that is not protobuf raises where the stream is read, and Calls ends the call."""
    async for message in requests:
        if isinstance(message, Malformed):
            raise ValidationError(message.refusal)
        yield message


HANDLERS = {(False, False): (grpc.unary_unary_rpc_method_handler, "unary_unary"),
            (False, True): (grpc.unary_stream_rpc_method_handler, "unary_stream"),
            (True, False): (grpc.stream_unary_rpc_method_handler, "stream_unary"),
            (True, True): (grpc.stream_stream_rpc_method_handler, "stream_stream")}


class Guard(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Before any tei.v1 call runs: its API key (when the server has keys: UNAUTHENTICATED before anything else), and
    its messages' wire format. Health and reflection stay open: probes send no key."""

    def __init__(self, keys: tuple[bytes, ...]) -> None:
        self.keys = keys

    async def intercept_service(self, continuation: Any, details: grpc.HandlerCallDetails) -> Any:
        handler = await continuation(details)
        if handler is None or not details.method.startswith(f"/{PACKAGE}."):
            return handler
        streaming = (handler.request_streaming, handler.response_streaming)
        make, name = HANDLERS[streaming]
        behavior = getattr(handler, name)
        metadata = {key: value for key, value in (details.invocation_metadata or ()) if isinstance(value, str)}
        async def refused(request: Any, context: grpc.aio.ServicerContext) -> Any:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, UNAUTHENTICATED)

        async def one(request: Any, context: grpc.aio.ServicerContext) -> Any:
            if isinstance(request, Malformed):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.refusal)
            return await behavior(request, context)

        async def gathered(requests: Any, context: grpc.aio.ServicerContext) -> Any:
            return await behavior(_checked(requests), context)

        async def streamed(requests: Any, context: grpc.aio.ServicerContext) -> Any:
            async for answer in behavior(_checked(requests), context):
                yield answer

        # every streamed answer of tei.v1 comes from a stream of messages (no unary_stream RPC)
        guarded = {(False, False): one, (True, False): gathered, (True, True): streamed}[streaming]
        if self.keys and not matches(presented_key(metadata.get), self.keys):
            guarded = refused
        return make(guarded, request_deserializer=_lenient(handler.request_deserializer),
                    response_serializer=handler.response_serializer)


SERVICES = ("Info", "Embed", "Predict", "Rerank", "Tokenize")


async def start(router: Router, host: str, port: int) -> tuple[grpc.aio.Server, Any]:
    """The gRPC server on host:port, started: tei.v1, grpc.health.v1 (SERVING) and reflection."""
    settings = router.service.settings
    options = [("grpc.max_receive_message_length", settings.max_payload_bytes),
               ("grpc.max_concurrent_streams", settings.max_connections)]
    server = grpc.aio.server(interceptors=[Guard(router.keys)], options=options)
    calls = Calls(router)
    for name, servicer in (("Info", Info), ("Embed", Embed), ("Predict", Predict), ("Rerank", Rerank),
                           ("Tokenize", Tokenize)):
        getattr(services, f"add_{name}Servicer_to_server")(servicer(calls), server)
    health = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    names = [f"{PACKAGE}.{name}" for name in SERVICES]
    reflection.enable_server_reflection([*names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                                         reflection.SERVICE_NAME], server)
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if server.add_insecure_port(address) == 0:
        raise OSError(f"cannot listen for gRPC on {address}")
    await server.start()
    for name in ("", *names):
        await health.set(name, health_pb2.HealthCheckResponse.SERVING)
    return server, health


async def stop(server: grpc.aio.Server, health: Any, grace: float) -> None:
    """NOT_SERVING first (probes see it), then the calls in flight get `grace` seconds."""
    await health.enter_graceful_shutdown()
    await server.stop(grace)
