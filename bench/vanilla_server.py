"""The baseline: the model in PyTorch behind a small starlette app, as a hand-written wrapper serves it.

What "wrap it in a FastAPI" gives: a sync handler run in the threadpool, one model, no batching across requests.
text-classification runs the transformers pipeline; feature-extraction runs sentence-transformers' encode (which
sorts and batches one request's texts itself).

    python -m bench vanilla-server <model dir> --port 8081 --threads 2 [--task feature-extraction]
                                   [--device cuda --dtype float16]
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


def create_app(model_dir: str, threads: int, task: str = "text-classification", device: str = "cpu",
               dtype: str = "float32") -> Starlette:
    import torch

    torch.set_num_threads(threads)
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

    async def ready(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ready"})

    return Starlette(routes=[Route("/predict", predict, methods=["POST"]),
                             Route("/health/ready", ready, methods=["GET"])])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8081)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--task", choices=TASKS, default="text-classification")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    parser.add_argument("--dtype", choices=DTYPES, default="float32")
    args = parser.parse_args()
    app = create_app(args.model, args.threads, args.task, args.device, args.dtype)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
