"""The least a server can do for one short /predict: the host's floor under the concurrency-1 overhead.

    python -m bench bare <artifact> --port N [--threads 2]

One uvloop protocol frames sized POSTs on keep-alive connections, one worker thread runs the in-process
pipeline (JSON in, `bench.inprocess.predict`, JSON out), and the answer goes back with a minimal head. There is
no routing, validation, batching, admission, metrics or timing header. Its concurrency-1 p50 over the
in-process p50 is what loopback, the client waking up and one hand-off to a thread and back cost on this
host; our server's p50 above it is the cost of everything the server adds.
"""
from __future__ import annotations

import argparse
import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import orjson
import uvloop

from bench.inprocess import predict
from infinity.engine.model import LoadedModel

READY = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
FAILED = b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"


class Bare(asyncio.Protocol):
    def __init__(self, model: LoadedModel, worker: ThreadPoolExecutor | None) -> None:
        self.model, self.worker = model, worker
        self.buffer = b""
        self.busy = False
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        self._next()

    def _next(self) -> None:
        """Answer the next whole request in the buffer, one at a time and in order."""
        end = self.buffer.find(b"\r\n\r\n")
        if self.busy or end < 0:
            return
        head = self.buffer[:end].lower()
        at = head.find(b"content-length:")
        length = int(head[at + 15:].split(b"\r\n", 1)[0]) if at >= 0 else 0
        if len(self.buffer) < end + 4 + length:
            return
        body, self.buffer = self.buffer[end + 4:end + 4 + length], self.buffer[end + 4 + length:]
        if not head.startswith(b"post"):
            self._write(READY)
            return
        if self.worker is None:
            self._write(self._predict(body))
            return
        self.busy = True
        future = asyncio.get_running_loop().run_in_executor(self.worker, self._predict, body)
        future.add_done_callback(lambda done: self._write(FAILED if done.exception() else done.result()))

    def _predict(self, body: bytes) -> bytes:
        answer = orjson.dumps(predict(self.model, orjson.loads(body)["inputs"]), option=orjson.OPT_SERIALIZE_NUMPY)
        return (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(answer)
                + answer)

    def _write(self, response: bytes) -> None:
        self.busy = False
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(response)
        self._next()


async def serve(model: LoadedModel, port: int, on_loop: bool = False) -> None:
    worker = None if on_loop else ThreadPoolExecutor(1, thread_name_prefix="bare-worker")
    server = await asyncio.get_running_loop().create_server(lambda: Bare(model, worker), "127.0.0.1", port)
    async with server:
        await server.serve_forever()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact", type=Path)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--on-loop", action="store_true",
                        help="run the pipeline on the event loop itself: no hand-off, and nothing else is served "
                             "meanwhile (a floor for comparison, not a design)")
    args = parser.parse_args()
    model = LoadedModel.load(args.artifact, threads=args.threads)
    predict(model, "warm up")
    uvloop.run(serve(model, args.port, args.on_loop))
    return 0
