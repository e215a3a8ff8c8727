"""The baseline: the transformers pipeline in PyTorch FP32 behind a small starlette app.

What "wrap it in a FastAPI" gives: a sync handler run in the threadpool, one model, no batching.

    python -m bench.vanilla_server <model dir> --port 8081 --threads 2
"""
from __future__ import annotations

import argparse
import time

import uvicorn
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route


def create_app(model_dir: str, threads: int) -> Starlette:
    import torch
    from transformers import pipeline

    torch.set_num_threads(threads)
    classify = pipeline("text-classification", model=model_dir, device="cpu")

    def run(text: str) -> tuple[list, float]:
        start = time.perf_counter()
        with torch.inference_mode():
            output = classify(text)
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
    args = parser.parse_args()
    uvicorn.run(create_app(args.model, args.threads), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
