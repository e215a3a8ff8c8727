"""The parity search: nodes ranked on the texts full INT8 answers worst, then the fewest kept float, checked on all."""
from pathlib import Path

from optimize.stages.s5_draft.parity import ParityResult
from optimize.stages.s6_quantize.search import RANKING_INPUTS, keep_fewest_float

HARM = {"a": 0.001, "b": 0.02, "c": 0.0005, "d": 0.03, "e": 0.002}  # cosine a node costs when quantized


def test_the_most_harmful_nodes_stay_float_and_ranking_runs_on_the_hardest_texts(tmp_path):
    quantized: dict[Path, set[str]] = {}
    calls: list[list[int] | None] = []

    def write(path: Path, keep: list[str]) -> None:
        path.write_text("graph")
        quantized[path] = set(HARM) - set(keep)

    def evaluate(path: Path, only: list[int] | None = None) -> ParityResult:
        calls.append(only)
        cosine = 1 - sum(HARM[n] for n in quantized[path])
        texts = list(range(20))
        failures = [] if cosine >= 0.99 else [f"cosine_min = {cosine:.4f}, needs >= 0.99"]
        return ParityResult({"cosine_min": cosine}, {"cosine_min": 0.99}, failures, hardest=texts[::-1])

    result = keep_fewest_float(list(HARM), write, tmp_path / "final.onnx", evaluate, tmp_path, log=lambda _: None)
    assert set(result.kept_float) == {"d", "b"}  # the two that cost most; the other three together pass
    hardest = list(range(20))[::-1][:RANKING_INPUTS]
    assert calls[0] is None  # full INT8 on every search text
    assert calls[1:1 + len(HARM)] == [hardest] * len(HARM)  # one node at a time, on the texts answered worst
    assert all(only is None for only in calls[1 + len(HARM):])  # how many to keep: every text
    assert quantized[tmp_path / "final.onnx"] == {"a", "c", "e"}
