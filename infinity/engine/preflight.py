"""Checks before serving: the artifact is intact, trusted, and runnable on this host."""
from __future__ import annotations

import logging
from pathlib import Path

import onnxruntime

from infinity.artifact import verify_present
from infinity.bundle import BUNDLE_FILE, BundleError, Selection, select
from infinity.engine import openvino
from infinity.engine.hostinfo import cpu_flags, missing_cpu_flags
from infinity.engine.model import LoadedModel
from infinity.engine.session import EngineError
from infinity.engine.tokenization import Encoded, pad_batch
from infinity.errors import StartupError
from infinity.manifest import Manifest, ManifestError
from infinity.settings import Settings
from infinity.startup import Startup
from infinity.tasks.base import WINDOWED

log = logging.getLogger("infinity.preflight")


def choose(directory: Path, settings: Settings) -> tuple[Path, Selection | None]:
    """The artifact to serve: `directory` itself, or where it holds a bundle, the target of it this CPU fits best
    (infinity/bundle.py; only bundle.json is read here, and nothing of the other targets ever)."""
    if not (directory / BUNDLE_FILE).is_file():
        return directory, None
    try:
        selection = select(directory, cpu_flags(), settings.allow_cpu_mismatch)
    except BundleError as exc:
        raise StartupError(str(exc)) from None
    if selection.fits:
        log.info("serving target %s of the bundle in %s: %s", selection.target.name, directory, selection.why)
    else:
        log.warning("serving target %s of the bundle in %s: %s", selection.target.name, directory, selection.why)
    return selection.directory, selection


def check(directory: Path, settings: Settings, selection: Selection | None = None) -> Manifest:
    """`selection`: the bundle target `directory` was chosen as (choose), which its manifest must be."""
    if not directory.is_dir():
        raise StartupError(f"{directory} is not a directory")
    try:
        manifest = Manifest.load(directory)
        if selection is not None:
            selection.check(manifest)
        verify_present(directory, manifest)  # the checksums are computed while the model loads (open_checked)
    except ManifestError as exc:
        raise StartupError(str(exc)) from None
    if not manifest.parity.passed:
        failures = "; ".join(manifest.parity.failures) or "no details recorded"
        if not settings.allow_failed_parity:
            raise StartupError(f"the artifact failed its parity check ({failures}); "
                               "pass --allow-failed-parity to serve it anyway")
        log.warning("serving an artifact that failed its parity check: %s", failures)
    prompts = manifest.task.prompts
    if settings.default_prompt_name is not None and settings.default_prompt_name not in prompts:
        raise StartupError(f"--default-prompt-name {settings.default_prompt_name!r} is not one of the model's prompts "
                           f"({', '.join(prompts) or 'it has none'})")
    missing = missing_cpu_flags(manifest.target.required_cpu_flags)
    if missing:
        message = f"this CPU lacks {', '.join(missing)}, required by the {manifest.target.name!r} target"
        if not settings.allow_cpu_mismatch:
            raise StartupError(f"{message}; pass --allow-cpu-mismatch to serve it anyway")
        log.warning("%s; serving anyway (--allow-cpu-mismatch)", message)
    if manifest.target.providers[0] == openvino.PROVIDER and (reason := openvino.unavailable()):
        raise StartupError(f"the {manifest.target.name!r} target's {manifest.model.precision} graph runs on "
                           f"OpenVINO, {reason}")
    available = [*onnxruntime.get_available_providers(), openvino.PROVIDER]
    absent = [p for p in manifest.target.providers if p not in available]
    if absent:
        raise StartupError(f"the {manifest.target.name!r} target needs {', '.join(absent)}, which this "
                           f"onnxruntime does not offer (available: {', '.join(available)})")
    return manifest


def open_checked(directory: Path, settings: Settings, threads: int, startup: Startup | None = None) -> LoadedModel:
    """Load an artifact that passed check(), its checksums verified, and make sure it runs what the manifest
    promises; `threads` are every engine's together."""
    try:
        # engines side by side share the cores: no worker of one spins on a core another needs
        model = LoadedModel.load(directory, threads=max(1, threads // settings.engines), verify=True,
                                 spin_wait=settings.spin_wait and settings.engines == 1,
                                 spin_wait_us=settings.spin_wait_us)
    except ManifestError as exc:
        raise StartupError(str(exc)) from None
    except Exception as exc:  # onnxruntime and tokenizers raise their own untyped errors
        first_line = (str(exc) or repr(exc)).splitlines()[0]
        raise StartupError(f"could not load the artifact: {first_line}") from None
    # onnxruntime lists a GPU provider whenever its library is installed, then quietly falls back to
    # the CPU if the device or its CUDA libraries are missing: check what the session really got.
    wanted = model.manifest.target.providers[0]
    if wanted not in model.engine.session.get_providers():
        raise StartupError(f"the {model.manifest.target.name!r} target needs {wanted}, which onnxruntime could "
                           "not create here (no GPU, or its CUDA libraries are missing)")
    if startup is not None:
        startup.mark("load")
    check_max_length(model)
    if startup is not None:
        startup.mark("max-length probe")
    check_chunking(model, settings)
    return model


def check_chunking(model: LoadedModel, settings: Settings) -> None:
    if settings.chunk_long_inputs and not model.task.windowed:
        why = {"feature-extraction": " and pools in its graph", "sparse-embedding": " with sum pooling"}
        raise StartupError(f"--chunk-long-inputs runs long texts in windows for {WINDOWED}; this artifact serves "
                           f"{model.task.name}" + why.get(model.task.name, ""))
    if model.task.windowed and settings.chunk_overlap >= model.tokenizer.window_tokens():
        raise StartupError(f"--chunk-overlap {settings.chunk_overlap} leaves no new tokens in a window of "
                           f"{model.tokenizer.window_tokens()} (the model's maximum length less its special tokens)")


def check_max_length(model: LoadedModel) -> None:
    """One input of the manifest's max_length must run: the server admits inputs up to it, so a model whose
    position embeddings are shorter would otherwise fail every batch holding a long input."""
    length = model.manifest.tokenizer.max_length
    probe = Encoded(ids=[model.tokenizer.pad_id] * length, type_ids=[0] * length, offsets=[(0, 0)] * length,
                    special=[0] * length)
    try:
        model.engine.run(pad_batch([probe], model.tokenizer.pad_id), quiet=True)
    except EngineError as exc:
        reason = str(exc).partition("Status Message: ")[2] or str(exc)
        raise StartupError(f"tokenizer.max_length {length} is more than the model accepts: one input of {length} "
                           f"tokens fails ({reason.splitlines()[0][:160]})") from None
