"""Ranking: a cross-encoder's score of each (query, document) pair, against sentence-transformers' CrossEncoder; or
a causal language model's odds of "yes" after its model card's prompt (Qwen3-Reranker), against that formula."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from infinity.engine.tokenization import Encoded, TextInput
from infinity.manifest import Reranker, TaskFacts, TaskName
from optimize.checkpoint import Checkpoint, Module, read_json
from optimize.measure import agreement
from optimize.measure.agreement import Outputs
from optimize.tasks.base import ClassifierHead, SourceModel, UnsupportedModel, head, labels, output_hook

if TYPE_CHECKING:
    pass

# Ranking prompts of causal rerankers, as their model cards give them.
RERANKERS: dict[str, dict[str, str]] = {
    "qwen3": {
        "prefix": "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the "
                  "Instruct provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n"
                  "<|im_start|>user\n",
        "suffix": "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
        "template": "<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}",
        "instruction": "Given a web search query, retrieve relevant passages that answer the query",
        "true_token": "yes", "false_token": "no"},
}
RERANKER_FIELDS = ("prefix", "suffix", "template", "instruction", "true_token", "false_token")


class RankingTask(ClassifierHead):
    name = TaskName.RANKING
    texts = "pairs"
    metrics = ("spearman_mean", "spearman_min", "top1_agreement", "top1_agreement_strict", "max_score_diff")
    thresholds = {"spearman_mean": 0.95, "top1_agreement": 0.99}
    auto_model = "AutoModelForSequenceClassification"

    def facts(self, checkpoint: Checkpoint, pooling: str | None,
              reranker: str | dict[str, str] | None) -> tuple[TaskFacts, list[Module]]:
        if causal(checkpoint.config):
            prompt = reranker_prompt(checkpoint.path, checkpoint.tokenizer, reranker)
            return TaskFacts(score_activation="sigmoid", reranker=prompt), []
        id2label = labels(checkpoint.config)
        if len(id2label) != 1:
            raise ValueError(f"ranking needs a cross-encoder with one output label; this model has {len(id2label)}")
        return TaskFacts(score_activation="sigmoid", id2label=id2label), []

    def model_class(self, source: SourceModel) -> Any:
        if source.facts.reranker is None:
            return super().model_class(source)
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM

    def refuse_missing(self, source: SourceModel, missing: str) -> None:
        if source.facts.reranker is None:
            super().refuse_missing(source, missing)

    def graph(self, model: Any, source: SourceModel) -> tuple[Any, str]:
        if source.facts.reranker is None:
            return None, "logits"
        return reranker_model(model, source.facts.reranker), "logits"

    def reference(self, source: SourceModel, inputs: list[TextInput]) -> Outputs:
        if source.facts.reranker is not None:
            return self.causal_scores(source, inputs)
        from sentence_transformers import CrossEncoder

        model = CrossEncoder(str(source.path), device="cpu", max_length=source.max_length,
                             trust_remote_code=source.trust_remote_code)
        return list(np.asarray(model.predict(inputs, batch_size=8), dtype=np.float32).reshape(-1))

    def causal_scores(self, source: SourceModel, inputs: list[TextInput]) -> Outputs:
        """A causal reranker's model-card formula: prefix + filled-in template (cut to what the prompt leaves of the
        maximum length) + suffix, padded on the left, and P(true token) against the false one at the last
        position."""
        import torch

        reranker, tokenizer = source.facts.reranker, source.tokenizer
        assert reranker is not None
        model = self.load_model(source)
        prefix = tokenizer.encode(reranker.prefix, add_special_tokens=False)
        suffix = tokenizer.encode(reranker.suffix, add_special_tokens=False)
        scores: list[np.ndarray] = []
        padding_side, tokenizer.padding_side = tokenizer.padding_side, "left"
        try:
            for start in range(0, len(inputs), 8):
                texts = [reranker.template.format(instruction=reranker.instruction, query=pair[0], document=pair[1])
                         for pair in inputs[start:start + 8] if isinstance(pair, tuple)]
                middle = tokenizer(texts, padding=False, truncation="longest_first", return_attention_mask=False,
                                   max_length=source.max_length - len(prefix) - len(suffix))["input_ids"]
                batch = tokenizer.pad({"input_ids": [prefix + ids + suffix for ids in middle]}, padding=True,
                                      return_tensors="pt")
                with torch.no_grad():
                    last = model(**batch).logits[:, -1, :]
                pair = torch.stack([last[:, reranker.false_token_id], last[:, reranker.true_token_id]], dim=1)
                scores.extend(torch.log_softmax(pair.float(), dim=1)[:, 1].exp().numpy())
        finally:
            tokenizer.padding_side = padding_side
        return [np.float32(score) for score in scores]

    def reference_name(self, source: SourceModel) -> str:
        if source.facts.reranker is not None:
            return ("transformers causal LM: P(true token) against the false one at the last token, as its model "
                    "card computes it, PyTorch FP32")
        return "sentence-transformers CrossEncoder, PyTorch FP32"

    def measure(self, reference: Outputs, candidate: Outputs, inputs: list[TextInput]) -> dict[str, float]:
        return agreement.ranking(reference, candidate, group_sizes(inputs) or [len(reference)])

    def served_values(self, answer: Any, row: np.ndarray, item: Encoded) -> Any:
        return answer.scores[0].astype(np.float32)


def group_sizes(inputs: list[TextInput]) -> list[int]:
    """Sizes of the runs of consecutive pairs that share a query: each run is ranked on its own."""
    sizes: list[int] = []
    previous = None
    for pair in inputs:
        query = pair[0] if isinstance(pair, tuple) else pair
        if query == previous:
            sizes[-1] += 1
        else:
            sizes.append(1)
        previous = query
    return sizes


def causal(config: Any) -> bool:
    return any(str(name).endswith("ForCausalLM") for name in getattr(config, "architectures", None) or [])


def reranker_prompt(path: Path, tokenizer: Any, given: str | dict[str, str] | None) -> Reranker:
    """A causal reranker's prompt: never guessed, its tokens checked against the tokenizer."""
    if given is None:
        raise ValueError(f"{path.name} is a causal language model: ranking with it needs its prompt; pass "
                         f"--reranker-template with {' or '.join(RERANKERS)} (its model card's prompt) or a JSON file "
                         f"with {', '.join(RERANKER_FIELDS)}")
    if isinstance(given, dict):
        fields = given
    elif given in RERANKERS:
        fields = RERANKERS[given]
    elif Path(given).is_file():
        fields = read_json(Path(given))
    else:
        raise ValueError(f"--reranker-template {given!r} is neither {' nor '.join(RERANKERS)} nor a JSON file")
    missing = [name for name in RERANKER_FIELDS if not isinstance(fields.get(name), str)]
    if missing:
        raise ValueError(f"the reranker template lacks {', '.join(missing)} (each a string)")
    try:
        fields["template"].format(instruction="", query="", document="")
    except (KeyError, IndexError, ValueError) as exc:
        raise ValueError(f"the reranker template may name only {{instruction}}, {{query}} and {{document}}: "
                         f"{exc!r}") from None
    ids = []
    for role in ("true_token", "false_token"):
        token_id = tokenizer.convert_tokens_to_ids(fields[role])
        if token_id is None or token_id == tokenizer.unk_token_id:
            raise ValueError(f"the reranker's {role} {fields[role]!r} is not one token of {path.name}'s tokenizer")
        ids.append(int(token_id))
    return Reranker(prefix=fields["prefix"], suffix=fields["suffix"], template=fields["template"],
                    instruction=fields["instruction"], true_token=fields["true_token"],
                    false_token=fields["false_token"], true_token_id=ids[0], false_token_id=ids[1])


