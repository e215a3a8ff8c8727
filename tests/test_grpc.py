"""TEI's gRPC services (`--grpc-port`) as a TEI client calls them: the same answers and guarantees as HTTP (keys first,
overload, deadlines, bad input, cancellation), the standard health service and reflection. The route-equality test
(tests/test_routes_agree.py) compares every task's numbers with /predict's."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest

from bench.process import free_port
from optimize.measure.texts import heldout_inputs
from tests.servers import ROOT, Server, running
from tests.tei_client import OURS, generated

TEXTS = [text for text in heldout_inputs("singles") if isinstance(text, str)][:40]
KEY = "grpc-test-key"


class Served:
    def __init__(self, server: Server, port: int) -> None:
        self.address = f"127.0.0.1:{port}"
        self.server, self.channel = server, grpc.insecure_channel(self.address)
        self.pb, self.rpc = generated()

    def stub(self, service: str) -> Any:
        return getattr(self.rpc, f"{service}Stub")(self.channel)


@contextmanager
def serve(artifact: Path, log: Path, *args: str) -> Iterator[Served]:
    port = free_port()
    with running(artifact, log, "--grpc-port", str(port), *args) as server:
        served = Served(server, port)
        try:
            yield served
        finally:
            served.channel.close()


@pytest.fixture(scope="module")
def minilm(minilm_fp32_artifact: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with serve(minilm_fp32_artifact, tmp_path_factory.mktemp("grpc") / "server.log") as served:
        yield served


def code(call: Any) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    return caught.value.code(), caught.value.details()


@pytest.mark.skipif(not os.environ.get("TEI_PROTO"), reason="TEI_PROTO names no copy of TEI's own tei.proto")
def test_our_proto_has_teis_names_and_numbers() -> None:
    """Wire compatibility: every service, method, message, field name, number, type and label as TEI's file says."""
    from google.protobuf import descriptor_pb2
    from grpc_tools import protoc

    def described(path: Path, out: Path) -> descriptor_pb2.FileDescriptorProto:
        assert protoc.main(["protoc", f"-I{path.parent}", f"--descriptor_set_out={out}", str(path)]) == 0
        files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
        return files.file[0]

    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        ours = described(OURS, Path(scratch) / "ours.pb")
        theirs = described(Path(os.environ["TEI_PROTO"]), Path(scratch) / "theirs.pb")
    assert ours == theirs


def test_embed_answers_predicts_vector_with_its_metadata(minilm: Served) -> None:
    embed = minilm.stub("Embed")
    for text in TEXTS[:5]:
        answer = embed.Embed(minilm.pb.EmbedRequest(inputs=text, truncate=True), timeout=60)
        response = httpx.post(f"{minilm.server.url}/predict", json={"inputs": [text]}, timeout=60)
        assert np.array_equal(np.asarray(answer.embeddings, np.float32), np.asarray(response.json()[0], np.float32))
        assert answer.metadata.compute_chars == len(text)
        assert answer.metadata.compute_tokens == int(response.headers["x-compute-tokens"])
        assert answer.metadata.total_time_ns >= answer.metadata.inference_time_ns > 0
    code(lambda: embed.Embed(minilm.pb.EmbedRequest(inputs="word " * 600), timeout=60))
    metrics = httpx.get(f"{minilm.server.url}/metrics", timeout=60).text
    assert 'infinity_requests_total{route="/tei.v1.Embed/Embed",status="OK"}' in metrics
    assert 'infinity_failures_total{error_type="validation",route="/tei.v1.Embed/Embed"}' in metrics
    assert 'infinity_request_duration_seconds_count{route="/tei.v1.Embed/Embed"}' in metrics


