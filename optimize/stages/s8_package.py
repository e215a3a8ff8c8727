"""The package stage: the draft manifest completed with the final graph, what each stage did and the parity as
measured, written into the artifact directory; published with one rename by infinity.artifact.write_atomically."""
from __future__ import annotations

import dataclasses
import datetime as dt
from pathlib import Path

from infinity.engine.hostinfo import cpu_flags
from infinity.manifest import Manifest, Optimization, Parity
from optimize.graph.onnxio import describe_model, model_bytes
from optimize.measure.texts import HELDOUT_DESCRIPTION
from optimize.options import Plan
from optimize.stages.s3_fuse import FusionResult
from optimize.stages.s6_quantize.quantize import Quantized
from optimize.stages.s7_validate.validate import Validated
from optimize.tasks.base import SourceModel


def package(plan: Plan, draft: Manifest, source: SourceModel, exported: Path, fusion: FusionResult,
            quantized: Quantized, final: Path, validated: Validated, seconds: dict[str, float]) -> Manifest:
    """The manifest of `final`'s artifact directory, saved there."""
    notes = [*fusion.gaps, *plan.task.notes(source), *fusion.notes, *quantized.notes, *validated.notes]
    manifest = dataclasses.replace(
        draft, model=describe_model(final, plan.precision), task=validated.facts,
        optimization=Optimization(fusion=fusion.stats, fusion_gaps=fusion.gaps, quantization=quantized.record,
                                  kept_float=quantized.kept_float, stage_seconds=seconds, notes=notes,
                                  exported_bytes=model_bytes(exported), fusion_model_type=fusion.model_type),
        parity=parity(draft.parity, validated), created_at=now())
    manifest.save(final.parent)
    return manifest


def parity(draft: Parity, validated: Validated) -> Parity:
    checked = validated.checked
    result = checked.result
    return dataclasses.replace(
        draft, metrics=result.metrics, passed=result.passed, failures=result.failures,
        host_cpu_flags=sorted(f for f in cpu_flags() if f.startswith(("avx", "amx", "fma"))),
        overridden=not result.passed, probe_set=HELDOUT_DESCRIPTION, modes=checked.modes,
        batch_invariance=checked.batch_invariance, provider=checked.provider)


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
