"""Structured logs: one JSON object per line (time, level, logger, message and a record's extra fields); the
request lines come from infinity.observe."""
from __future__ import annotations

import asyncio
import atexit
import logging
import sys
from datetime import datetime, timezone
from typing import Any

import orjson

PLAIN_FORMAT = "%(levelname)s:     %(name)s: %(message)s"
# the response headers a request line carries, as fields in milliseconds
TIMINGS = {b"x-queue-time": "queue_ms", b"x-tokenization-time": "tokenization_ms",
           b"x-inference-time": "inference_ms", b"x-compute-time": "compute_ms"}
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "color_message"}
request_log = logging.getLogger("infinity.request")


def timings(headers: list[tuple[bytes, bytes]]) -> dict[str, float]:
    """The stage timings (milliseconds) an answer's headers carry, by field name."""
    return {TIMINGS[name]: float(value) for name, value in headers if name in TIMINGS}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(), "logger": record.name, "message": record.getMessage()}
        line.update((key, value) for key, value in vars(record).items() if key not in _STANDARD)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(line, default=str).decode()


def request_line(message: str, fields: dict[str, Any]) -> None:
    """A request's line, as JsonFormatter writes a record of the request log, written without making one:
    logging's record, formatter and handler cost the event loop 25 us a request, a tenth of its time per request
    at concurrency 16."""
    if request_log.isEnabledFor(logging.INFO):
        request_lines.add(orjson.dumps({
            "time": datetime.now(timezone.utc).isoformat(timespec="milliseconds"), "level": "info",
            "logger": request_log.name, "message": message, **fields}, default=str).decode())


class Turn:
    """The request lines of one turn of the event loop, written together as it ends: a write a line cost 5 % of
    the requests per second at concurrency 16 on two vCPUs (Zen 5: JSON logs on / off 0.92, with one write a turn
    0.97). Off the event loop, a line is written at once."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.due: asyncio.AbstractEventLoop | None = None  # the loop that writes them at its turn's end
        atexit.register(self.write)  # a turn that the loop's close cut short

    def add(self, line: str) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        self.lines.append(line)
        if loop is None:
            self.write()
        elif loop is not self.due:
            self.due = loop
            loop.call_soon(self.write)

    def write(self) -> None:
        self.due = None
        if self.lines:
            text = "\n".join(self.lines) + "\n"
            self.lines.clear()
            sys.stderr.write(text)


request_lines = Turn()


def setup(level: str, json_lines: bool) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if json_lines else logging.Formatter(PLAIN_FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler])