def reranker_model(model: Any, reranker: Reranker) -> Any:
    """A causal LM as a reranker, one torch module: (attention mask, inputs) -> batch x 1, the log-odds of the true
    token over the false one after each row's last real token (the server pads on the right). The language-model
    head multiplies that one position by those two rows of its weights only: no batch x tokens x vocabulary
    logits."""
    import torch

    lm_head = model.get_output_embeddings()
    if not isinstance(lm_head, torch.nn.Linear):
        raise UnsupportedModel(f"model type {model.config.model_type!r} has no linear language-model head to score "
                               "its yes and no tokens with")
    tokens = torch.tensor([reranker.true_token_id, reranker.false_token_id])

    def forward(module: Any, attention_mask: torch.Tensor, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        def odds(linear: torch.nn.Linear, args: tuple[torch.Tensor, ...], _: torch.Tensor) -> torch.Tensor:
            hidden = args[0]
            last = hidden[torch.arange(hidden.shape[0]), attention_mask.sum(dim=1) - 1]
            logits = last @ linear.weight[tokens].t()
            if linear.bias is not None:
                logits = logits + linear.bias[tokens]
            return (logits[:, 0] - logits[:, 1]).reshape(-1, 1, 1)

        with output_hook(lm_head, odds):
            scores: torch.Tensor = module.model(**inputs).logits[:, 0]
        return scores

    return head(model, forward)
