"""A model whose config maps to its own code runs only with --trust-remote-code; a native one never needs it."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from infinity.manifest import Manifest

CONFIGURATION = '''
from transformers import BertConfig


class TinyEncoderConfig(BertConfig):
    model_type = "tiny-encoder"
'''
MODELING = '''
from transformers import BertModel

from .configuration_tiny import TinyEncoderConfig


class TinyEncoderModel(BertModel):
    config_class = TinyEncoderConfig
'''


@pytest.fixture(scope="module")
def remote_model(tmp_path_factory) -> Path:
    """A tiny BERT published the way custom-code models are: its classes in .py files named by auto_map."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    from tests.models import minilm_dir, write_sentence_transformers

    out = tmp_path_factory.mktemp("remote") / "tiny-encoder"
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=64, max_position_embeddings=128, initializer_range=0.2)).save_pretrained(out)
    AutoTokenizer.from_pretrained(minilm_dir()).save_pretrained(out)
    (out / "configuration_tiny.py").write_text(CONFIGURATION)
    (out / "modeling_tiny.py").write_text(MODELING)
    config = json.loads((out / "config.json").read_text())
    config.update(model_type="tiny-encoder", architectures=["TinyEncoderModel"],
                  auto_map={"AutoConfig": "configuration_tiny.TinyEncoderConfig",
                            "AutoModel": "modeling_tiny.TinyEncoderModel"})
    (out / "config.json").write_text(json.dumps(config))
    write_sentence_transformers(out, 32, max_seq_length=128)
    return out


def multiverse(source: Path, out: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "optimize", "optimize", str(source), "--precision", "fp32",
                           "--out", str(out), *flags], capture_output=True, text=True)


def test_custom_code_is_refused_without_the_flag_and_names_it(remote_model, tmp_path):
    run = multiverse(remote_model, tmp_path / "out")
    assert run.returncode == 2 and not (tmp_path / "out").exists()
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "--trust-remote-code" in lines[0] and "TinyEncoderModel" in lines[0], run.stderr


def test_custom_code_runs_with_the_flag_and_the_manifest_says_so(remote_model, tmp_path):
    run = multiverse(remote_model, tmp_path / "out", "--trust-remote-code")
    assert run.returncode == 0, run.stderr
    manifest = Manifest.load(tmp_path / "out")
    assert manifest.source.trust_remote_code and manifest.source.model_type == "tiny-encoder"
    assert manifest.parity.passed and manifest.optimization.fusion_model_type is None


def test_a_native_architecture_ignores_the_custom_code(tmp_path):
    from optimize.stages.s1_load import runs_remote_code

    config = {"model_type": "nomic_bert", "architectures": ["NomicBertModel"],
              "auto_map": {"AutoModel": "nomic-ai/nomic-bert-2048--modeling_hf_nomic_bert.NomicBertModel"}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert runs_remote_code(tmp_path, trust_remote_code=False) is False
    assert runs_remote_code(tmp_path, trust_remote_code=True) is False
    config.update(model_type="bert", architectures=["JinaBertModel"])  # a BERT config with its own attention
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="--trust-remote-code"):
        runs_remote_code(tmp_path, trust_remote_code=False)
