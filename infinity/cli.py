"""`infinity serve <artifact>`: every setting is a flag and an INFINITY_<NAME> variable (the flag wins).

Managed platforms name some settings in their own variables: SageMaker (started as `<image> serve`, or with
SAGEMAKER_BIND_TO_PORT), Vertex AI (AIP_HTTP_PORT, AIP_PREDICT_ROUTE, AIP_HEALTH_ROUTE), AWS Lambda
(AWS_LAMBDA_RUNTIME_API), Cloud Run and Knative (PORT, with K_SERVICE). What the platform
decides (port, routes) beats INFINITY_* variables; what it implies (listen on every interface, its payload and
time limits) only replaces the defaults."""
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

from infinity import corpus, logs
from infinity.bundle import BUNDLE_FILE
from infinity.engine.hostinfo import physical_cores
from infinity.engine.preflight import check, choose, open_checked
from infinity.errors import StartupError
from infinity.settings import Settings
from infinity.startup import Startup

ENV_PREFIX = "INFINITY_"
SAGEMAKER_START = "serve"  # SageMaker runs the image with this one argument
SAGEMAKER_MODEL_DIR = "/opt/ml/model"  # where SageMaker unpacks the model data (SM_MODEL_DIR moves it)
SAGEMAKER_PAYLOAD_BYTES = 6 * 1024 * 1024  # InvokeEndpoint's body limit for real-time endpoints
SAGEMAKER_TIMEOUT_S = 60.0  # ... and how long it waits for the container's answer
VERTEX_PAYLOAD_BYTES = 1_572_864  # Vertex AI's 1.5 MB online prediction limit
LAMBDA_PAYLOAD_BYTES = 6 * 1024 * 1024  # a synchronous invocation's payload limit
TRUE, FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")



def _kind(field: dataclasses.Field[Any]) -> type:
    """The scalar type of a Settings field (int for `int | None`)."""
    hint = typing.get_type_hints(Settings)[field.name]
    if isinstance(hint, types.UnionType):
        hint = next(arg for arg in typing.get_args(hint) if arg is not type(None))
    return typing.cast(type, hint)


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
    parser = argparse.ArgumentParser(prog="infinity",
                                     description="Serve one optimized artifact, or embed a corpus with it.")
    commands = parser.add_subparsers(dest="command", required=True)
    corpus.add_arguments(commands.add_parser("embed", help="a corpus's vectors to Parquet or JSONL, in-process, "
                                                           "resumable (docs/library.md)"))
    serve = commands.add_parser("serve", help="serve an artifact directory over HTTP")
    serve.add_argument("artifact", nargs="?", help=f"artifact directory, or a bundle of several targets' artifacts "
                       f"(the one this CPU fits is served) (or {ENV_PREFIX}ARTIFACT); "
                       f"`{SAGEMAKER_START}` alone: SageMaker's start, serving {SAGEMAKER_MODEL_DIR} (or "
                       "SM_MODEL_DIR) if it holds an artifact")
    serve.add_argument("--api-key", dest="api_keys", action="append", metavar="KEY",
                       help=f"require Authorization: Bearer KEY on inference routes; repeat for several keys "
                            f"[env {ENV_PREFIX}API_KEY, comma-separated]")
    serve.add_argument("--api-key-file", metavar="PATH",
                       help="read API keys from a file, one per line (a mounted secret) "
                            f"[env {ENV_PREFIX}API_KEY_FILE]")
    for field in _scalar_fields():
        flag = "--" + field.name.replace("_", "-")
        env = ENV_PREFIX + field.name.upper()
        help = f"{field.metadata['help']} [env {env}, default {field.default}]"
        if _kind(field) is bool:
            serve.add_argument(flag, dest=field.name, action="store_const", const="true", default=None, help=help)
            serve.add_argument("--no-" + flag[2:], dest=field.name, action="store_const", const="false",
                               help=f"turn {flag} off" + ("" if field.default else f" (the default, unless {env} "
                                                                                     "turns it on)"))
        else:
            serve.add_argument(flag, dest=field.name, default=None, metavar=field.name.upper(), help=help)
    return parser


def on_sagemaker(args: argparse.Namespace, environ: Mapping[str, str]) -> bool:
    return args.artifact == SAGEMAKER_START or "SAGEMAKER_BIND_TO_PORT" in environ