def test_info_tokenize_and_decode_answer_as_their_http_routes(minilm: Served) -> None:
    info = minilm.stub("Info").Info(minilm.pb.InfoRequest(), timeout=60)
    http = httpx.get(f"{minilm.server.url}/info", timeout=60).json()
    assert (info.model_id, info.model_dtype, info.max_input_length, info.max_client_batch_size) == (
        http["model_id"], http["model_dtype"], http["max_input_length"], http["max_client_batch_size"])
    assert info.model_type == minilm.pb.MODEL_TYPE_EMBEDDING
    tokenize = minilm.stub("Tokenize")
    text = TEXTS[0]
    tokens = tokenize.Tokenize(minilm.pb.EncodeRequest(inputs=text, add_special_tokens=True), timeout=60).tokens
    expected = httpx.post(f"{minilm.server.url}/tokenize", json={"inputs": text}, timeout=60).json()[0]
    assert [{"id": t.id, "text": t.text, "special": t.special, "start": t.start if t.HasField("start") else None,
             "stop": t.stop if t.HasField("stop") else None} for t in tokens] == expected
    ids = [t.id for t in tokens]
    decoded = tokenize.Decode(minilm.pb.DecodeRequest(ids=ids, skip_special_tokens=True), timeout=60).text
    assert decoded == httpx.post(f"{minilm.server.url}/decode", json={"ids": ids}, timeout=60).json()[0]
    streamed = list(tokenize.TokenizeStream(iter(minilm.pb.EncodeRequest(inputs=t) for t in TEXTS[:3]), timeout=60))
    assert [len(each.tokens) for each in streamed] == [
        len(each) for each in httpx.post(f"{minilm.server.url}/tokenize", timeout=60,
                                         json={"inputs": TEXTS[:3], "add_special_tokens": False}).json()]


def test_another_tasks_service_is_unimplemented_naming_this_task(minilm: Served) -> None:
    pb = minilm.pb
    assert code(lambda: minilm.stub("Rerank").Rerank(pb.RerankRequest(query="q", texts=["a"]), timeout=60)) == (
        grpc.StatusCode.UNIMPLEMENTED,
        "tei.v1.Rerank/Rerank is not served: this server runs a feature-extraction model")
    assert code(lambda: minilm.stub("Predict").Predict(pb.PredictRequest(inputs="a"), timeout=60))[0] == (
        grpc.StatusCode.UNIMPLEMENTED)
    assert code(lambda: list(minilm.stub("Embed").EmbedSparseStream(iter([pb.EmbedSparseRequest(inputs="a")]),
                                                                     timeout=60)))[0] == grpc.StatusCode.UNIMPLEMENTED


def test_bad_input_is_invalid_argument_and_the_server_keeps_answering(minilm: Served) -> None:
    pb, embed = minilm.pb, minilm.stub("Embed")
    long = "word " * 600
    status, message = code(lambda: embed.Embed(pb.EmbedRequest(inputs=long), timeout=60))
    assert status == grpc.StatusCode.INVALID_ARGUMENT and "set truncate" in message
    assert code(lambda: embed.Embed(pb.EmbedRequest(inputs="a", prompt_name="nope"), timeout=60))[0] == (
        grpc.StatusCode.INVALID_ARGUMENT)
    assert code(lambda: embed.Embed(pb.EmbedRequest(inputs="a", dimensions=100000), timeout=60))[0] == (
        grpc.StatusCode.INVALID_ARGUMENT)
    # not a protobuf message at all, and one over the payload limit
    raw = minilm.channel.unary_unary("/tei.v1.Embed/Embed", request_serializer=None, response_deserializer=None)
    assert code(lambda: raw(b"\xff\xff\xff\xff\x0f", timeout=60)) == (
        grpc.StatusCode.INVALID_ARGUMENT, "the message is not valid protobuf: Error parsing message with type "
        "'tei.v1.EmbedRequest': Wire format was corrupt")
    streamed = minilm.channel.stream_stream("/tei.v1.Embed/EmbedStream", request_serializer=None,
                                            response_deserializer=None)
    # a stream gets the answers to the messages before the bad one, then INVALID_ARGUMENT, every time (the refusal
    # once came from the task reading the stream and, about one call in sixty, left the call open to its deadline)
    def three_then_corrupt(answers: list[bytes]) -> None:
        answers.extend(streamed(iter([b"\x0a\x01a"] * 3 + [b"\xff\xff\x0f", b"\x0a\x01a"]), timeout=10))

    for _ in range(40):
        answers: list[bytes] = []
        assert code(partial(three_then_corrupt, answers)) == (
            grpc.StatusCode.INVALID_ARGUMENT, "the message is not valid protobuf: Error parsing message with type "
            "'tei.v1.EmbedRequest': Wire format was corrupt")
        assert len(answers) == 3
    assert code(lambda: embed.Embed(pb.EmbedRequest(inputs="a" * 2_000_000), timeout=60))[0] == (
        grpc.StatusCode.RESOURCE_EXHAUSTED)
    # an error inside a stream ends that stream with its code; the next call is answered
    messages = [pb.EmbedRequest(inputs="fine", truncate=True), pb.EmbedRequest(inputs=long)]
    assert code(lambda: list(embed.EmbedStream(iter(messages), timeout=60)))[0] == grpc.StatusCode.INVALID_ARGUMENT
    assert len(embed.Embed(pb.EmbedRequest(inputs="still here"), timeout=60).embeddings) == 384


