"""One image for a mixed fleet: `multiverse optimize --target icelake,avx2` writes a bundle (one whole artifact per
target, shared files stored once, bundle.json), and `infinity serve BUNDLE` serves the first target the CPU fits, by
the rule `--target auto` follows, reading nothing of the others."""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import httpx
import pytest

from infinity.artifact import verify_checksums
from infinity.bundle import BUNDLE_FILE, Bundle, BundleError, BundleTarget, choose_target, select
from infinity.cli import artifact_dir, build_parser, main
from infinity.engine.hostinfo import cpu_flags
from infinity.engine.preflight import check, choose
from infinity.manifest import Manifest
from infinity.settings import Settings
from optimize.cli import build_parser as optimizer_parser
from optimize.presets import CPU_BUNDLE, CPU_ORDER, CPU_PREFERENCE, PRESETS, resolve_target, target_list
from tests.servers import running

BASE = ("fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 ht "
        "syscall nx pdpe1gb rdtscp lm constant_tsc rep_good nopl xtopology cpuid tsc_known_freq pni pclmulqdq ssse3 "
        "cx16 pcid sse4_1 sse4_2 x2apic movbe popcnt tsc_deadline_timer aes xsave avx f16c rdrand hypervisor lahf_lm "
        "abm")
HASWELL_ON = "fma bmi1 avx2 smep bmi2 erms invpcid rdseed adx smap clflushopt xsaveopt xsavec xgetbv1 xsaves"
AVX512 = "avx512f avx512dq avx512cd avx512bw avx512vl"
ICELAKE_ON = (f"{AVX512} avx512ifma avx512vbmi avx512_vbmi2 gfni vaes vpclmulqdq avx512_vnni avx512_bitalg "
              "avx512_vpopcntdq")
# /proc/cpuinfo flags of each host class (the x86 features; a guest shows a subset of the host's)
HOSTS = {
    "zen3-avx2": f"{BASE} {HASWELL_ON} sse4a misalignsse 3dnowprefetch topoext clwb sha_ni clzero vaes vpclmulqdq "
                 "rdpid fsrm",
    "zen4-vnni": f"{BASE} {HASWELL_ON} sse4a clwb sha_ni {ICELAKE_ON} avx512_bf16 rdpid fsrm",
    "zen5-vnni": f"{BASE} {HASWELL_ON} sse4a clwb sha_ni avx_vnni {ICELAKE_ON} avx512_bf16 avx512_vp2intersect movdiri "
                 "movdir64b",
    "icelake-xeon": f"{BASE} {HASWELL_ON} clwb sha_ni {ICELAKE_ON} rdpid fsrm md_clear flush_l1d arch_capabilities",
    "cascadelake": f"{BASE} {HASWELL_ON} clwb {AVX512} avx512_vnni pku ospke md_clear flush_l1d",
    "skylake-sp": f"{BASE} {HASWELL_ON} clwb {AVX512} pku ospke md_clear flush_l1d",
    "sapphire-rapids": f"{BASE} {HASWELL_ON} clwb sha_ni avx_vnni {ICELAKE_ON} avx512_bf16 avx512_fp16 serialize "
                       "tsxldtrk amx_bf16 amx_tile amx_int8 movdiri movdir64b",
    "old-no-avx2": f"{BASE} ssse3 xsaveopt",  # Sandy Bridge / Ivy Bridge: AVX without AVX2
}
# what a bundle of `--target cpu` (icelake, avx2) serves on each
BUNDLE_CHOICE = {"zen3-avx2": "avx2", "zen4-vnni": "icelake", "zen5-vnni": "icelake", "icelake-xeon": "icelake",
                 "cascadelake": "icelake", "skylake-sp": "avx2", "sapphire-rapids": "icelake", "old-no-avx2": None}


def flags_of(host: str) -> frozenset[str]:
    return frozenset(HOSTS[host].split())


def presets(names: tuple[str, ...]) -> list[tuple[str, tuple[str, ...]]]:
    return [(name, PRESETS[name].required_cpu_flags) for name in names]