def platform(args: argparse.Namespace, environ: Mapping[str, str]) -> tuple[dict[str, tuple[str, str]],
                                                                            dict[str, str]]:
    """(settings the platform decides, as (value, variable); defaults it implies)."""
    decided: dict[str, tuple[str, str]] = {}
    implied: dict[str, str] = {}
    if on_sagemaker(args, environ):
        decided["port"] = (environ.get("SAGEMAKER_BIND_TO_PORT") or "8080", "SAGEMAKER_BIND_TO_PORT")
        implied.update(host="0.0.0.0", max_payload_bytes=str(SAGEMAKER_PAYLOAD_BYTES),
                       request_timeout=str(SAGEMAKER_TIMEOUT_S))
    vertex = {"port": "AIP_HTTP_PORT", "vertex_predict_route": "AIP_PREDICT_ROUTE",
              "vertex_health_route": "AIP_HEALTH_ROUTE"}
    if any(environ.get(variable) for variable in vertex.values()):
        decided.update((name, (environ[variable], variable)) for name, variable in vertex.items()
                       if environ.get(variable))
        implied.update(host="0.0.0.0", max_payload_bytes=str(VERTEX_PAYLOAD_BYTES))
    if environ.get("AWS_LAMBDA_RUNTIME_API"):
        decided["lambda_runtime_api"] = (environ["AWS_LAMBDA_RUNTIME_API"], "AWS_LAMBDA_RUNTIME_API")
        decided["host"] = ("127.0.0.1", "AWS_LAMBDA_RUNTIME_API")  # only the invocation loop talks to the server
        implied["max_payload_bytes"] = str(LAMBDA_PAYLOAD_BYTES)
    if environ.get("K_SERVICE") and environ.get("PORT"):  # Cloud Run and Knative
        decided["port"] = (environ["PORT"], "PORT")
        implied["host"] = "0.0.0.0"
    collector = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if collector:  # OpenTelemetry's own variables, as every SDK reads them
        implied["otlp_endpoint"] = collector
    return decided, implied


def settings_from(args: argparse.Namespace, environ: Mapping[str, str]) -> Settings:
    values: dict[str, Any] = {"api_keys": api_keys(args, environ)}
    decided, implied = platform(args, environ)
    for field in _scalar_fields():
        env = ENV_PREFIX + field.name.upper()
        flag_value = getattr(args, field.name)
        if flag_value is not None:
            values[field.name] = _parse(_kind(field), flag_value, "--" + field.name.replace("_", "-"))
        elif field.name in decided:
            values[field.name] = _parse(_kind(field), *decided[field.name])
        elif environ.get(env, "") != "":
            values[field.name] = _parse(_kind(field), environ[env], env)
        elif field.name in implied:
            values[field.name] = _parse(_kind(field), implied[field.name], f"the default of {field.name}")
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


def artifact_dir(args: argparse.Namespace, environ: Mapping[str, str]) -> str:
    """The artifact (or bundle) named, else SageMaker's model directory if it holds one, else INFINITY_ARTIFACT."""
    if args.artifact and args.artifact != SAGEMAKER_START:
        return str(args.artifact)
    if on_sagemaker(args, environ):
        model_dir = environ.get("SM_MODEL_DIR") or SAGEMAKER_MODEL_DIR
        if any((Path(model_dir) / name).is_file() for name in ("manifest.json", BUNDLE_FILE)):
            return model_dir
    artifact = environ.get(ENV_PREFIX + "ARTIFACT")
    if not artifact:
        raise StartupError("no artifact directory given")
    return artifact


def serve(directory: Path, settings: Settings, startup: Startup) -> int:
    from infinity.api.app import create_app
    from infinity.api.router import Router
    from infinity.http.server import bind, run

    if settings.grpc_port is not None:
        try:
            import infinity.grpc.server  # noqa: F401
        except ImportError as exc:
            raise StartupError(f"--grpc-port needs the grpc extra ({exc.name} is not installed): "
                               "pip install 'infinity-multiverse[grpc]'") from None
    startup.mark("imports")
    threads = settings.threads or physical_cores()
    try:
        settings = dataclasses.replace(settings, threads=threads)
    except ValueError as exc:  # engines beyond the physical cores
        raise StartupError(str(exc)) from None
    directory, selection = choose(directory, settings)  # a bundle: the target this CPU fits best
    check(directory, settings, selection)
    startup.mark("checks")
    model = open_checked(directory, settings, threads, startup)
    model.bundle = selection
    # the port is taken once the artifact has passed every check: a broken one is refused as such, whether or not
    # another process holds the port
    sock = bind(settings.host, settings.port)
    try:
        router = Router.build(model, settings)
        app = create_app(router)
        startup.mark("routes")
        return run(app, settings, sock, router, startup)
    finally:
        sock.close()


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    environ = os.environ if environ is None else environ
    startup = Startup()
    args = build_parser().parse_args(argv)
    if args.command == "embed":
        return corpus.run(args)
    try:
        settings = settings_from(args, environ)
        logs.setup(settings.log_level, settings.json_logs)
        warn_if_open(settings)
        return serve(Path(artifact_dir(args, environ)), settings, startup)
    except StartupError as exc:
        print(f"infinity: error: {exc}", file=sys.stderr)
        runtime_api = args.lambda_runtime_api or environ.get("AWS_LAMBDA_RUNTIME_API") or environ.get(
            ENV_PREFIX + "LAMBDA_RUNTIME_API")
        if runtime_api:
            from infinity.http import awslambda
            awslambda.init_error(runtime_api, str(exc))
        return 1