def test_a_passed_deadline_costs_no_compute_and_a_cancelled_stream_is_dropped(minilm: Served) -> None:
    pb, embed = minilm.pb, minilm.stub("Embed")
    assert code(lambda: embed.Embed(pb.EmbedRequest(inputs=TEXTS[0], truncate=True), timeout=1e-6))[0] == (
        grpc.StatusCode.DEADLINE_EXCEEDED)
    release = threading.Event()

    def slow() -> Iterator[Any]:
        yield pb.EmbedRequest(inputs=TEXTS[0], truncate=True)
        release.wait(30)  # a half-open stream: the client sends nothing more

    call = embed.EmbedStream(slow(), timeout=60)
    assert len(next(call).embeddings) == 384
    call.cancel()
    release.set()
    assert len(embed.Embed(pb.EmbedRequest(inputs="after the cancel"), timeout=60).embeddings) == 384


def test_health_and_reflection_answer(minilm: Served) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    health = health_pb2_grpc.HealthStub(minilm.channel)
    for service in ("", "tei.v1.Embed"):
        assert health.Check(health_pb2.HealthCheckRequest(service=service), timeout=60).status == (
            health_pb2.HealthCheckResponse.SERVING)
    answers = reflection_pb2_grpc.ServerReflectionStub(minilm.channel).ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=60)
    names = {service.name for answer in answers for service in answer.list_services_response.service}
    assert {"tei.v1.Info", "tei.v1.Embed", "tei.v1.Predict", "tei.v1.Rerank", "tei.v1.Tokenize",
            "grpc.health.v1.Health"} <= names


def test_a_key_is_checked_before_anything_else(minilm_fp32_artifact: Path, tmp_path: Path) -> None:
    with serve(minilm_fp32_artifact, tmp_path / "server.log", "--api-key", KEY) as served:
        pb, embed = served.pb, served.stub("Embed")
        unauthenticated = (grpc.StatusCode.UNAUTHENTICATED,
                           "a valid API key is required: send authorization: Bearer <key> metadata")
        # even a message the server would refuse, and a service it does not serve, is refused for its key first
        assert code(lambda: embed.Embed(pb.EmbedRequest(inputs="word " * 600), timeout=60)) == unauthenticated
        assert code(lambda: served.stub("Rerank").Rerank(pb.RerankRequest(), timeout=60)) == unauthenticated
        assert code(lambda: list(embed.EmbedStream(iter([pb.EmbedRequest(inputs="a")]), timeout=60))) == (
            unauthenticated)
        assert code(lambda: embed.Embed(pb.EmbedRequest(inputs="a"), timeout=60,
                                        metadata=(("authorization", "Bearer wrong"),))) == unauthenticated
        answer = embed.Embed(pb.EmbedRequest(inputs="a"), timeout=60, metadata=(("authorization", f"Bearer {KEY}"),))
        assert len(answer.embeddings) == 384
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        assert health_pb2_grpc.HealthStub(served.channel).Check(health_pb2.HealthCheckRequest(), timeout=60).status \
            == health_pb2.HealthCheckResponse.SERVING  # probes send no key


