"""The baseline: the model in PyTorch behind a small starlette app, as a hand-written wrapper serves it.

What "wrap it in a FastAPI" gives: a sync handler run in the threadpool, one model, no batching across requests.
text-classification runs the transformers pipeline; feature-extraction runs sentence-transformers' encode (which
sorts and batches one request's texts itself), or with `--engine openvino` the same model converted from PyTorch
and compiled by OpenVINO in its default precision (bf16 on AMX hosts), the request's texts sorted and batched as
encode does. /predict takes {"inputs": ...}; /embeddings takes OpenAI's body and answers in its shape.

    python -m bench vanilla-server <model dir> --port 8081 --threads 2 [--task feature-extraction]
                                   [--device cuda --dtype float16] [--engine openvino]
"""
from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

TASKS = ("text-classification", "feature-extraction")
DTYPES = ("float32", "float16", "bfloat16")
ENGINES = ("torch", "openvino")
ENCODE_BATCH = 32  # sentence-transformers encode's default batch size


def predictor(model_dir: str, task: str, device: str, dtype: str) -> Callable[[Any], Any]:
    import torch

    torch_dtype = getattr(torch, dtype)
    if task == "text-classification":
        from transformers import pipeline

        classify = pipeline("text-classification", model=model_dir, device=device, dtype=torch_dtype)
        return classify
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(model_dir, device=device, model_kwargs={"dtype": torch_dtype})

    def embed(inputs: str | list[str]) -> Any:
        vectors = model.encode([inputs] if isinstance(inputs, str) else inputs, convert_to_numpy=True)
        return (vectors[0] if isinstance(inputs, str) else vectors).tolist()
    return embed


def openvino_predictor(model_dir: str, threads: int) -> Callable[[Any], Any]:
    import threading

    import numpy as np

    from bench.openvino_peer import openvino_model

    compiled, tokenize = openvino_model(model_dir, threads)
    request, lock = compiled.create_infer_request(), threading.Lock()

    def embed(inputs: str | list[str]) -> Any:
        texts = [inputs] if isinstance(inputs, str) else inputs
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        vectors: list[Any] = [None] * len(texts)
        for start in range(0, len(order), ENCODE_BATCH):
            chunk = order[start:start + ENCODE_BATCH]
            tokens = tokenize([texts[i] for i in chunk])
            with lock:
                rows = np.array(request.infer(tokens)[0])
            for i, row in zip(chunk, rows):
                vectors[i] = row.tolist()
        return vectors[0] if isinstance(inputs, str) else vectors
    return embed


def create_app(model_dir: str, threads: int, task: str = "text-classification", device: str = "cpu",
               dtype: str = "float32", engine: str = "torch") -> Starlette:
    import torch

    torch.set_num_threads(threads)
    if engine == "openvino":
        if task != "feature-extraction":
            raise SystemExit("--engine openvino serves feature-extraction only")
        predict_fn = openvino_predictor(model_dir, threads)
    else:
        predict_fn = predictor(model_dir, task, device, dtype)

    def run(inputs: Any) -> tuple[Any, float]:
        start = time.perf_counter()
        with torch.inference_mode():
            output = predict_fn(inputs)
        return output, (time.perf_counter() - start) * 1000

    async def predict(request: Request) -> JSONResponse:
        body = await request.json()
        output, ms = await run_in_threadpool(run, body["inputs"])
        return JSONResponse(output, headers={"x-compute-time": f"{ms:.3f}"})

    async def embeddings(request: Request) -> JSONResponse:
        body = await request.json()
        texts = [body["input"]] if isinstance(body["input"], str) else body["input"]
        output, ms = await run_in_threadpool(run, texts)
        return JSONResponse({"object": "list", "data": [{"object": "embedding", "index": i, "embedding": vector}
                                                         for i, vector in enumerate(output)]},
                            headers={"x-compute-time": f"{ms:.3f}"})

    async def ready(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ready"})

    return Starlette(routes=[Route("/predict", predict, methods=["POST"]),
                             Route("/embeddings", embeddings, methods=["POST"]),
                             Route("/health/ready", ready, methods=["GET"]), Route("/health", ready, methods=["GET"])])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8081)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--task", choices=TASKS, default="text-classification")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    parser.add_argument("--dtype", choices=DTYPES, default="float32")
    parser.add_argument("--engine", choices=ENGINES, default="torch")
    args = parser.parse_args()
    app = create_app(args.model, args.threads, args.task, args.device, args.dtype, args.engine)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
