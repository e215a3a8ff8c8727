"""`infinity serve <artifact>`: every setting is a flag and an INFINITY_<NAME> variable (the flag wins)."""
from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import logging
import os
import sys
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from infinity.hostinfo import physical_cores
from infinity.preflight import StartupError, check, open_checked
from infinity.settings import Settings

ENV_PREFIX = "INFINITY_"
TRUE, FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")

HELP = {
    "host": "address to bind",
    "port": "port to bind",
    "threads": "ONNX Runtime intra-op threads (default: physical cores)",
    "spin_wait": "let ONNX Runtime's workers busy-wait briefly for more work before they sleep (lower latency on "
                 "dedicated cores; turn off where the cores are shared, e.g. a sidecar)",
    "spin_wait_us": "microseconds a worker busy-waits before it sleeps, with --spin-wait",
    "lone_request_tokens": "while requests come one at a time, one of at most this many padded tokens (rows x "
                           "longest input) runs on the event loop instead of the engine thread, saving two thread "
                           "wake-ups; 0: never",
    "max_batch_tokens": "padded tokens (rows x longest input) per batch",
    "max_batch_size": "rows per batch",
    "max_queue": "requests waiting for the engine before new ones get 429",
    "max_inputs_per_request": "texts in one request (at most max_batch_size)",
    "max_payload_bytes": "request body limit in bytes",
    "tokenizer_workers": "threads that tokenize and post-process",
    "drain_timeout": "seconds to finish in-flight requests after SIGTERM",
    "retry_after": "seconds sent in Retry-After with 429; the refused connection is not read again before then",
    "max_header_bytes": "request line and headers in bytes; more is answered 431 without being parsed",
    "max_connections": "open client connections; more are answered 503 and closed (lowered to fit the open-file limit)",
    "header_timeout": "seconds for a request's headers to arrive; later: 408 and close",
    "body_timeout": "seconds for a request's body to arrive once its headers have; later: 408 and close",
    "keep_alive_timeout": "seconds an idle connection stays open between requests",
    "allow_cpu_mismatch": "serve although this CPU lacks the target's required flags",
    "allow_failed_parity": "serve an artifact whose parity check failed",
    "log_level": "debug, info, warning or error",
    "access_log": "log every request",
    "public_metadata": "serve /info, /metrics, /openapi.json and /v1/models without an API key "
                       "(health probes never need one)",
    "served_model_name": "the model's name in /v1/models, /info and every answer (default: its hub id from the "
                         "manifest, else the directory name it was optimized from)",
    "default_prompt_name": "the model's prompt put before texts of requests that name none (default: the model's "
                           "own default prompt, if any)",
}


def _kind(field: dataclasses.Field[Any]) -> type:
    """The scalar type of a Settings field (int for `int | None`)."""
    hint = typing.get_type_hints(Settings)[field.name]
    if isinstance(hint, types.UnionType):
        return next(arg for arg in typing.get_args(hint) if arg is not type(None))
    return hint


def _parse(kind: type, text: str, source: str) -> Any:
    if kind is bool:
        if text.lower() in TRUE:
            return True
        if text.lower() in FALSE:
            return False
        raise StartupError(f"{source} must be true or false, not {text!r}")
    try:
        return kind(text)
    except ValueError:
        raise StartupError(f"{source} must be {'an integer' if kind is int else 'a number'}, not {text!r}") from None


def _scalar_fields() -> list[dataclasses.Field[Any]]:
    return [field for field in dataclasses.fields(Settings) if field.name != "api_keys"]


def api_keys(args: argparse.Namespace, environ: Mapping[str, str]) -> tuple[str, ...]:
    """Keys from --api-key (or INFINITY_API_KEY, comma-separated) and --api-key-file (or INFINITY_API_KEY_FILE)."""
    keys = list(args.api_keys or [key.strip() for key in environ.get(ENV_PREFIX + "API_KEY", "").split(",")])
    path = args.api_key_file or environ.get(ENV_PREFIX + "API_KEY_FILE")
    if path:
        try:
            keys += Path(path).read_text().splitlines()
        except OSError as exc:
            raise StartupError(f"cannot read the API key file {path}: {exc.strerror}") from None
    return tuple(key.strip() for key in keys if key.strip())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="infinity", description="Serve one optimized artifact.")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve an artifact directory over HTTP")
    serve.add_argument("artifact", nargs="?", help=f"artifact directory (or {ENV_PREFIX}ARTIFACT)")
    serve.add_argument("--api-key", dest="api_keys", action="append", metavar="KEY",
                       help=f"require Authorization: Bearer KEY on inference routes; repeat for several keys "
                            f"[env {ENV_PREFIX}API_KEY, comma-separated]")
    serve.add_argument("--api-key-file", metavar="PATH",
                       help=f"read API keys from a file, one per line (a mounted secret) [env {ENV_PREFIX}API_KEY_FILE]")
    for field in _scalar_fields():
        flag = "--" + field.name.replace("_", "-")
        env = ENV_PREFIX + field.name.upper()
        help = f"{HELP[field.name]} [env {env}, default {field.default}]"
        if _kind(field) is bool:
            serve.add_argument(flag, dest=field.name, action="store_const", const="true", default=None, help=help)
            serve.add_argument("--no-" + flag[2:], dest=field.name, action="store_const", const="false",
                               help=f"turn {flag} off" if field.default else argparse.SUPPRESS)
        else:
            serve.add_argument(flag, dest=field.name, default=None, metavar=field.name.upper(), help=help)
    return parser


def settings_from(args: argparse.Namespace, environ: Mapping[str, str]) -> Settings:
    values: dict[str, Any] = {"api_keys": api_keys(args, environ)}
    for field in _scalar_fields():
        env = ENV_PREFIX + field.name.upper()
        flag_value = getattr(args, field.name)
        if flag_value is not None:
            values[field.name] = _parse(_kind(field), flag_value, "--" + field.name.replace("_", "-"))
        elif environ.get(env, "") != "":
            values[field.name] = _parse(_kind(field), environ[env], env)
    try:
        return Settings(**values)
    except ValueError as exc:
        raise StartupError(str(exc)) from None


def warn_if_open(settings: Settings) -> None:
    try:
        loopback = ipaddress.ip_address(settings.host).is_loopback
    except ValueError:
        loopback = settings.host == "localhost"
    if not settings.api_keys and not loopback:
        logging.getLogger("infinity").warning(
            "no API key is set and the server listens on %s: anyone who can reach the port can use the model "
            "(set --api-key or %sAPI_KEY)", settings.host, ENV_PREFIX)


def serve(directory: Path, settings: Settings) -> int:
    from infinity.app import create_app
    from infinity.server import bind, run

    threads = settings.threads or physical_cores()
    settings = dataclasses.replace(settings, threads=threads)
    check(directory, settings)
    sock = bind(settings.host, settings.port)
    try:
        model = open_checked(directory, settings, threads)
        app = create_app(model, settings)
        return run(app, settings, sock, app.state.shedding, app.state.lane)
    finally:
        sock.close()


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    environ = os.environ if environ is None else environ
    args = build_parser().parse_args(argv)
    try:
        settings = settings_from(args, environ)
        logging.basicConfig(level=settings.log_level.upper(), format="%(levelname)s:     %(name)s: %(message)s")
        warn_if_open(settings)
        artifact = args.artifact or environ.get(ENV_PREFIX + "ARTIFACT")
        if not artifact:
            raise StartupError("no artifact directory given")
        return serve(Path(artifact), settings)
    except StartupError as exc:
        print(f"infinity: error: {exc}", file=sys.stderr)
        return 1