def test_overload_is_resource_exhausted_with_the_retry_hint(minilm_fp32_artifact: Path, tmp_path: Path) -> None:
    with serve(minilm_fp32_artifact, tmp_path / "server.log", "--max-queue", "1", "--retry-after", "3") as served:
        pb, embed = served.pb, served.stub("Embed")
        request = pb.EmbedRequest(inputs=" ".join(TEXTS), truncate=True)
        calls = [embed.Embed.future(request, timeout=120) for _ in range(48)]
        refused = 0
        for call in calls:
            try:
                assert len(call.result().embeddings) == 384
            except grpc.RpcError as error:
                assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error
                assert dict(error.trailing_metadata())["retry-after"] == "3"
                refused += 1
        assert 0 < refused < len(calls)
        assert len(embed.Embed(pb.EmbedRequest(inputs="after the flood"), timeout=60).embeddings) == 384


def test_a_stream_of_an_int8_graph_is_predicts_batch_bit_for_bit(minilm_int8_artifact: Path, tmp_path: Path) -> None:
    """A per-token INT8 graph answers alike alone and in any batch: a stream's answers, however the batcher groups its
    messages, are /predict's for the same texts sent together."""
    with serve(minilm_int8_artifact, tmp_path / "server.log") as served:
        messages = [served.pb.EmbedRequest(inputs=text, truncate=True) for text in TEXTS]
        streamed = [np.asarray(a.embeddings, np.float32) for a in served.stub("Embed").EmbedStream(iter(messages),
                                                                                                  timeout=120)]
        batched = httpx.post(f"{served.server.url}/predict", json={"inputs": TEXTS}, timeout=120).json()
        assert np.array_equal(np.stack(streamed), np.asarray(batched, np.float32))


def test_without_the_extra_the_server_says_which_to_install(minilm_fp32_artifact: Path, tmp_path: Path) -> None:
    (tmp_path / "grpc.py").write_text("raise ImportError('not installed', name='grpc')\n")
    result = subprocess.run([sys.executable, "-m", "infinity", "serve", str(minilm_fp32_artifact), "--grpc-port", "1"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120,
                            env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "infinity: error: --grpc-port needs the grpc extra (grpc is not installed): "
        "pip install 'infinity-multiverse[grpc]'"]


def test_a_thousand_concurrent_streams_end_answered_or_refused_and_the_server_stays(minilm: Served) -> None:
    """1,000 streams at once on one connection: each is answered or refused RESOURCE_EXHAUSTED (the queue's bound),
    none hangs, and the server answers afterwards."""
    import asyncio

    pb, rpc = minilm.pb, minilm.rpc

    async def flood() -> dict[str, int]:
        outcomes: dict[str, int] = {}
        async with grpc.aio.insecure_channel(minilm.address) as channel:
            embed = rpc.EmbedStub(channel)

            async def one(i: int) -> None:
                try:
                    async for answer in embed.EmbedStream(iter([pb.EmbedRequest(inputs=f"text {i}")]), timeout=120):
                        assert len(answer.embeddings) == 384
                    outcome = "OK"
                except grpc.aio.AioRpcError as error:
                    outcome = error.code().name
                outcomes[outcome] = outcomes.get(outcome, 0) + 1

            await asyncio.gather(*(one(i) for i in range(1000)))
        return outcomes

    outcomes = asyncio.run(flood())
    assert set(outcomes) <= {"OK", "RESOURCE_EXHAUSTED"} and outcomes.get("OK", 0) > 0, outcomes
    assert sum(outcomes.values()) == 1000
    assert len(minilm.stub("Embed").Embed(pb.EmbedRequest(inputs="after"), timeout=60).embeddings) == 384
