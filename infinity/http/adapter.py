"""The one place that touches uvicorn's internals: its httptools protocol, the status lines it writes, and the
attributes of both that the transport relies on. `missing()` names any an upgrade removed."""
from __future__ import annotations

import asyncio

from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol, RequestResponseCycle
from uvicorn.server import ServerState

__all__ = ["STATUS_LINE", "HttpToolsProtocol", "RequestResponseCycle", "missing"]

# What the transport reads, calls or overrides beyond asyncio.Protocol's public methods.
PROTOCOL_METHODS = ("data_received", "send_400_response", "on_message_begin", "on_url", "on_header",
                    "on_headers_complete", "on_body", "on_message_complete", "on_response_complete", "shutdown",
                    "timeout_keep_alive_handler", "_unset_keepalive_if_required")
PROTOCOL_ATTRIBUTES = ("connections", "tasks", "server_state", "transport", "flow", "cycle", "pipeline", "parser",
                       "loop", "client", "scope", "headers", "timeout_keep_alive", "timeout_keep_alive_task")
# set by the parser's callbacks: `url` (on_url) holds the target read so far
CYCLE_ATTRIBUTES = ("response_started", "response_complete", "disconnected", "message_event")
FLOW_METHODS = ("pause_reading", "resume_reading", "drain")
FLOW_ATTRIBUTES = ("write_paused",)
SERVER_STATE_ATTRIBUTES = ("default_headers", "total_requests")


def missing() -> list[str]:
    """Every internal the transport relies on that this uvicorn lacks, as `Class.name`; [] when all are there."""
    absent = [f"HttpToolsProtocol.{name}" for name in PROTOCOL_METHODS if not callable(getattr(HttpToolsProtocol,
                                                                                              name, None))]
    loop = asyncio.new_event_loop()
    try:
        state = ServerState()
        protocol = HttpToolsProtocol(Config(app=_nothing), state, {}, _loop=loop)
        transport = _Transport()
        protocol.connection_made(transport)
        cycle = RequestResponseCycle(scope={}, transport=transport, flow=protocol.flow,  # type: ignore[typeddict-item]
                                     logger=protocol.logger, access_logger=protocol.access_logger, access_log=False,
                                     default_headers=[], message_event=asyncio.Event(),
                                     expect_100_continue=False, keep_alive=True, on_response=lambda: None)
        absent += [f"HttpToolsProtocol.{name}" for name in PROTOCOL_ATTRIBUTES if not hasattr(protocol, name)]
        absent += [f"RequestResponseCycle.{name}" for name in CYCLE_ATTRIBUTES if not hasattr(cycle, name)]
        absent += [f"FlowControl.{name}" for name in FLOW_METHODS if not callable(getattr(protocol.flow, name, None))]
        absent += [f"FlowControl.{name}" for name in FLOW_ATTRIBUTES if not hasattr(protocol.flow, name)]
        absent += [f"ServerState.{name}" for name in SERVER_STATE_ATTRIBUTES if not hasattr(state, name)]
    except (TypeError, AttributeError) as exc:
        absent.append(f"uvicorn's constructors changed: {exc}")
    finally:
        loop.close()
    if set(STATUS_LINE) != set(range(100, 600)):
        absent.append("STATUS_LINE")
    return absent


async def _nothing(scope: object, receive: object, send: object) -> None:
    return None


class _Transport(asyncio.Transport):
    """Enough of a transport for a protocol to be made on it."""

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default

    def is_closing(self) -> bool:
        return False
