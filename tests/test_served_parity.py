"""Parity as served: held-out texts, each input alone and inside mixed-length batches, and batch invariance."""
import numpy as np
import pytest

from infinity.engine.model import LoadedModel
from infinity.manifest import Manifest
from infinity.settings import Settings
from optimize.stages.s5_draft.served import PADDING_BOUND, mixed_batches, run_served
from optimize.tasks import task_for

TASKS = ("feature-extraction", "sequence-classification", "token-classification", "ranking")
# The INT8 test model per task (see test_optimize.INT8_CASES).
INT8_MODELS = {"feature-extraction": "minilm", "sequence-classification": "distilbert-tiny",
               "token-classification": "token-classification", "ranking": "ranking"}
FLOAT_TOLERANCE = 1e-5  # fp32 kernels may block a batch differently from a single row


@pytest.mark.parametrize("task", TASKS)
def test_heldout_texts_are_many_varied_and_apart_from_what_the_optimizer_tunes_on(task):
    heldout = task_for(task).heldout()
    assert len(heldout) >= 200 and len(set(heldout)) >= 0.95 * len(heldout)
    assert not set(heldout) & (set(task_for(task).probes()) | set(task_for(task).calibration()))
    assert heldout == task_for(task).heldout()  # reproducible
    texts = [t for item in heldout for t in (item if isinstance(item, tuple) else (item,))]
    words = [len(t.split()) for t in texts]
    assert min(words) == 1 and max(words) > 300  # one token to beyond any maximum length
    assert any("def " in t or "SELECT" in t for t in texts)  # code
    assert any(any("\u4e00" <= c <= "\u9fff" for c in t) for t in texts)  # CJK
    assert any(any("\u0400" <= c <= "\u04ff" for c in t) for t in texts)  # Cyrillic


def test_batches_respect_the_servers_row_and_token_limits():
    lengths = [3, 256, 17, 256, 1, 90] * 20
    settings = Settings(max_batch_size=8, max_inputs_per_request=8, max_batch_tokens=1024)
    batches = mixed_batches(lengths, settings)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for batch in batches:
        padded = len(batch) * max(lengths[i] for i in batch)
        assert len(batch) <= 8 and padded <= 1024
        assert len(batch) == 1 or padded <= PADDING_BOUND * sum(lengths[i] for i in batch)
    assert any(len({lengths[i] for i in b}) > 2 for b in batches)  # lengths are mixed


@pytest.mark.parametrize("precision", ["int8", "fp32"])
@pytest.mark.parametrize("task", TASKS)
def test_an_answer_does_not_depend_on_its_batch(artifact_for, task, precision):
    """Run again here, not read from the manifest: the recipe's promise is checked against the served model."""
    path = artifact_for(task, precision, model=INT8_MODELS[task])
    manifest = Manifest.load(path)
    recorded = manifest.parity.batch_invariance
    quantization = manifest.optimization.quantization
    if precision == "int8":
        assert quantization and quantization.batch_invariant, "every INT8 test artifact uses the per-token recipe"
    bound = 0.0 if precision == "int8" else FLOAT_TOLERANCE  # per-token INT8 promises bit-identical answers
    assert recorded["largest_batch"] > 8 and recorded["max_abs_diff"] <= bound
    model = LoadedModel.load(path, threads=2, providers=["CPUExecutionProvider"], spin_wait=False)
    inputs = task_for(task).heldout()[::3]
    outputs = run_served(task_for(task), model, inputs)
    worst = max(float(np.abs(a - b).max()) for a, b in zip(outputs.alone, outputs.batched))
    assert outputs.batch_rows > 8
    assert worst <= bound, (task, precision, worst)
    assert recorded["max_abs_diff"] <= bound
    if task == "feature-extraction":
        assert recorded["cosine_min"] >= 1 - 1e-6


@pytest.mark.parametrize("task", TASKS)
def test_manifest_parity_is_the_worse_of_alone_and_batched(artifact_for, task):
    parity = Manifest.load(artifact_for(task, "int8", model=INT8_MODELS[task])).parity
    assert parity.passed and parity.probe_size >= 200
    for name, value in parity.metrics.items():
        pick = max if name.startswith("max_") or name == "tokenization_mismatches" else min
        assert value == pick(parity.modes["alone"][name], parity.modes["batched"][name])
