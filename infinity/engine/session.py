"""One onnxruntime session for one artifact."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnxruntime as ort

from infinity.artifact import artifact_file
from infinity.engine import openvino
from infinity.engine.tokenization import Batch
from infinity.manifest import Manifest
from infinity.settings import SPIN_WAIT_US

QUIET = ort.RunOptions()
QUIET.log_severity_level = 4  # fatal only


NODE_NAME = re.compile(r" ?Name:'[^']*'")
# CPU artifacts write their residual LayerNorms as Add + LayerNormalization, which onnxruntime's CPU kernels run
# faster than the SkipLayerNormalization this fusion would make of them again at load, from about 64 rows up
# (mpnet INT8, fused / unfused time: 0.94 at 1 x 8, 1.05 at 8 x 128; docs/models.md).
DISABLED_OPTIMIZERS = ["SkipLayerNormFusion"]


class EngineError(RuntimeError):
    """The model failed to run a batch."""


def session_options(threads: int | None = None, spin_wait: bool = True,
                    spin_wait_us: int = SPIN_WAIT_US) -> ort.SessionOptions:
    """How the server runs a graph; the optimizer times its graphs the same way."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if threads:
        options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    if not spin_wait:
        # Idle workers sleep at once instead of spinning: for cores shared with other processes.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    else:
        options.add_session_config_entry("session.intra_op.spin_duration_us", str(spin_wait_us))
    return options


class Engine:
    def __init__(self, directory: Path | str, manifest: Manifest, threads: int | None = None,
                 providers: list[str] | None = None, spin_wait: bool = True,
                 spin_wait_us: int = SPIN_WAIT_US) -> None:
        if hasattr(ort, "disable_telemetry_events"):
            ort.disable_telemetry_events()  # no usage events leave the server
        options = session_options(threads, spin_wait, spin_wait_us)
        providers = providers or manifest.target.providers
        path = str(artifact_file(directory, manifest.model.file))
        if providers[0] == openvino.PROVIDER:
            openvino.attach(options, manifest.target.provider_options.get(openvino.PROVIDER, {}), threads)
            self.session = ort.InferenceSession(path, options, disabled_optimizers=DISABLED_OPTIMIZERS)
        else:
            provider_options = [manifest.target.provider_options.get(p, {}) for p in providers]
            self.session = ort.InferenceSession(path, options, providers=providers, provider_options=provider_options,
                                                disabled_optimizers=DISABLED_OPTIMIZERS)
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_name = self.session.get_outputs()[0].name

    def run(self, batch: Batch, quiet: bool = False) -> np.ndarray:
        """quiet: a failure is only raised, not also logged by onnxruntime (for probes whose failure is an answer)."""
        feeds = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask,
                 "token_type_ids": batch.token_type_ids}
        inputs = {name: feeds[name] for name in self.input_names}
        try:
            if quiet:
                outputs: list[np.ndarray] = self.session.run([self.output_name], inputs, QUIET)
            else:
                outputs = self.session.run([self.output_name], inputs)
            return outputs[0]
        except Exception as exc:  # onnxruntime raises its own untyped errors
            # clients get onnxruntime's reason, not the graph's node names (its own log line keeps those)
            raise EngineError(f"inference failed: {NODE_NAME.sub('', str(exc))}") from exc
