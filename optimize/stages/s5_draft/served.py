"""Run a graph the way the server runs it, through its LoadedModel (tokenizer, padding, engine, the task's
reduction and answer): each input alone and inside mixed-length padded batches up to the server's batch limits.
"""
from __future__ import annotations

import dataclasses
import os
import random
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from infinity.api import operation_for
from infinity.api.operations.base import Parsed
from infinity.engine import openvino
from infinity.engine.batcher import overfull
from infinity.engine.model import LoadedModel, artifact_tokenizer
from infinity.engine.session import Engine
from infinity.engine.tokenization import Encoded, TextInput, TextTokenizer
from infinity.manifest import Manifest
from infinity.settings import Settings
from infinity.tasks import make_task
from infinity.tasks.feature_extraction import l2_normalize
from optimize.graph.onnxio import external_files
from optimize.measure.agreement import Outputs, ParityResult
from optimize.stages.s5_draft.parity import batch_invariance, compare, worst
from optimize.tasks.base import OptimizerTask
from optimize.tasks.hybrid_embedding import HybridAnswer

SHUFFLE_SEED = 7
DEFAULTS = Settings()  # frozen: the server's defaults, shared
CANDIDATE = ".candidate.onnx"
# A shuffled batch closes before it holds more than this many padded tokens per real one: past that, a batch is
# mostly padding, says nothing more about an answer's batch invariance, and cost most of the check's time (mpnet's
# held-out texts: 84,480 padded tokens for 16,787 real ones and 88 s, against 43,358 and 41 s at this bound).
PADDING_BOUND = 3
CPU = "CPUExecutionProvider"


@dataclass
class ServedOutputs:
    alone: Outputs    # each input as its own request and batch
    batched: Outputs  # each input inside shuffled, mixed-length batches of other requests
    batch_rows: int   # the largest batch it ran in


def load_candidate(directory: Path, manifest: Manifest, model_path: Path, threads: int = 0,
                   tokenizer: TextTokenizer | None = None, providers: list[str] | None = None) -> LoadedModel:
    """The server's LoadedModel for a graph not packaged yet, with the artifact's tokenizer (`tokenizer`, when
    it is loaded already) and task facts, on `providers` (default: the CPU's). The graph is linked (or copied)
    into `directory` as CANDIDATE: an artifact names only files inside itself."""
    candidate = directory / CANDIDATE
    candidate.unlink(missing_ok=True)
    _link(model_path, candidate)
    # Its weights file too, under the name the graph gives it (none of the artifact's own names).
    weights = [directory / name for name in external_files(model_path)
               if not (directory / name).exists() or not (directory / name).samefile(model_path.parent / name)]
    for path in weights:
        _link(model_path.parent / path.name, path)
    manifest = dataclasses.replace(manifest, model=dataclasses.replace(manifest.model, file=CANDIDATE))
    tokenizer = tokenizer or artifact_tokenizer(directory, manifest)
    engine = Engine(directory, manifest, threads=threads or None, providers=providers or [CPU], spin_wait=False)
    candidate.unlink()  # the session holds the graph in memory
    for path in weights:
        path.unlink()
    return LoadedModel(directory, manifest, tokenizer, engine, make_task(manifest, directory))


def target_providers(manifest: Manifest) -> list[str] | None:
    """A GPU target's (or OpenVINO's) providers where this onnxruntime offers its first one: its parity is then
    measured on what serves it (fp16 arithmetic on the GPU, not fp16 weights in fp32 arithmetic on the CPU)."""
    wanted = manifest.target.providers
    offered = wanted[0] in ort.get_available_providers() or (wanted[0] == openvino.PROVIDER
                                                             and openvino.unavailable() is None)
    return wanted if wanted[0] != CPU and offered else None


def on_target(manifest: Manifest, load: Callable[[list[str]], LoadedModel]) -> LoadedModel:
    """`load` (given the providers) on the target's own provider where this host can create it, else on the CPU's.
    onnxruntime lists a GPU provider whenever its library is installed and falls back to the CPU when the device
    or its CUDA libraries are missing: the session says what it got."""
    providers = target_providers(manifest)
    if providers:
        model = load(providers)
        if provider(model) == providers[0]:
            return model
    return load([CPU])


def load_as_served(directory: Path, manifest: Manifest, model_path: Path, threads: int = 0,
                   tokenizer: TextTokenizer | None = None) -> LoadedModel:
    """load_candidate as the target is served (on_target)."""
    return on_target(manifest, lambda providers: load_candidate(directory, manifest, model_path, threads, tokenizer,
                                                                providers))