def test_this_hosts_flags_are_a_zen3_like_the_table_says_where_it_is_one() -> None:
    """The table's Zen 3 line is this suite's usual host: its x86 features as /proc/cpuinfo shows them."""
    if "avx512f" in cpu_flags() or "avx2" not in cpu_flags():
        pytest.skip("not an AVX2-only host")
    assert choose_target(presets(CPU_BUNDLE), cpu_flags()) == choose_target(presets(CPU_BUNDLE),
                                                                              flags_of("zen3-avx2")) == "avx2"


@pytest.mark.parametrize("host", HOSTS)
def test_the_choice_is_a_function_of_the_cpu_flags(host: str) -> None:
    flags = flags_of(host)
    assert choose_target(presets(CPU_BUNDLE), flags) == BUNDLE_CHOICE[host]
    # a bundle of every CPU target chooses what `--target auto` builds on that host
    every = choose_target(presets(CPU_ORDER), flags)
    if BUNDLE_CHOICE[host] is None:
        assert every is None
        with pytest.raises(ValueError, match="no AVX2"):
            resolve_target("auto", flags)
    else:
        assert every == resolve_target("auto", flags).name
        # the targets a bundle leaves out for a twin recipe with fewer flags: skylake (avx2's), sapphirerapids
        # (icelake's int8)
        assert every == {"skylake-sp": "skylake", "sapphire-rapids": "sapphirerapids"}.get(host, BUNDLE_CHOICE[host])
        # cpu holds every recipe: what it serves runs the graph the host's own best target would have
        assert PRESETS[every].quantization == PRESETS[BUNDLE_CHOICE[host]].quantization


def test_cpu_holds_every_cpu_recipe_once_in_the_order_auto_prefers() -> None:
    cpu_targets = [name for name, preset in PRESETS.items() if not preset.is_gpu]
    assert sorted(CPU_ORDER) == sorted(cpu_targets)
    assert [name for name in CPU_ORDER if name in CPU_PREFERENCE] == list(CPU_PREFERENCE)
    recipes = [PRESETS[name].quantization for name in CPU_BUNDLE]
    assert all(PRESETS[name].quantization in recipes for name in cpu_targets)
    assert len({repr(recipe) for recipe in recipes}) == len(CPU_BUNDLE)


@pytest.mark.parametrize(("text", "targets"), [
    ("avx2,icelake", ("icelake", "avx2")), ("icelake, avx2", ("icelake", "avx2")), ("cpu", CPU_BUNDLE),
    ("auto", ("auto",)), ("avx2", ("avx2",)), ("cuda", ("cuda",)), ("avx2,skylake,avx2", ("skylake", "avx2")),
    ("cpu,cascadelake", ("icelake", "cascadelake", "avx2")),
])
def test_target_lists(text: str, targets: tuple[str, ...]) -> None:
    assert target_list(text) == targets
    args = optimizer_parser().parse_args(["optimize", "--target", text, "--out", "x"])
    assert args.target == targets


