"""Request heads as bytes: where one ends, which route it names, what body it declares, and what HTTP/1.1 refuses;
and answers as bytes, as every answer is written.

Pure functions over bytes, so every rule here is testable without a socket.
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from http import HTTPStatus
from typing import Any

import orjson

_PHRASES = {int(status): status.phrase for status in HTTPStatus}
STATUS_LINE = {code: f"HTTP/1.1 {code} {_PHRASES.get(code, '')}\r\n".encode("ascii") for code in range(100, 600)}


def serialized(status: int, headers: Iterable[tuple[bytes, bytes]], body: bytes = b"", close: bool = False) -> bytes:
    """A response as it goes on the wire: status line, headers (with connection: close when the connection ends
    after it), blank line, body. Every answer the server writes is made here."""
    lines = [STATUS_LINE[status]]
    for name, value in headers:
        lines += [name, b": ", value, b"\r\n"]
    if close:
        lines.append(b"connection: close\r\n")
    lines += [b"\r\n", body]
    return b"".join(lines)


def canned(status: int, body: dict[str, Any], extra: tuple[tuple[bytes, bytes], ...] = (), close: bool = True) -> bytes:
    """A whole JSON response, written straight to the socket."""
    payload = orjson.dumps(body)
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(payload)), *extra]
    return serialized(status, headers, payload, close)


def end_of_head(data: bytes | bytearray, start: int) -> int:
    """Where a request head ends (just past its blank line, CRLF or bare LF), or -1 if it has not ended yet."""
    crlf = data.find(b"\r\n\r\n", start)
    lf = data.find(b"\n\n", start, len(data) if crlf < 0 else crlf)
    if lf >= 0:
        return lf + 2
    return crlf + 4 if crlf >= 0 else -1


def route_of(data: bytes) -> bytes:
    """A POST's request line up to its target, "POST /path " (b"" for anything else)."""
    space = data.find(b" ", 5, 300) if data.startswith(b"POST ") else -1
    return data[:space + 1] if space > 0 else b""


def target_of(data: bytes | bytearray) -> bytes:
    """The path of a request line, without its query ("" when the line is not readable)."""
    line = bytes(data[:data.find(b"\n", 0, 8192)])
    parts = line.split(b" ")
    return parts[1].partition(b"?")[0] if len(parts) >= 3 else b""


# A POST head the parser would take as it is: CRLF line ends, header names that are tokens right before their
# colon, values without control bytes (HTAB aside). Anything else (bare LF, folded lines, a NUL) goes to the
# parser, which answers 400, so a malformed head is never answered on the socket where the parser refuses it.
PLAIN_HEAD = re.compile(rb"POST /[!-~]* HTTP/1\.1\r\n"
                        rb"(?:[!#$%&'*+\-.^_`|~0-9A-Za-z]+:[\t \x21-\x7e\x80-\xff]*\r\n)*\r\n")


def header(head: bytes, name: bytes) -> bytes | None:
    """The value of the one header `name` (lower case) in a plain head; None if absent or given twice."""
    lowered = head.lower()
    at = lowered.find(b"\n" + name + b":")
    if at < 0 or lowered.find(b"\n" + name + b":", at + 1) >= 0:
        return None
    return head[at + len(name) + 2:head.find(b"\n", at + 1)].strip()


def declared_body(data: bytes, end: int) -> int | None:
    """The body length a plain HTTP/1.1 keep-alive POST head declares in its one content-length; None for
    any other head (chunked, Expect, Connection other than keep-alive, HTTP/1.0, no single Host, malformed),
    which the parser takes."""
    if PLAIN_HEAD.fullmatch(data, 0, end) is None:
        return None
    head = data[:end]
    lowered = head.lower()
    if b"\ntransfer-encoding:" in lowered or b"\nexpect:" in lowered or header(head, b"host") is None:
        return None  # (and HTTP/1.1 needs exactly one Host: the parser's path refuses the others)
    if b"\nconnection:" in lowered and (header(head, b"connection") or b"").lower() != b"keep-alive":
        return None
    length = header(head, b"content-length")
    return int(length) if length is not None and length.isdigit() else None


def refusal(version: str, headers: list[tuple[bytes, bytes]], upgrade: bool) -> tuple[int, str] | None:
    """What HTTP/1.1 (RFC 9110, 9112) says to refuse in a head the parser has read: (status, reason), or None.
    `headers` are (lower-case name, value) pairs; `upgrade`: the parser saw a protocol upgrade."""
    if version not in ("1.1", "1.0"):
        return 505, f"HTTP/{version} is not supported; send HTTP/1.1"
    names = [name for name, _ in headers]
    if version == "1.1" and names.count(b"host") != 1:
        return 400, "an HTTP/1.1 request needs exactly one Host header"
    codings = [coding.strip().lower() for name, value in headers if name == b"transfer-encoding"
               for coding in value.split(b",")]
    if codings and codings != [b"chunked"]:
        return 501, "only the chunked transfer coding is supported"
    if upgrade:
        return 400, "protocol upgrades are not supported; send the request without Upgrade"
    return None
