"""The listening socket and the server's life: the app's startup, connections until a signal, then a drain."""
from __future__ import annotations

import asyncio
import logging
import signal
import socket
from typing import Any, cast

from starlette.applications import Starlette

from infinity.errors import StartupError
from infinity.http import awslambda
from infinity.http.connection import Connection
from infinity.http.router import Router
from infinity.http.shared import Limits, Shared
from infinity.settings import Settings
from infinity.startup import Startup

try:
    import uvloop
except ImportError:  # not on Windows
    uvloop = None  # type: ignore[assignment]

try:
    import resource
except ImportError:  # not on Windows
    resource = None  # type: ignore[assignment]

log = logging.getLogger("infinity.http")
SPARE_FILES = 64  # descriptors kept for everything but client connections (listener, loop, logs, refusals)
BACKLOG = 2048  # connections the kernel holds before accept
CANCELLED_WRITE_S = 5.0  # after the drain deadline, how long cancelled requests get to write their 503
LANE = True  # `python -m bench lane` turns the lane off to measure every request through the app


def bind(host: str, port: int) -> socket.socket:
    """Bind (not yet listen) once the model has loaded, before the routes are built: a port in use is refused in one
    line."""
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


def run(app: Starlette, settings: Settings, sock: socket.socket, router: Router, startup: Startup | None = None) -> int:
    """Serve until SIGTERM or SIGINT, then drain; 0 after a clean shutdown, 1 if the app's startup failed."""
    runner = asyncio.run if uvloop is None else uvloop.run
    return runner(serve(app, settings, sock, router, startup))


async def serve(app: Starlette, settings: Settings, sock: socket.socket, router: Router,
                startup: Startup | None = None) -> int:
    loop = asyncio.get_running_loop()
    stop, force = asyncio.Event(), asyncio.Event()  # a second signal cuts the drain short

    def signalled() -> None:
        (force if stop.is_set() else stop).set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, signalled)
    shared = Shared(app, keep_alive=settings.keep_alive_timeout, limits=limits(settings), router=router, lane=LANE,
                    access_log=settings.access_log)
    try:
        async with app.router.lifespan_context(app) as state:
            shared.state = dict(state or {})
            server = await loop.create_server(lambda: Connection(shared), sock=sock, backlog=BACKLOG)
            clock = loop.create_task(_tick(shared))
            host, port = sock.getsockname()[:2]
            log.info("listening on http://%s:%d", f"[{host}]" if ":" in host else host, port)
            grpc = await _grpc(router, settings)
            if startup is not None:
                startup.mark("warm-up")
                log.info(startup.line())
            if settings.lambda_runtime_api:
                awslambda.start(settings.lambda_runtime_api, host, port)
            await stop.wait()
            log.info("shutting down: %d connections open, %d requests in flight", len(shared.connections),
                     len(shared.tasks))
            server.close()
            for connection in list(shared.connections):
                connection.shutdown()
            stopping = _grpc_stop(grpc, settings.drain_timeout)
            await asyncio.gather(_drain(shared, settings.drain_timeout, force), stopping)
            clock.cancel()
    except StartupError:
        raise
    except Exception:
        log.exception("the server stopped on an error")
        return 1
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
    return 0


async def _grpc(router: Router, settings: Settings) -> tuple[Any, Any] | None:
    """TEI's gRPC services on --grpc-port, started once HTTP listens (infinity/grpc/server.py)."""
    if settings.grpc_port is None:
        return None
    from infinity.grpc.server import start

    try:
        started = await start(cast(Any, router), settings.host, settings.grpc_port)  # the API's Router
    except (OSError, RuntimeError) as exc:
        raise StartupError(f"cannot listen for gRPC on {settings.host}:{settings.grpc_port}: {exc}") from None
    log.info("listening for gRPC (tei.v1) on %s:%d", settings.host, settings.grpc_port)
    return started


async def _grpc_stop(grpc: tuple[Any, Any] | None, grace: float) -> None:
    if grpc is not None:
        from infinity.grpc.server import stop

        await stop(*grpc, grace)


async def _tick(shared: Shared) -> None:
    while True:
        await asyncio.sleep(1.0)
        shared.tick()


async def _drain(shared: Shared, timeout: float, force: asyncio.Event) -> None:
    """Wait until every answer is written and every connection closed, up to `timeout` (or a second signal);
    then cancel what is left: a request cancelled at the deadline still answers 503."""
    async def finished() -> None:
        while shared.connections or shared.tasks:
            await asyncio.sleep(0.05)

    waiting = [asyncio.ensure_future(finished()), asyncio.ensure_future(force.wait())]
    await asyncio.wait(waiting, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    for future in waiting:
        future.cancel()
    left = list(shared.tasks)
    if left:
        log.warning("cancelling %d requests still unanswered after the drain timeout", len(left))
        for task in left:
            task.cancel()
        await asyncio.wait(left, timeout=CANCELLED_WRITE_S)
