"""deploy/helm/infinity: `helm lint --strict` and `helm template` of every helm command docs/deploying.md and the
chart's README show (and of the defaults), each rendering valid against the Kubernetes schemas (kubernetes-validate,
offline) and, for KEDA and Prometheus Operator kinds, against their CRDs' schemas (tests/schemas/crds); the
rendered Deployment keeps what tests/test_kubernetes.py asks of the plain one; values.yaml, values.schema.json and
the README's table agree; and every metric the dashboard, the alerts and the autoscalers read is one a running
server exports. helm comes from npm (tests/helm_setup.py)."""
from __future__ import annotations

import copy
import gzip
import json
import re
import shlex
import subprocess
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import kubernetes_validate
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from optimize.presets import PRESETS
from tests import test_kubernetes as plain
from tests.helm_setup import helm_binary, helm_environment
from tests.servers import WAIT, running
from tests.test_platforms import strict  # a CRD schema refusing unknown fields, as kubectl does

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "deploy" / "helm" / "infinity"
CHART_ARGUMENT = "deploy/helm/infinity"  # as the pages spell it, from the repository root
CRD_SCHEMAS = ROOT / "tests" / "schemas" / "crds"
PAGES = (ROOT / "docs" / "deploying.md", CHART / "README.md")
KUBERNETES_VERSIONS = plain.KUBERNETES_VERSIONS
CUSTOM_KINDS = {("keda.sh/v1alpha1", "ScaledObject"): "scaledobject-keda.sh-v1alpha1",
                ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitor-monitoring.coreos.com-v1",
                ("monitoring.coreos.com/v1", "PrometheusRule"): "prometheusrule-monitoring.coreos.com-v1"}
EVERYTHING_ON = ("--set", "monitoring.serviceMonitor.enabled=true", "--set", "monitoring.prometheusRule.enabled=true",
                 "--set", "monitoring.dashboard.enabled=true", "--set", "autoscaling.keda.enabled=true")


# the value sets: the chart's defaults, then every helm command on the pages


@dataclass(frozen=True)
class ValueSet:
    where: str  # page:line, or "defaults"
    release: str
    flags: tuple[str, ...]  # what `helm template` gets: an upgrade's flags on top of the release's earlier ones

    @property
    def id(self) -> str:
        return self.where


def shell_lines(text: str) -> list[tuple[int, str]]:
    """(line number, command) of each line of the page's indented code blocks, continuation lines joined."""
    found: list[tuple[int, str]] = []
    parts: list[str] = []
    start = 0
    for number, line in enumerate(text.splitlines(), 1):
        if not parts and not line.startswith("    "):
            continue
        start = start if parts else number
        parts.append(line.strip().removesuffix("\\").strip())
        if not line.rstrip().endswith("\\"):
            found.append((start, " ".join(parts)))
            parts = []
    return found


def page_value_sets(page: Path) -> list[ValueSet]:
    sets: list[ValueSet] = []
    releases: dict[str, tuple[str, ...]] = {}
    for number, line in shell_lines(page.read_text(encoding="utf-8")):
        if not line.startswith("helm "):
            continue
        where = f"{page.relative_to(ROOT)}:{number}"
        command, release, chart, *flags = shlex.split(line)[1:]
        assert command in ("install", "upgrade"), f"{where}: a helm command the test does not run: {line}"
        assert chart == CHART_ARGUMENT, f"{where}: {chart} is not the chart"
        reuse = {"--reuse-values", "--reset-then-reuse-values"} & set(flags)
        assert command == "upgrade" or not reuse, f"{where}: {line}"
        assert "--reuse-values" not in reuse, f"{where}: --reuse-values keeps the old chart's defaults; " \
                                              "--reset-then-reuse-values takes the new chart's"
        flags = [flag for flag in flags if flag not in reuse]
        if reuse:
            assert release in releases, f"{where}: an upgrade of {release}, never installed on the page"
            flags = [*releases[release], *flags]
        releases[release] = tuple(flags)
        sets.append(ValueSet(where, release, tuple(flags)))
    return sets


