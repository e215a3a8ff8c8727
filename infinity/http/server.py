"""The listening socket and the uvicorn server around the app."""
from __future__ import annotations

import logging
import signal
import socket

import uvicorn
from starlette.types import ASGIApp

from infinity.http.adapter import missing
from infinity.http.lane import Lane
from infinity.http.lane import protocol as lane_protocol
from infinity.http.protocol import Gate, Limits, protocol_class
from infinity.preflight import StartupError
from infinity.settings import Settings

try:
    import resource
except ImportError:  # not on Windows
    resource = None  # type: ignore[assignment]

log = logging.getLogger("infinity.http")
SPARE_FILES = 64  # descriptors kept for everything but client connections (listener, loop, logs, refusals)


def bind(host: str, port: int) -> socket.socket:
    """Bind (not yet listen) before the model loads: a port in use is refused in one line, at once."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as exc:
        raise StartupError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise StartupError(f"cannot listen on {host}:{port}: {(exc.strerror or str(exc)).lower()}") from None
    sock.set_inheritable(True)
    return sock


def connection_budget(wanted: int) -> int:
    """max_connections, lowered if the open-file limit (raised to its hard ceiling if need be) is smaller:
    past that limit accept() fails and every client waits, instead of the excess getting a quick 503."""
    if resource is None:
        return wanted
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = wanted + SPARE_FILES
    if soft != resource.RLIM_INFINITY and soft < needed:
        raised = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            soft = raised
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return wanted
    budget = max(1, soft - SPARE_FILES)
    log.warning("max_connections lowered from %d to %d to fit the open-file limit of %d", wanted, budget, soft)
    return budget


def limits(settings: Settings) -> Limits:
    return Limits(max_header_bytes=settings.max_header_bytes,
                  max_connections=connection_budget(settings.max_connections),
                  header_timeout=settings.header_timeout, body_timeout=settings.body_timeout,
                  refusal_hold=float(settings.retry_after))


def check_uvicorn() -> None:
    """The transport relies on a few of uvicorn's internals: an upgrade that removed one stops here, by name."""
    absent = missing()
    if absent:
        raise StartupError(f"this uvicorn lacks what the server relies on: {', '.join(absent)}; "
                           "install the version pyproject.toml names")


def run(app: ASGIApp, settings: Settings, sock: socket.socket, gate: Gate, lane: Lane | None) -> int:
    http = protocol_class(limits(settings), gate)
    if lane is not None:
        http = lane_protocol(http, lane)
    config = uvicorn.Config(app, http=http, ws="none", lifespan="on",
                            log_level=settings.log_level, access_log=settings.access_log,
                            # uvicorn annotates these as int; it passes them to call_later and wait_for
                            timeout_keep_alive=settings.keep_alive_timeout,  # type: ignore[arg-type]
                            timeout_graceful_shutdown=settings.drain_timeout)  # type: ignore[arg-type]
    server = uvicorn.Server(config)
    # uvicorn re-raises the signal it shut down on; a quiet handler makes that a clean exit 0
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda number, frame: None)
    host, port = sock.getsockname()[:2]
    log.info("bound to http://%s:%d; listening once the model is warm", f"[{host}]" if ":" in host else host, port)
    server.run(sockets=[sock])
    return 0 if server.started else 1
