"""OpenVINO as a second engine behind onnxruntime: the `onnxruntime-ep-openvino` plugin (the `openvino` extra)
registers with stock onnxruntime and runs the artifact's ONNX graph, so the artifact stays ONNX and the session
stays onnxruntime's. A plugin provider is not in onnxruntime's provider list: it is attached to the session
options for the CPU device it enumerates. Its precision and threads are OpenVINO properties passed as its
`load_config` (it ignores them as provider options)."""
from __future__ import annotations

import json

import onnxruntime as ort

from infinity.engine.hostinfo import cpu_name

PROVIDER = "OpenVINOExecutionProvider"
EXTRA = "pip install 'infinity-multiverse[openvino]'"


class MissingEngine(RuntimeError):
    """The artifact runs on OpenVINO and its plugin is not installed."""


def installed() -> bool:
    try:
        import onnxruntime_ep_openvino  # noqa: F401
    except ImportError:
        return False
    return True


def unavailable() -> str | None:
    """Why OpenVINO cannot run a graph here, as the end of a sentence about what runs on it ("... runs on OpenVINO,
    whose ..."); None where it can."""
    if not installed():
        return f"whose onnxruntime plugin is not installed: {EXTRA}"
    if not _devices():
        # measured: onnxruntime-ep-openvino 1.8.1 enumerates no device on an AMD EPYC (Zen 5), where OpenVINO
        # itself lists the CPU
        return (f"whose onnxruntime plugin offers no device for this CPU ({cpu_name()}): build and serve it on an "
                "Intel host")
    return None


def _devices() -> list[ort.OrtEpDevice]:
    import onnxruntime_ep_openvino as plugin

    if not any(device.ep_name == PROVIDER for device in ort.get_ep_devices()):
        ort.register_execution_provider_library(PROVIDER, plugin.get_library_path())
    # the plugin lists one device per OpenVINO device (and AUTO); the CPU's is the one named as the provider
    return [device for device in ort.get_ep_devices()
            if device.ep_name == PROVIDER and device.device.type == ort.OrtHardwareDeviceType.CPU]


def attach(options: ort.SessionOptions, properties: dict[str, str | int | bool], threads: int | None) -> None:
    """Run the session's graph on OpenVINO's CPU plugin with `properties` (INFERENCE_PRECISION_HINT, ...)."""
    # the whole graph or nothing: a node OpenVINO does not take would run apart on onnxruntime's CPU provider, in
    # fp32, between copies (mpnet's fused attention: 0.73x OpenVINO's own time); the session then fails to load
    options.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    config = {key: str(value) for key, value in properties.items()}
    if threads:
        config["INFERENCE_NUM_THREADS"] = str(threads)
    reason = unavailable()
    if reason is not None:
        raise MissingEngine(f"this artifact runs on OpenVINO ({PROVIDER}), {reason}")
    options.add_provider_for_devices(_devices(), {"load_config": json.dumps({"CPU": config})})
