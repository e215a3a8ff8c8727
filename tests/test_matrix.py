"""Every encoder family through the real pipeline: a tiny model of each, built from its transformers config,
optimized at fp32 and INT8, served over HTTP and compared with PyTorch FP32."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import onnx
import pytest

from infinity.manifest import Manifest
from optimize.attention.padding_mask import MASK
from tests.models import FAMILIES
from tests.servers import running

TEXTS = ["What is the capital of France?", "Paris is the capital and largest city of France.",
         "Der Zug nach Hamburg hat heute vierzig Minuten Verspätung.", "def f(x): return x * 2",
         "a " * 150 + "long text beyond the maximum length"]
PAIR = {"text": "Where is Berlin?", "text_pair": "Berlin is the capital of Germany."}
# Families whose attention onnxruntime fuses into one Attention node per layer (the rest: docs/models.md).
ATTENTION_FUSED = {"bert", "distilbert", "roberta", "xlm-roberta", "camembert", "electra"}
# attention written out in the export (a position bias, rotary Q and K, albert's shared layers past the first),
# made ONNX's Attention by the optimizer's own rewrite; deberta-v2's disentangled attention stays as exported
WRITTEN_ATTENTION = {"albert": 1, "mpnet": 2, "modernbert": 2, "nomic_bert": 2, "gte": 2, "jina_embeddings_v3": 2}
TASKS = ("feature-extraction", "sequence-classification")
# of those, the layers whose mask is the padding alone (modernbert's sliding layer masks a window too)
PADDING_MASKED = {"albert": 1, "mpnet": 2, "modernbert": 1, "nomic_bert": 2, "gte": 2, "jina_embeddings_v3": 2}


def served_embeddings(artifact: Path, log: Path) -> np.ndarray:
    with running(artifact, log) as server:
        response = httpx.post(f"{server.url}/predict", json={"inputs": TEXTS}, timeout=60)
    assert response.status_code == 200, response.text
    return np.array(response.json())


@pytest.mark.parametrize("family", FAMILIES)
def test_family_serves_the_embeddings_sentence_transformers_computes(family, family_artifact, tmp_path):
    from sentence_transformers import SentenceTransformer

    source, artifact = family_artifact(family, "feature-extraction", "fp32")
    manifest = Manifest.load(artifact)
    assert manifest.source.model_type == family and manifest.parity.passed
    assert manifest.task.pooling == "mean"
    ours = served_embeddings(artifact, tmp_path / "server.log")
    reference = SentenceTransformer(str(source), device="cpu").encode(TEXTS)
    cosine = (ours * reference).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(reference, axis=1)
    assert cosine.min() >= 0.9999, cosine


@pytest.mark.parametrize("family", FAMILIES)
def test_family_serves_the_probabilities_transformers_computes(family, family_artifact, tmp_path):
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    source, artifact = family_artifact(family, "sequence-classification", "fp32")
    assert Manifest.load(artifact).parity.passed
    with running(artifact, tmp_path / "server.log") as server:
        answers = [httpx.post(f"{server.url}/predict", json={"inputs": inputs}, timeout=60).json()
                   for inputs in (TEXTS, PAIR)]
    served = [*answers[0], answers[1]]
    tokenizer = AutoTokenizer.from_pretrained(source)
    model = AutoModelForSequenceClassification.from_pretrained(source).eval()
    takes_segments = (getattr(model.config, "type_vocab_size", 0) or 0) >= 2
    expected = []
    with torch.no_grad():
        for args in [(text,) for text in TEXTS] + [(PAIR["text"], PAIR["text_pair"])]:
            encoded = tokenizer(*args, truncation=True, max_length=Manifest.load(artifact).tokenizer.max_length,
                                return_tensors="pt")
            if not takes_segments:  # one segment embedding: a pair's second text is segment 0 too
                encoded.pop("token_type_ids", None)
            expected.append(model(**encoded).logits.softmax(-1)[0].numpy())
    labels = model.config.id2label
    for want, have in zip(expected, served):
        got = {item["label"]: item["score"] for item in have}
        assert np.abs(np.array([got[labels[i]] for i in range(len(want))]) - want).max() <= 1e-4


@pytest.mark.parametrize("family", FAMILIES)
def test_family_fuses_what_onnxruntime_can_and_records_the_rest(family, family_artifact):
    artifact = family_artifact(family, "feature-extraction", "fp32")[1]
    manifest = Manifest.load(artifact)
    fusion = manifest.optimization.fusion
    assert manifest.optimization.fusion_model_type == "bert"
    assert fusion.get("SkipLayerNormalization", 0) >= 2, fusion  # every family fuses its residual LayerNorms
    graph = onnx.load(str(artifact / manifest.model.file), load_external_data=False).graph
    written = [node for node in graph.node if node.op_type == "Attention" and node.domain == ""]
    assert len(written) == WRITTEN_ATTENTION.get(family, 0), fusion
    # every one reads its projections merged, [batch, sequence, hidden] (a rotary family's turned before the split)
    assert all(any(a.name == "q_num_heads" for a in node.attribute) for node in written)
    # transformers' padding mask, found by what it computes, in seven operators instead of its export's 30-odd
    made = {output: node for node in graph.node for output in node.output}
    assert sum(_padding_read(made, node.input[3]) for node in written) == PADDING_MASKED.get(family, 0), family
    said = [note for note in manifest.optimization.notes if "padding mask" in note]
    assert len(said) == (family in PADDING_MASKED), manifest.optimization.notes
    if family in ATTENTION_FUSED or family in WRITTEN_ATTENTION:
        assert fusion["Attention"] == 2 and not manifest.optimization.fusion_gaps, fusion
    else:
        assert any("attention not fused" in gap for gap in manifest.optimization.fusion_gaps), fusion


def _padding_read(made: dict[str, onnx.NodeProto], term: str) -> bool:
    """Whether the sum of terms an Attention adds to its scores reads the padding mask written_attention makes."""
    node = made.get(term)
    if term == MASK:
        return True
    return node is not None and node.op_type == "Add" and any(_padding_read(made, name) for name in node.input)


@pytest.mark.slow
@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("family", FAMILIES)
def test_family_builds_an_int8_artifact_with_its_parity_recorded(family, task, family_artifact, tmp_path):
    _, artifact = family_artifact(family, task, "int8")
    manifest = Manifest.load(artifact)
    assert manifest.model.precision == "int8" and manifest.optimization.quantization.candidates > 0
    assert manifest.parity.passed == (not manifest.parity.failures)  # passed, or failed and says why
    if task == "feature-extraction":
        args = () if manifest.parity.passed else ("--allow-failed-parity",)
        with running(artifact, tmp_path / "server.log", *args) as server:
            response = httpx.post(f"{server.url}/predict", json={"inputs": TEXTS}, timeout=60)
        assert response.status_code == 200 and np.isfinite(response.json()).all()


def test_an_encoder_decoder_is_refused_in_one_line(tmp_path):
    from transformers import AutoTokenizer, T5Config, T5Model

    from tests.models import minilm_dir

    source = tmp_path / "t5"
    T5Model(T5Config(vocab_size=30522, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=4)).save_pretrained(source)
    AutoTokenizer.from_pretrained(minilm_dir()).save_pretrained(source)
    run = subprocess.run([sys.executable, "-m", "optimize", "optimize", str(source), "--precision", "fp32",
                          "--out", str(tmp_path / "out")], capture_output=True, text=True)
    assert run.returncode == 2
    errors = [line for line in run.stderr.splitlines() if line.startswith("multiverse")]
    assert len(errors) == 1 and "encoder-decoder" in errors[0] and "Traceback" not in run.stderr, run.stderr