VALUE_SETS = [ValueSet("defaults", "infinity", ()), *[s for page in PAGES for s in page_value_sets(page)]]


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(helm_binary()), *args], cwd=ROOT, env=helm_environment(), capture_output=True,
                          text=True, timeout=WAIT)
    if check:
        assert done.returncode == 0, f"helm {shlex.join(args)}:\n{done.stderr}{done.stdout}"
    return done


@cache
def render(release: str, flags: tuple[str, ...], version: str = KUBERNETES_VERSIONS[0]) -> list[dict[str, Any]]:
    out = helm("template", release, CHART_ARGUMENT, "--kube-version", version, *flags).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def kinds(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [doc for doc in docs if doc["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (doc,) = kinds(docs, kind)
    return doc


def pod_of(docs: list[dict[str, Any]]) -> dict[str, Any]:
    pod: dict[str, Any] = one(docs, "Deployment")["spec"]["template"]["spec"]
    return pod


def server_of(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (server,) = [c for c in pod_of(docs)["containers"] if c["name"] == "infinity"]
    return dict(server)


def variables(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


# what CI runs: lint and render every value set, valid against the schemas


@pytest.mark.parametrize("values", VALUE_SETS, ids=[s.id for s in VALUE_SETS])
def test_lint_strict(values: ValueSet) -> None:
    linted = helm("lint", "--strict", CHART_ARGUMENT, "--kube-version", KUBERNETES_VERSIONS[0], *values.flags)
    assert "1 chart(s) linted, 0 chart(s) failed" in linted.stdout


@cache
def crd_schema(name: str) -> dict[str, Any]:
    schema: dict[str, Any] = strict(json.loads(gzip.decompress((CRD_SCHEMAS / f"{name}.json.gz").read_bytes())))
    schema["properties"].pop("metadata")  # `type: object` in a CRD: checked below as every kind's
    return schema


def validate_custom(doc: dict[str, Any]) -> None:
    schema = crd_schema(CUSTOM_KINDS[doc["apiVersion"], doc["kind"]])
    # OpenAPI's schema dialect is draft 4's with extensions; its patterns are Go's (RE2), compiled only when used
    jsonschema.Draft7Validator(schema).validate({k: v for k, v in doc.items() if k != "metadata"})
    metadata = doc["metadata"]
    assert set(metadata) <= {"name", "labels", "annotations"} and re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?",
                                                                                metadata["name"])
    assert all(isinstance(v, str) for v in {**metadata.get("labels", {}), **metadata.get("annotations", {})}.values())


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("values", VALUE_SETS, ids=[s.id for s in VALUE_SETS])
def test_what_renders_is_valid(values: ValueSet, version: str) -> None:
    docs = render(values.release, values.flags, version)
    assert {"Deployment", "Service"} <= {doc["kind"] for doc in docs}
    for doc in docs:
        if (doc["apiVersion"], doc["kind"]) in CUSTOM_KINDS:
            validate_custom(doc)
        else:
            kubernetes_validate.validate(doc, version, strict=True)


def test_everything_on_is_valid_too() -> None:
    docs = render("everything", EVERYTHING_ON)
    assert sorted(doc["kind"] for doc in docs) == ["ConfigMap", "Deployment", "PodDisruptionBudget",
                                                   "PrometheusRule", "ScaledObject", "Service", "ServiceMonitor"]
    for doc in docs:
        if (doc["apiVersion"], doc["kind"]) in CUSTOM_KINDS:
            validate_custom(doc)


def test_the_custom_kinds_check_catches_an_unknown_field() -> None:
    docs = render("everything", EVERYTHING_ON)
    for kind in ("ScaledObject", "ServiceMonitor", "PrometheusRule"):
        doc = copy.deepcopy(one(docs, kind))
        doc["spec"]["minReplicas" if kind == "ScaledObject" else "endpoint"] = 2  # HPA's name; endpoints'
        with pytest.raises(jsonschema.ValidationError):
            validate_custom(doc)


def test_the_pages_cover_every_kind_of_install() -> None:
    """Defaults, KEDA, HPA on queue depth, HPA on CPU, an artifact on a claim, and one an init container optimizes:
    each is a command on the page, so each is linted, rendered and validated above."""
    seen = set()
    for values in VALUE_SETS:
        docs = render(values.release, values.flags)
        pod = pod_of(docs)
        hpas = kinds(docs, "HorizontalPodAutoscaler")
        seen |= {"defaults"} if not values.flags else set()
        seen |= {"keda"} if kinds(docs, "ScaledObject") else set()
        seen |= {f"hpa-{m['type']}" for hpa in hpas for m in hpa["spec"]["metrics"]}
        seen |= {"pvc"} if any("persistentVolumeClaim" in v for v in pod["volumes"]) else set()
        seen |= {"optimize"} if pod.get("initContainers") else set()
        seen |= {"monitoring"} if {"ServiceMonitor", "PrometheusRule", "ConfigMap"} <= {d["kind"] for d in docs} \
            else set()
    assert seen == {"defaults", "keda", "hpa-Pods", "hpa-Resource", "pvc", "optimize", "monitoring"}


@pytest.mark.parametrize("values", VALUE_SETS, ids=[s.id for s in VALUE_SETS])
def test_the_notes_render(values: ValueSet) -> None:
    installed = helm("install", values.release, CHART_ARGUMENT, "--dry-run=client", *values.flags).stdout
    notes = installed.partition("NOTES:\n")[2]
    name = one(render(values.release, values.flags), "Deployment")["metadata"]["name"]
    assert f"deployment/{name}" in notes and "curl -s localhost:8080/predict" in notes


# the rendered Deployment keeps what the plain manifests encode


@pytest.mark.parametrize("values", VALUE_SETS, ids=[s.id for s in VALUE_SETS])
def test_the_deployment_keeps_the_plain_manifests_invariants(values: ValueSet) -> None:
    """tests/test_kubernetes.py's own check (probe paths and port, drain within the grace period, Guaranteed
    whole CPUs, non-root), and a read-only root file system with no privileges for every container."""
    docs = render(values.release, values.flags)
    deployment = one(docs, "Deployment")
    server_only = copy.deepcopy(deployment)  # its helper finds the server by its image: the optimizer's is alike
    server_only["spec"]["template"]["spec"].pop("initContainers", None)
    plain.test_server_probes_resources_and_termination(server_only)
    pod = pod_of(docs)
    server = server_of(docs)
    assert int(variables(server)["INFINITY_PORT"]) == server["ports"][0]["containerPort"]
    pause = int(server["lifecycle"]["preStop"]["exec"]["command"][1])
    assert pod["terminationGracePeriodSeconds"] >= pause + float(variables(server)["INFINITY_DRAIN_TIMEOUT"]) + 10
    for container in pod.get("initContainers", []) + pod["containers"]:
        assert container["resources"]["requests"] == container["resources"]["limits"]  # the pod stays Guaranteed
        assert container["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                                "capabilities": {"drop": ["ALL"]}}
        assert any(m["mountPath"] == "/tmp" for m in container["volumeMounts"])  # the one writable folder
    assert pod["securityContext"]["runAsUser"] == 10001 and pod["automountServiceAccountToken"] is False
    service = one(docs, "Service")
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert service["spec"]["ports"][0]["targetPort"] == "http" == server["ports"][0]["name"]
    for budget in kinds(docs, "PodDisruptionBudget"):
        assert budget["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]


def test_a_drain_or_pause_of_another_length_moves_the_grace_period() -> None:
    docs = render("x", ("--set", "server.drainTimeoutSeconds=120", "--set", "server.preStopSleepSeconds=15"))
    assert variables(server_of(docs))["INFINITY_DRAIN_TIMEOUT"] == "120"
    assert pod_of(docs)["terminationGracePeriodSeconds"] == 145
    plain.test_server_probes_resources_and_termination(one(docs, "Deployment"))


@pytest.mark.parametrize("values", VALUE_SETS, ids=[s.id for s in VALUE_SETS])
def test_every_server_variable_is_a_setting_the_server_parses(values: ValueSet, tmp_path: Path) -> None:
    from infinity.cli import artifact_dir, build_parser, settings_from

    server = server_of(render(values.release, values.flags))
    assert not server.get("args")
    given = {name: value for name, value in variables(server).items() if name.startswith("INFINITY_")}
    (tmp_path / "keys").write_text("a-key-from-the-secret\n")
    environ = {name: value for name, value in given.items() if isinstance(value, str)}
    environ |= {"INFINITY_API_KEY_FILE": str(tmp_path / "keys")} if "INFINITY_API_KEY_FILE" in given else {}
    environ |= {"INFINITY_API_KEY": "a-key-from-the-secret"} if "INFINITY_API_KEY" in given else {}
    args = build_parser().parse_args(["serve"])
    parsed = settings_from(args, environ)
    for name in set(given) - {"INFINITY_ARTIFACT", "INFINITY_API_KEY", "INFINITY_API_KEY_FILE"}:
        assert hasattr(parsed, name.removeprefix("INFINITY_").lower()), name
    assert parsed.host == "0.0.0.0" and parsed.api_keys == ("a-key-from-the-secret",)
    assert artifact_dir(args, environ) == given["INFINITY_ARTIFACT"]


# the values that change what renders


def nfd_keys(docs: list[dict[str, Any]]) -> set[str] | None:
    affinity = pod_of(docs).get("affinity", {}).get("nodeAffinity")
    if affinity is None:
        return None
    (term,) = affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert all(e["operator"] == "In" and e["values"] == ["true"] for e in term["matchExpressions"])
    return {e["key"] for e in term["matchExpressions"]}


def test_nodes_offer_the_cpu_flags_of_the_target() -> None:
    """Every CPU target of optimize/presets.py is a value of `target`, whose node affinity asks Node Feature
    Discovery's labels for exactly the preset's required flags; `none` asks for nothing."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    cpu_targets = [name for name, preset in PRESETS.items() if not preset.is_gpu]
    assert schema["properties"]["target"]["enum"] == [*cpu_targets, "none"]
    for target in cpu_targets:
        docs = render("x", ("--set", f"target={target}"))
        assert one(docs, "Deployment")["metadata"]["annotations"]["infinity.dev/target"] == target
        assert nfd_keys(docs) == {f"feature.node.kubernetes.io/cpu-cpuid.{flag.replace('_', '').upper()}"
                                  for flag in PRESETS[target].required_cpu_flags}
    assert nfd_keys(render("x", ("--set", "target=none"))) is None
    spread = {"topologyKey": "kubernetes.io/hostname",
              "labelSelector": {"matchLabels": {"app.kubernetes.io/instance": "x"}}}
    anti = {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 1, "podAffinityTerm": spread}]}}
    docs = render("x", ("--set", "target=icelake", "--set-json", f"affinity={json.dumps(anti)}"))
    assert nfd_keys(docs) and pod_of(docs)["affinity"]["podAntiAffinity"] == anti["podAntiAffinity"]
    own = helm("template", "x", CHART_ARGUMENT, "--set", "target=icelake", "--set-json",
               'affinity={"nodeAffinity": {}}', check=False)
    assert own.returncode != 0 and "set target to none" in own.stderr


def test_the_api_keys_come_from_the_existing_secret() -> None:
    docs = render("x", EVERYTHING_ON)
    pod, server = pod_of(docs), server_of(docs)
    path = Path(variables(server)["INFINITY_API_KEY_FILE"])
    (mount,) = [m for m in server["volumeMounts"] if Path(m["mountPath"]) == path.parent]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert mount["readOnly"] and volume["secret"]["secretName"] == "infinity-api-keys" and path.name == "keys"
    assert not volume["secret"].get("optional", False) and pod["securityContext"]["fsGroup"] == 10001  # 0440 files
    (endpoint,) = one(docs, "ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["authorization"]["credentials"] == {"name": "infinity-api-keys", "key": "keys"}

    docs = render("x", ("--set", "apiKeys.from=env", "--set", "apiKeys.existingSecret=keys-of-x", "--set",
                        "apiKeys.key=k", "--set", "monitoring.serviceMonitor.enabled=true"))
    assert variables(server_of(docs))["INFINITY_API_KEY"] == {"secretKeyRef": {"name": "keys-of-x", "key": "k"}}
    assert not any("secret" in v for v in pod_of(docs)["volumes"])
    (endpoint,) = one(docs, "ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["authorization"]["credentials"] == {"name": "keys-of-x", "key": "k"}

    docs = render("x", ("--set", "apiKeys.existingSecret=", "--set", "monitoring.serviceMonitor.enabled=true"))
    assert not {"INFINITY_API_KEY", "INFINITY_API_KEY_FILE"} & set(variables(server_of(docs)))
    (endpoint,) = one(docs, "ServiceMonitor")["spec"]["endpoints"]
    assert "authorization" not in endpoint


def test_the_artifact_is_baked_mounted_or_optimized_first() -> None:
    baked = render("x", ())
    assert variables(server_of(baked))["INFINITY_ARTIFACT"] == "/model"
    assert not any(v["name"] == "artifact" for v in pod_of(baked)["volumes"])

    claim = render("x", ("--set", "artifact.source=pvc", "--set", "artifact.pvc.claimName=c", "--set",
                         "artifact.pvc.subPath=minilm", "--set", "artifact.path=/artifact"))
    (mount,) = [m for m in server_of(claim)["volumeMounts"] if m["name"] == "artifact"]
    (volume,) = [v for v in pod_of(claim)["volumes"] if v["name"] == "artifact"]
    assert mount == {"name": "artifact", "mountPath": "/artifact", "readOnly": True, "subPath": "minilm"}
    assert volume["persistentVolumeClaim"] == {"claimName": "c", "readOnly": True}
    assert variables(server_of(claim))["INFINITY_ARTIFACT"] == "/artifact"
    unnamed = helm("template", "x", CHART_ARGUMENT, "--set", "artifact.source=pvc", check=False)
    assert unnamed.returncode != 0 and "artifact.pvc.claimName" in unnamed.stderr

    flags = ("--set", "artifact.source=optimize", "--set", "artifact.optimize.args={--precision,fp32}")
    optimized = render("x", flags)
    (init,) = pod_of(optimized)["initContainers"]
    served = variables(server_of(optimized))["INFINITY_ARTIFACT"]
    # target none (the default): the init container optimizes for the node it runs on
    assert init["command"] == ["/opt/optimizer/bin/multiverse", "optimize", "--precision", "fp32", "--target",
                               "auto", "--out", served]
    assert variables(init)["HF_HUB_OFFLINE"] == "1"  # the bundled MiniLM
    # the optimizer publishes with a rename inside --out's folder: that folder is the volume's mount, in both
    (written,) = [m for m in init["volumeMounts"] if m["name"] == "artifact"]
    (read,) = [m for m in server_of(optimized)["volumeMounts"] if m["name"] == "artifact"]
    assert written["mountPath"] == read["mountPath"] == str(Path(served).parent) and read["readOnly"]
    (volume,) = [v for v in pod_of(optimized)["volumes"] if v["name"] == "artifact"]
    assert "emptyDir" in volume

    hub = render("x", (*flags, "--set", "artifact.optimize.model=org/model", "--set", "target=none"))
    (init,) = pod_of(hub)["initContainers"]
    assert init["command"][2:] == ["org/model", "--precision", "fp32", "--target", "auto", "--out", served]
    assert "HF_HUB_OFFLINE" not in variables(init)

    once = render("x", (*flags, "--set", "artifact.optimize.volume=pvc", "--set", "artifact.pvc.claimName=c"))
    (init,) = pod_of(once)["initContainers"]
    assert init["command"][:2] == ["sh", "-c"] and init["command"][3] == served
    assert init["args"][-2:] == ["--out", served]
    (volume,) = [v for v in pod_of(once)["volumes"] if v["name"] == "artifact"]
    assert volume["persistentVolumeClaim"] == {"claimName": "c"}  # written by the first pod


def test_the_optimize_wrapper_skips_an_artifact_already_on_the_claim(tmp_path: Path) -> None:
    docs = render("x", ("--set", "artifact.source=optimize", "--set", "artifact.optimize.volume=pvc", "--set",
                        "artifact.pvc.claimName=c"))
    (init,) = pod_of(docs)["initContainers"]
    script = init["command"][2]
    ran = subprocess.run(["sh", "-c", script, str(tmp_path), "echo", "optimizing"], capture_output=True, text=True)
    assert ran.stdout == "optimizing\n"
    (tmp_path / "manifest.json").write_text("{}")
    ran = subprocess.run(["sh", "-c", script, str(tmp_path), "echo", "optimizing"], capture_output=True, text=True)
    assert ran.stdout == f"{tmp_path} holds an artifact\n"


def test_at_most_one_autoscaler_and_it_owns_the_replica_count() -> None:
    """With an autoscaler on, the Deployment has no replica count for an upgrade to reset (nor a GitOps tool that
    renders the chart to fight the autoscaler over)."""
    both = helm("template", "x", CHART_ARGUMENT, "--set", "autoscaling.keda.enabled=true", "--set",
                "autoscaling.hpaCpu.enabled=true", check=False)
    assert both.returncode != 0 and "keda and hpaCpu are on; turn on at most one" in both.stderr
    upside_down = helm("template", "x", CHART_ARGUMENT, "--set", "autoscaling.hpaCpu.enabled=true", "--set",
                       "autoscaling.minReplicas=11", check=False)
    assert upside_down.returncode != 0 and "minReplicas is more than" in upside_down.stderr
    assert one(render("x", ()), "Deployment")["spec"]["replicas"] == 2
    for flag, kind in (("keda", "ScaledObject"), ("hpaQueueDepth", "HorizontalPodAutoscaler"),
                       ("hpaCpu", "HorizontalPodAutoscaler")):
        docs = render("x", ("--set", f"autoscaling.{flag}.enabled=true"))
        deployment = one(docs, "Deployment")
        assert "replicas" not in deployment["spec"]
        scaler = one(docs, kind)
        assert scaler["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                                    "name": deployment["metadata"]["name"]}
        assert scaler["spec"].get("minReplicas", scaler["spec"].get("minReplicaCount")) >= 2


def test_the_queue_depth_autoscalers_agree_with_the_plain_ones() -> None:
    keda = one(render("minilm", ("--set", "autoscaling.keda.enabled=true")), "ScaledObject")
    hpa = one(render("minilm", ("--set", "autoscaling.hpaQueueDepth.enabled=true")), "HorizontalPodAutoscaler")
    (trigger,) = keda["spec"]["triggers"]
    (plain_trigger,) = plain.AUTOSCALING["keda-queue-depth.yaml#0"]["spec"]["triggers"]
    assert trigger["metadata"]["threshold"] == plain_trigger["metadata"]["threshold"]
    assert trigger["metadata"]["query"] == plain_trigger["metadata"]["query"].replace(
        'service="infinity-minilm"', 'namespace="default",service="minilm-infinity"')
    assert hpa["spec"]["metrics"] == plain.AUTOSCALING["hpa-queue-depth.yaml#0"]["spec"]["metrics"]
    cpu = one(render("minilm", ("--set", "autoscaling.hpaCpu.enabled=true")), "HorizontalPodAutoscaler")
    assert cpu["spec"]["metrics"] == plain.AUTOSCALING["hpa-cpu.yaml#0"]["spec"]["metrics"]


def test_the_dashboard_is_one_per_release_for_grafanas_sidecar() -> None:
    boards = {}
    for namespace, release in (("default", "a"), ("default", "b"), ("other", "a")):
        docs = render(release, ("--set", "monitoring.dashboard.enabled=true", "--namespace", namespace))
        config_map = one(docs, "ConfigMap")
        assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
        (text,) = config_map["data"].values()
        board = json.loads(text)
        assert len(board["uid"]) <= 40  # Grafana's limit
        current = {v["name"]: v.get("current", {}).get("value") for v in board["templating"]["list"]}
        assert current["namespace"] == namespace and current["service"] == one(docs, "Service")["metadata"]["name"]
        boards[board["uid"]] = board
    assert len(boards) == 3


# values.yaml, values.schema.json and the README's table say the same


def leaves(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Every value by its dotted path: a map that holds fixed keys is followed, a list or an empty map is a value."""
    found: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, dict) and value and key not in ("labels", "annotations"):
            found |= leaves(value, f"{prefix}{key}.")
        else:
            found[prefix + key] = value
    return found


def test_the_readme_documents_every_value_with_its_default() -> None:
    values = leaves(yaml.safe_load((CHART / "values.yaml").read_text()))
    section = (CHART / "README.md").read_text().partition("\n## Values\n")[2]
    rows = re.findall(r"^\| `([^`]+)` \| `(.*?)` \| .+ \|$", section, re.MULTILINE)
    table = dict(rows)
    assert len(table) == len(rows), "a value is in the table twice"
    assert sorted(table) == sorted(values), "README.md's values table and values.yaml differ: " + \
        f"undocumented {sorted(set(values) - set(table))}, stale {sorted(set(table) - set(values))}"
    assert list(table) == list(values), "the table is not in values.yaml's order"
    for path, value in values.items():
        assert json.loads(table[path]) == value, f"{path}: README says {table[path]}, values.yaml {value!r}"


def test_the_schema_holds_every_value_and_refuses_others() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    jsonschema.validate(values, schema)

    def closed(node: dict[str, Any], where: str) -> None:
        """Every map of fixed keys names them all, requires them, and refuses any other."""
        if "properties" in node:
            assert node.get("additionalProperties") is False, where
            if where != "affinity":  # its three kinds are each optional
                assert sorted(node.get("required", [])) == sorted(node["properties"]), where
            for key, child in node["properties"].items():
                closed(child, f"{where}.{key}".lstrip("."))

    closed(schema, "")
    for path in leaves(values):
        node = schema
        for key in path.split("."):
            node = node["properties"][key]
    for flags, complaint in ((("--set", "imagee.tag=x"), "additional properties 'imagee' not allowed"),
                             (("--set", "server.drainTimeout=60"), "'drainTimeout' not allowed"),
                             (("--set", "target=zen5"), "value must be one of"),
                             (("--set", "resources.cpu=500m"), "want integer")):
        refused = helm("template", "x", CHART_ARGUMENT, *flags, check=False)
        assert refused.returncode != 0 and complaint in refused.stderr, refused.stderr


# the metrics the dashboard, the alerts and the autoscalers read are the server's

PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool",
                "offset", "inf", "nan"}
NOT_THE_SERVERS = {"up"}  # Prometheus's own series of each scrape target: 0 while the replica's port is closed
TARGET_LABELS = {"namespace", "service", "pod", "job", "instance", "endpoint", "container"}  # the ServiceMonitor's


def selectors(expr: str) -> list[tuple[str, set[str]]]:
    """(metric name, labels its matchers name) of every series a PromQL expression selects."""
    assert expr.count("(") == expr.count(")") and expr.count("{") == expr.count("}"), expr
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\[[^\]]*\]", "", text)  # ranges, $__rate_interval
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    found = []
    for match in re.finditer(r"(?<![\w:$.])([A-Za-z_:][\w:]*)(?![\w:])\s*(\{[^}]*\})?(?!\s*\()", text):
        name, matchers = match.groups()
        if name.lower() in PROMQL_WORDS:
            continue
        found.append((name, set(re.findall(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)", matchers or ""))))
    return found


def grouping_labels(expr: str) -> set[str]:
    return {label.strip() for group in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr)
            for label in group.split(",") if label.strip()}


def test_the_expression_reader_finds_every_series() -> None:
    expr = ('histogram_quantile(0.99, sum by (pod, le) (rate(infinity_request_duration_seconds_bucket'
            '{namespace="$namespace",service=~"a|b"}[$__rate_interval]))) / on (pod) up > 1e3 '
            'and absent(infinity_queue_depth)')
    assert selectors(expr) == [("infinity_request_duration_seconds_bucket", {"namespace", "service"}),
                               ("up", set()), ("infinity_queue_depth", set())]
    assert grouping_labels(expr) == {"pod", "le"}


def exprs_read_by_the_chart() -> dict[str, str]:
    """Every PromQL expression of the dashboard (panels and variables), the alerts and the KEDA trigger."""
    docs = render("minilm", EVERYTHING_ON)
    (text,) = one(docs, "ConfigMap")["data"].values()
    board = json.loads(text)
    found = {f"dashboard {panel['title']!r} {target['refId']}": target["expr"]
             for panel in board["panels"] for target in panel["targets"]}
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            query = re.fullmatch(r"label_values\((.+), *\w+\)", variable["query"]["query"])
            assert query, variable
            (series,) = query.groups()
            found[f"dashboard variable {variable['name']}"] = series
    for group in one(docs, "PrometheusRule")["spec"]["groups"]:
        found |= {f"alert {rule['alert']}": rule["expr"] for rule in group["rules"]}
    (trigger,) = one(docs, "ScaledObject")["spec"]["triggers"]
    found["KEDA trigger"] = trigger["metadata"]["query"]
    hpa = one(render("minilm", ("--set", "autoscaling.hpaQueueDepth.enabled=true")), "HorizontalPodAutoscaler")
    found["HPA pods metric"] = hpa["spec"]["metrics"][0]["pods"]["metric"]["name"]
    return found


def test_the_dashboard_and_alerts_cover_what_operators_watch() -> None:
    exprs = exprs_read_by_the_chart()
    dashboard = " ".join(expr for where, expr in exprs.items() if where.startswith("dashboard"))
    for needed in ("infinity_queue_depth", "infinity_batch_size_", "infinity_batch_tokens_",
                   "infinity_padded_tokens_total", "infinity_real_tokens_total", "infinity_request_duration_seconds",
                   'status="429"', 'status=~"5.."', "by (pod"):
        assert needed in dashboard, needed
    alerts = {where.removeprefix("alert "): expr for where, expr in exprs.items() if where.startswith("alert ")}
    assert sorted(alerts) == ["InfinityErrorRate", "InfinityLatencyHigh", "InfinityNoReplicaReady",
                              "InfinityQueueSaturated", "InfinityReplicaNotReady", "InfinityRequestsRefused"]
    assert alerts["InfinityQueueSaturated"].endswith("> 102.4")  # 0.8 of --max-queue 128
    assert "histogram_quantile(0.99," in alerts["InfinityLatencyHigh"] and alerts["InfinityLatencyHigh"].endswith(
        "> 0.5")
    assert variables(server_of(render("minilm", EVERYTHING_ON)))["INFINITY_MAX_QUEUE"] == "128"


def test_every_metric_they_read_is_on_a_running_servers_metrics(minilm_fp32_artifact: Path, tmp_path: Path) -> None:
    key = "a-key-for-prometheus"
    auth = {"authorization": f"Bearer {key}"}
    with running(minilm_fp32_artifact, tmp_path / "server.log", "--api-key", key) as server:
        for inputs in (["The cat sat on the mat."], ["A dog barked.", "Quarterly revenue rose four percent."]):
            assert httpx.post(f"{server.url}/predict", json={"inputs": inputs}, headers=auth,
                              timeout=WAIT).status_code == 200
        assert httpx.post(f"{server.url}/predict", json={"inputs": ["no key"]}, timeout=WAIT).status_code == 401
        exposition = httpx.get(f"{server.url}/metrics", headers=auth, timeout=WAIT).text
    labels: dict[str, set[str]] = {}  # series name as Prometheus stores it (_total, _bucket, ...) -> its labels
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            labels.setdefault(sample.name, set()).update(sample.labels)
    assert 'status="401"' in exposition  # the refused request is counted where the 429s and 5xx are

    missing, stray = [], []
    for where, expr in exprs_read_by_the_chart().items():
        read = selectors(expr)
        assert read, f"{where}: no series in {expr!r}"
        for name, matched in read:
            if name in NOT_THE_SERVERS:
                assert matched <= TARGET_LABELS, f"{where}: {name}{matched}"
                continue
            if name not in labels:
                missing.append(f"{where}: {name}")
                continue
            stray += [f"{where}: {name}{{{label}}}" for label in matched - TARGET_LABELS - labels[name]]
        known = TARGET_LABELS.union(*(labels.get(name, set()) for name, _ in read))
        stray += [f"{where}: by ({label})" for label in grouping_labels(expr) - known]
    assert not missing, f"series no running server exports: {missing}"
    assert not stray, f"labels the server never puts on those series: {stray}"


def test_a_grpc_port_value_turns_on_teis_grpc_services_and_the_service_exposes_it() -> None:
    assert "grpc" not in {port["name"] for port in server_of(render("x", ()))["ports"]}
    docs = render("x", ("--set", "server.grpcPort=50051"))
    for doc in docs:
        if (doc["apiVersion"], doc["kind"]) not in CUSTOM_KINDS:
            kubernetes_validate.validate(doc, "1.29.0", strict=True)
    server = server_of(docs)
    assert {"name": "grpc", "containerPort": 50051} in server["ports"]
    assert variables(server)["INFINITY_GRPC_PORT"] == "50051"
    assert {"name": "grpc", "port": 50051, "targetPort": "grpc", "appProtocol": "grpc"} in (
        one(docs, "Service")["spec"]["ports"])