def provider(model: LoadedModel) -> str:
    """The execution provider a model's session runs on first."""
    return str(model.engine.session.get_providers()[0])


def _link(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def run_served(task: OptimizerTask, model: LoadedModel, inputs: list[TextInput], settings: Settings = DEFAULTS,
               alone: bool = True, values: Mapping[str, Any] | None = None) -> ServedOutputs:
    """Each input alone (a batch of one, as a lone request runs) and inside the inputs shuffled into
    mixed-length batches filled as the batcher fills them; both through the model's tokenizer and forward
    (padding, engine, the task's reduction), and each row through the operation's answer with /predict's parameters
    `values` (every default where absent), as the model's task reads it. `alone` False, for a graph whose answers
    cannot depend on their batch: batched only, in batches of like lengths (the least padding), and `alone` answers
    the same."""
    operation = operation_for(model.task)
    params = operation.params(values)

    def answered(row: np.ndarray, item: Encoded) -> Any:
        return task.served_values(operation.answer(row[None], [item], Parsed([], params)), row, item)

    encoded = model.encode(operation.request(Parsed(inputs, params)))
    singles = [answered(model.forward([e])[0], e) for e in encoded] if alone else []
    batched: list[Any] = [None] * len(inputs)
    largest = 0
    for indices in mixed_batches([len(e) for e in encoded], settings, shuffled=alone):
        largest = max(largest, len(indices))
        rows = model.forward([encoded[i] for i in indices])
        for row, i in zip(rows, indices):
            batched[i] = answered(row, encoded[i])
    return ServedOutputs(singles if alone else batched, batched, largest)


def mixed_batches(lengths: list[int], settings: Settings, shuffled: bool = True) -> list[list[int]]:
    """Shuffled batches filled as the server's batcher fills them: up to max_batch_size rows and
    max_batch_tokens padded tokens (rows x longest), and at most PADDING_BOUND padded tokens per real one;
    `shuffled` False: filled in order of length."""
    order = list(range(len(lengths)))
    if shuffled:
        random.Random(SHUFFLE_SEED).shuffle(order)
    else:
        order.sort(key=lengths.__getitem__)
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        rows, longest = len(current) + 1, max([lengths[j] for j in current] + [lengths[i]])
        real = sum(lengths[j] for j in current) + lengths[i]
        if current and (overfull(rows, longest, settings.max_batch_size, settings.max_batch_tokens)
                        or rows * longest > PADDING_BOUND * real):
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


def embedding_ranges(task: OptimizerTask, model: LoadedModel, inputs: list[TextInput]) -> dict[str, list[list[float]]]:
    """Each dimension's [minimums, maximums] over the vectors the server answers for `inputs`, normalized and not:
    the ranges of int8 and uint8 embeddings."""
    answers = run_served(task, model, inputs, alone=False, values={"normalize": False}).batched
    rows = np.stack([a.dense if isinstance(a, HybridAnswer) else a for a in answers])
    ranges = {}
    for name, vectors in (("normalized", l2_normalize(rows)), ("unnormalized", rows)):
        ranges[name] = [vectors.min(axis=0).tolist(), vectors.max(axis=0).tolist()]
    return ranges


@dataclass
class ServedParity:
    result: ParityResult                 # each metric at its worse value of alone and batched
    modes: dict[str, dict[str, float]]   # the metrics of each way of serving
    batch_invariance: dict[str, float]
    provider: str                        # the execution provider the answers came from


def served_parity(task: OptimizerTask, model: LoadedModel, inputs: list[TextInput], reference: Outputs,
                  thresholds: dict[str, float], settings: Settings = DEFAULTS, alone: bool = True) -> ServedParity:
    """`alone` False (for a graph whose answers cannot depend on their batch, while it is searched for): batched
    only, in batches of like lengths, a fraction of the time; the artifact's own check always runs both."""
    outputs = run_served(task, model, inputs, settings, alone)
    single = compare(task, reference, outputs.alone, inputs, thresholds)
    batched = compare(task, reference, outputs.batched, inputs, thresholds)
    invariance = {**batch_invariance(task, outputs.alone, outputs.batched), "largest_batch": float(outputs.batch_rows)}
    return ServedParity(worst(single, batched), {"alone": single.metrics, "batched": batched.metrics}, invariance,
                        provider(model))
