"""The validate stage's body: held-out parity as served, on the provider that serves the target where this host has
it, alone and batched; the answers' ranges for int8 and uint8 embeddings; a build that fails parity refused."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from infinity.engine.tokenization import TextTokenizer
from infinity.manifest import Manifest, Precision, TaskFacts
from optimize.measure.agreement import ParityResult
from optimize.options import Plan
from optimize.stages.s4_reference import References
from optimize.stages.s5_draft.served import CPU, ServedParity, embedding_ranges, load_as_served, served_parity


class ParityFailed(RuntimeError):
    def __init__(self, result: ParityResult, report: str) -> None:
        super().__init__(report)
        self.result = result


@dataclass
class Validated:
    checked: ServedParity
    facts: TaskFacts  # the draft's, with the embedding ranges where the task answers int8 or uint8
    notes: list[str]


def validate(plan: Plan, draft: Manifest, tokenizer: TextTokenizer, final: Path,
             references: References) -> Validated:
    """`final`, inside the artifact directory being written, served as the draft says."""
    task, precision = plan.task, plan.precision
    model = load_as_served(final.parent, draft, final, plan.options.threads, tokenizer)
    checked = served_parity(task, model, references.heldout, references.heldout_reference, draft.parity.thresholds)
    plan.log(f"  validated on {checked.provider}")
    plan.log("  held-out, worst of alone and batched: "
             + ", ".join(f"{k}={v:.4f}" for k, v in checked.result.metrics.items()))
    plan.log("  batch invariance: " + ", ".join(f"{k}={v:.4g}" for k, v in checked.batch_invariance.items()))
    notes = []
    if precision == Precision.BF16:
        notes.append(f"BF16: the export as it is, which OpenVINO fuses itself, validated on {checked.provider} "
                     "(its bfloat16 arithmetic where the CPU has it, as served); answers alone and batched differ "
                     f"by up to {checked.batch_invariance['max_abs_diff']:.2g}")
    if precision == Precision.FP16:
        notes.append(f"FP16 validated on {checked.provider} (the GPU's fp16 arithmetic, as served)"
                     if checked.provider != CPU
                     else "FP16 validated on this host's CPU provider (fp16 weights, fp32 arithmetic); fp16 "
                          "arithmetic itself runs only on the GPU")
    facts = draft.task
    if task.ranges:
        # int8/uint8 answers: ranges from the texts the recipe saw, never the held-out ones
        seen = [*task.calibration(), *task.tuning(), *task.probes()]
        facts = dataclasses.replace(facts, embedding_ranges=embedding_ranges(task, model, seen))
    del model  # its session holds the whole graph: not kept through packaging
    if not checked.result.passed:
        report = "parity failed:\n" + "\n".join(f"  - {f}" for f in checked.result.failures)
        if not plan.options.allow_failed_parity:
            raise ParityFailed(checked.result, report)
        plan.log(report + "\n  (kept because --allow-failed-parity was given; the manifest records passed=false)")
    return Validated(checked, facts, notes)