@pytest.mark.parametrize(("text", "message"), [
    ("pentium", "unknown target 'pentium'"), ("avx2,pentium", "unknown target 'pentium'"),
    ("cuda,avx2", "cuda is a GPU target"), ("auto,icelake", "auto picks one target"),
    ("avx2,,icelake", "no target name between the commas"),
])
def test_bad_target_lists_are_refused_in_one_line(text: str, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        optimizer_parser().parse_args(["optimize", "--target", text, "--out", "x"])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err.strip().splitlines()[-1]


def test_the_default_target_is_auto_as_before() -> None:
    assert optimizer_parser().parse_args(["optimize", "--out", "x"]).target == ("auto",)


GOOD = {"schema_version": 1, "created_at": "", "targets": [
    {"name": "icelake", "directory": "icelake", "required_cpu_flags": ["avx512f", "avx512_vnni"]},
    {"name": "avx2", "directory": "avx2", "required_cpu_flags": ["avx2"]}]}


def edited(**changes: Any) -> dict[str, Any]:
    data = json.loads(json.dumps(GOOD))
    for where, value in changes.items():
        *path, last = where.split("__")
        node = data
        for key in path:
            node = node[int(key)] if isinstance(node, list) else node[key]
        if value is KeyError:
            del node[last]
        else:
            node[int(last) if isinstance(node, list) else last] = value
    return data


@pytest.mark.parametrize(("data", "message"), [
    ([], "bundle.json is malformed: it must be a JSON object"),
    (edited(schema_version=2), "bundle.json schema version 2 is not supported (expected 1)"),
    (edited(schema_version="1"), "bundle.json schema_version must be the integer 1, not '1'"),
    (edited(targets=KeyError), "bundle.json is malformed: missing field targets"),
    (edited(targets={}), "bundle.json is malformed: targets must be a list, not {}"),
    (edited(targets=[]), "bundle.json field targets must be a list of at least one target, not []"),
    (edited(targets__0__name=3), "bundle.json is malformed: targets[0].name must be a string, not 3"),
    (edited(targets__1__directory=KeyError), "bundle.json is malformed: missing field targets[1].directory"),
    (edited(targets__1__directory="../avx2"),
     "bundle.json field targets[1].directory must be a folder directly inside the bundle, not '../avx2'"),
    (edited(targets__1__directory="/models/avx2"),
     "bundle.json field targets[1].directory must be a folder directly inside the bundle, not '/models/avx2'"),
    (edited(targets__1__directory="icelake"),
     "bundle.json field targets[1].directory must be a folder no other target has, not 'icelake'"),
    (edited(targets__1__name="icelake"),
     "bundle.json field targets[1].name must be a name no other target has, not 'icelake'"),
    (edited(targets__0__required_cpu_flags="avx512f"),
     "bundle.json is malformed: targets[0].required_cpu_flags must be a list, not 'avx512f'"),
    (edited(targets__0__required_cpu_flags=["avx512f", "avx512 vnni"]),
     "bundle.json field targets[0].required_cpu_flags[1] must be a CPU flag as /proc/cpuinfo names it, "
     "not 'avx512 vnni'"),
    (edited(targets__0__extra=1), "bundle.json is malformed: unknown field targets[0].extra"),
])
def test_a_bad_bundle_manifest_is_refused_in_one_line_naming_the_field(data: Any, message: str) -> None:
    with pytest.raises(BundleError) as caught:
        Bundle.from_dict(data)
    assert str(caught.value) == message


def test_a_good_bundle_manifest_reads_back_as_written(tmp_path: Path) -> None:
    bundle = Bundle.from_dict(GOOD)
    assert bundle.names == ["icelake", "avx2"] and bundle.targets[1] == BundleTarget("avx2", "avx2", ["avx2"])
    bundle.save(tmp_path)
    assert Bundle.load(tmp_path) == bundle and json.loads((tmp_path / BUNDLE_FILE).read_text()) == GOOD


def test_selection_says_why_and_names_what_each_target_needs_where_none_fits(tmp_path: Path) -> None:
    Bundle.from_dict(GOOD).save(tmp_path)
    chosen = select(tmp_path, flags_of("zen3-avx2"))
    assert (chosen.target.name, chosen.fits, chosen.directory) == ("avx2", True, tmp_path / "avx2")
    assert chosen.why == ("the first of the bundle's targets (icelake, avx2) whose CPU flags this CPU has (avx2); "
                          "this CPU lacks icelake's avx512f, avx512_vnni")
    assert select(tmp_path, flags_of("sapphire-rapids")).target.name == "icelake"
    with pytest.raises(BundleError) as caught:
        select(tmp_path, flags_of("old-no-avx2"))
    assert str(caught.value) == ("no target of this bundle fits this CPU: icelake needs avx512f, avx512_vnni; avx2 "
                                 "needs avx2; pass --allow-cpu-mismatch to serve icelake anyway")
    anyway = select(tmp_path, flags_of("old-no-avx2"), allow_mismatch=True)
    assert (anyway.target.name, anyway.fits) == ("icelake", False)


# A bundle made of the suite's fp32 MiniLM (it runs on any CPU): a first target that needs a flag no CPU has, and the
# artifact itself, whose manifest needs none. Files are hard links into the suite's artifact: a test changes one only
# by writing a new file in its place.


def linked_copy(source: Path, to: Path) -> Path:
    to.mkdir(parents=True)
    for path in source.iterdir():
        if path.is_dir():
            linked_copy(path, to / path.name)
        else:
            os.link(path, to / path.name)
    return to


def replace(path: Path, data: bytes) -> None:
    path.unlink()
    path.write_bytes(data)


def retarget(artifact: Path, name: str, flags: list[str]) -> None:
    data = json.loads((artifact / "manifest.json").read_text())
    data["target"].update(name=name, required_cpu_flags=flags)
    replace(artifact / "manifest.json", json.dumps(data).encode())


FUTURE = ["avx1024_imaginary"]


@pytest.fixture()
def made_bundle(minilm_fp32_artifact: Path, tmp_path: Path) -> Path:
    root = tmp_path / "bundle"
    linked_copy(minilm_fp32_artifact, root / "future")
    retarget(root / "future", "future", FUTURE)
    linked_copy(minilm_fp32_artifact, root / "plain")
    plain = Manifest.load(root / "plain").target
    Bundle([BundleTarget("future", "future", FUTURE),
            BundleTarget(plain.name, "plain", plain.required_cpu_flags)]).save(root)
    return root


def test_a_bundle_serves_the_target_this_cpu_fits_and_reads_nothing_of_the_others(made_bundle: Path,
                                                                                  minilm_fp32_artifact: Path,
                                                                                  tmp_path: Path) -> None:
    for name in ("model.onnx", "model.onnx.data"):
        (made_bundle / "future" / name).unlink()
    replace(made_bundle / "future" / "manifest.json", b"not a manifest")
    served = Manifest.load(made_bundle / "plain").target.name
    texts = ["What is the capital of France?", "rivet"]
    with running(made_bundle, tmp_path / "bundle.log") as server:
        info = httpx.get(f"{server.url}/info").json()
        metrics = httpx.get(f"{server.url}/metrics").text
        answer = httpx.post(f"{server.url}/predict", json={"inputs": texts}).content
    with running(minilm_fp32_artifact, tmp_path / "single.log") as server:
        single = httpx.get(f"{server.url}/info").json()
        assert httpx.post(f"{server.url}/predict", json={"inputs": texts}).content == answer
    assert info["target"]["name"] == served and info["bundle"]["chosen"] == served and info["bundle"]["fits"]
    assert [t["name"] for t in info["bundle"]["targets"]] == ["future", served] and single["bundle"] is None
    assert f'infinity_target_info{{bundle="future,{served}",target="{served}"}} 1.0' in metrics
    log = (tmp_path / "bundle.log").read_text()
    assert f"serving target {served} of the bundle in {made_bundle}: the first of the bundle's targets" in log
    assert "this CPU lacks future's avx1024_imaginary" in log


def test_a_single_target_artifact_names_its_target_in_the_metrics(minilm_fp32_artifact: Path, tmp_path: Path) -> None:
    target = Manifest.load(minilm_fp32_artifact).target.name
    with running(minilm_fp32_artifact, tmp_path / "server.log") as server:
        assert f'infinity_target_info{{bundle="",target="{target}"}} 1.0' in httpx.get(f"{server.url}/metrics").text


def refusal(artifact: Path, capsys: pytest.CaptureFixture[str], *flags: str) -> str:
    assert main(["serve", str(artifact), "--port", "0", *flags], environ={}) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("infinity: error: ")
    return lines[0].removeprefix("infinity: error: ")


def test_a_cpu_that_fits_no_target_is_refused_in_one_line_unless_mismatch_is_allowed(
        made_bundle: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    bundle = Bundle.load(made_bundle)
    bundle.targets[1].required_cpu_flags = ["avx2048_imaginary"]
    replace(made_bundle / BUNDLE_FILE, json.dumps(bundle.to_dict()).encode())
    served = Manifest.load(made_bundle / "plain").target.name
    assert refusal(made_bundle, capsys) == (f"no target of this bundle fits this CPU: future needs avx1024_imaginary; "
                                            f"{served} needs avx2048_imaginary; pass --allow-cpu-mismatch to serve "
                                            "future anyway")
    with caplog.at_level(logging.WARNING):
        directory, selection = choose(made_bundle, Settings(allow_cpu_mismatch=True))
        check(directory, Settings(allow_cpu_mismatch=True), selection)
    assert directory == made_bundle / "future" and selection is not None and not selection.fits
    assert "serving target future of the bundle" in caplog.text and "--allow-cpu-mismatch" in caplog.text


def test_the_chosen_targets_own_corruption_is_caught(made_bundle: Path, capsys: pytest.CaptureFixture[str]) -> None:
    graph = made_bundle / "plain" / "model.onnx"
    replace(graph, graph.read_bytes() + b"\n")
    assert refusal(made_bundle, capsys).startswith("checksum mismatch for model.onnx")


def test_a_target_whose_manifest_is_not_the_one_listed_is_refused(made_bundle: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    served = Manifest.load(made_bundle / "plain").target.name
    retarget(made_bundle / "plain", "somewhere-else", [])
    assert refusal(made_bundle, capsys) == (f"bundle.json lists '{served}' (needs no CPU flag) in plain/, whose "
                                            "manifest is 'somewhere-else' (needs no CPU flag)")


def test_sagemaker_serves_a_bundle_in_its_model_directory(made_bundle: Path) -> None:
    args = build_parser().parse_args(["serve"])
    assert artifact_dir(args, {"SAGEMAKER_BIND_TO_PORT": "8080", "SM_MODEL_DIR": str(made_bundle)}) == str(made_bundle)


def test_validate_names_the_targets_of_a_bundle(made_bundle: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from optimize.cli import main as multiverse

    assert multiverse(["validate", str(made_bundle)]) == 2
    assert capsys.readouterr().err.strip() == (f"multiverse: error: {made_bundle} is a bundle: validate its targets "
                                               f"one by one ({made_bundle}/future, {made_bundle}/plain)")


# The real thing: `multiverse optimize --target avx2,icelake` on the bundled MiniLM, INT8 (tests/conftest.py builds it
# with the options of the suite's single-target artifacts).
REAL = ("icelake", "avx2")
TEXTS = ["What is the capital of France?", "Der Zug nach Hamburg hat heute vierzig Minuten Verspätung.", "rivet",
         "a " * 300 + "beyond the maximum length"]


@pytest.fixture(scope="module")
def bundle(artifacts: Any) -> Path:
    return Path(artifacts.bundle(REAL))


@pytest.mark.slow
def test_the_bundle_holds_each_target_whole_and_the_shared_files_once(bundle: Path) -> None:
    written = Bundle.load(bundle)
    assert written.names == list(REAL) and [t.directory for t in written.targets] == list(REAL)
    sizes = {}
    for target in written.targets:
        manifest = Manifest.load(bundle / target.directory)
        verify_checksums(bundle / target.directory, manifest)
        assert manifest.target.name == target.name and manifest.model.precision == "int8"
        assert target.required_cpu_flags == manifest.target.required_cpu_flags == list(
            PRESETS[target.name].required_cpu_flags)
        assert manifest.parity.passed
        sizes[target.name] = sum(path.stat().st_size for path in (bundle / target.directory).iterdir())
    tokenizers = [(bundle / target / "tokenizer.json").stat() for target in REAL]
    assert len({(stat.st_dev, stat.st_ino) for stat in tokenizers}) == 1 and tokenizers[0].st_nlink >= 2
    inodes = {(p.stat().st_ino): p.stat().st_size for p in bundle.rglob("*") if p.is_file()}
    assert sum(inodes.values()) <= sum(sizes.values()) - tokenizers[0].st_size


@pytest.mark.slow
def test_the_bundle_serves_what_this_cpu_fits_bit_for_bit_as_that_targets_own_artifact(
        bundle: Path, artifacts: Any, tmp_path: Path) -> None:
    expected = choose_target(presets(REAL), cpu_flags())
    assert expected is not None
    single = artifacts.artifact("feature-extraction", "int8", target=expected)
    assert Manifest.load(bundle / expected).model.sha256 == Manifest.load(single).model.sha256
    bodies = [{"inputs": TEXTS}, {"inputs": TEXTS[0]}, {"inputs": TEXTS, "parameters": {"dimensions": 8}}]
    with running(bundle, tmp_path / "bundle.log") as server:
        info = httpx.get(f"{server.url}/info").json()
        metrics = httpx.get(f"{server.url}/metrics").text
        answers = [httpx.post(f"{server.url}/predict", json=body, timeout=60).content for body in bodies]
    assert info["target"]["name"] == info["bundle"]["chosen"] == expected
    assert f'infinity_target_info{{bundle="{",".join(REAL)}",target="{expected}"}} 1.0' in metrics
    assert f"serving target {expected} of the bundle" in (tmp_path / "bundle.log").read_text()
    with running(single, tmp_path / "single.log") as server:
        assert [httpx.post(f"{server.url}/predict", json=body, timeout=60).content for body in bodies] == answers


@pytest.mark.slow
def test_cold_start_reads_only_the_chosen_target(bundle: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """The other targets' graphs gone and their manifests garbled: the server starts and answers as the whole
    bundle does; the chosen target's own graph changed: refused."""
    expected = choose_target(presets(REAL), cpu_flags())
    copy = linked_copy(bundle, tmp_path / "bundle")
    for other in set(REAL) - {expected}:
        for name in ("model.onnx", "model.onnx.data"):
            (copy / other / name).unlink()
        replace(copy / other / "manifest.json", b"{")
    with running(copy, tmp_path / "copy.log") as server:
        answer = httpx.post(f"{server.url}/predict", json={"inputs": TEXTS}, timeout=60).content
    with running(bundle, tmp_path / "whole.log") as server:
        assert httpx.post(f"{server.url}/predict", json={"inputs": TEXTS}, timeout=60).content == answer
    graph = copy / str(expected) / "model.onnx"
    replace(graph, graph.read_bytes() + b"\n")
    assert refusal(copy, capsys).startswith("checksum mismatch for model.onnx")


@pytest.mark.slow
def test_a_target_that_fails_parity_fails_the_bundle_and_nothing_is_written(artifacts: Any, tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    from optimize.cli import main as multiverse

    out = tmp_path / "bundle"
    assert multiverse(["optimize", str(artifacts.source("distilbert-tiny")), "--task", "sequence-classification",
                       "--precision", "fp32", "--target", "avx2,icelake", "--threshold", "top1_agreement=1.01",
                       "--out", str(out)]) == 3
    assert "multiverse: target icelake: parity failed" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # neither the bundle nor its staging folder


@pytest.mark.slow
def test_the_targets_share_the_stages_before_quantize(artifacts: Any, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Load, export, fuse and reference run once for the bundle; each target's artifact is still the one it
    would be alone (the same graph and tokenizer files as `--target avx2` writes, its own stages after)."""
    from optimize.cli import main as multiverse

    source = str(artifacts.source("distilbert-tiny"))
    common = ["--task", "sequence-classification", "--precision", "fp32"]
    assert multiverse(["optimize", source, *common, "--target", "avx2,icelake", "--out", str(tmp_path / "b")]) == 0
    printed = capsys.readouterr().out
    assert [printed.count(f"[{stage}] done") for stage in ("load", "export", "fuse", "reference")] == [1, 1, 1, 1]
    assert printed.count("[quantize] done") == printed.count("[validate] done") == 2
    assert "  load, export, fuse, reference: shared with icelake's build" in printed
    first, second = (Manifest.load(tmp_path / "b" / name) for name in REAL)
    shared = ("load", "export", "fuse", "reference")
    assert [first.optimization.stage_seconds[s] for s in shared] == [second.optimization.stage_seconds[s]
                                                                    for s in shared]
    assert multiverse(["optimize", source, *common, "--target", "avx2", "--out", str(tmp_path / "alone")]) == 0
    alone = Manifest.load(tmp_path / "alone")
    assert second.model.sha256 == alone.model.sha256 and second.tokenizer == alone.tokenizer
    assert sorted(p.name for p in (tmp_path / "b" / "avx2").iterdir()) == sorted(
        p.name for p in (tmp_path / "alone").iterdir())
