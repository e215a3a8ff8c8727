"""deploy/kubernetes: valid against the Kubernetes schemas (bundled with kubernetes-validate, offline)
and consistent with the server: health routes, port, drain time, the targets the image holds and their CPU flags."""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from optimize.presets import PRESETS, target_list

DEPLOY = Path(__file__).resolve().parents[1] / "deploy" / "kubernetes"
# native sidecars (init containers with restartPolicy: Always) are on by default from 1.29
KUBERNETES_VERSIONS = ("1.29.0", kubernetes_validate.utils.latest_version())


def documents(folder: Path = DEPLOY) -> list[tuple[str, dict[str, Any]]]:
    return [(f"{path.name}#{i}", doc) for path in sorted(folder.glob("*.yaml"))
            for i, doc in enumerate(yaml.safe_load_all(path.read_text())) if doc]


AUTOSCALING = dict(documents(DEPLOY / "autoscaling"))
BUILT_IN = [(name, doc) for name, doc in AUTOSCALING.items() if doc["apiVersion"].startswith("autoscaling/")]


def by_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {doc["metadata"]["name"]: doc for _, doc in documents() if doc["kind"] == kind}


def server_containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    everything = pod.get("initContainers", []) + pod["containers"]
    return [c for c in everything if "infinity" in c["image"]]


def env(container: dict[str, Any], name: str, default: str) -> str:
    return next((e["value"] for e in container.get("env", []) if e["name"] == name), default)


def test_the_manifests_are_there() -> None:
    kinds = sorted(doc["kind"] for _, doc in documents())
    assert kinds == ["Deployment", "Deployment", "Service"]
    assert sorted(AUTOSCALING) == ["hpa-cpu.yaml#0", "hpa-queue-depth.yaml#0", "keda-queue-depth.yaml#0",
                                   "servicemonitor.yaml#0"]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("name,doc", documents() + BUILT_IN, ids=[name for name, _ in documents() + BUILT_IN])
def test_valid_against_the_kubernetes_schema(name: str, doc: dict[str, Any], version: str) -> None:
    kubernetes_validate.validate(doc, version, strict=True)


@pytest.mark.parametrize("deployment", by_kind("Deployment").values(), ids=list(by_kind("Deployment")))
def test_server_probes_resources_and_termination(deployment: dict[str, Any]) -> None:
    pod = deployment["spec"]["template"]["spec"]
    (server,) = server_containers(pod)
    port = int(env(server, "INFINITY_PORT", "8080"))
    probes = {kind: server[kind]["httpGet"] for kind in ("startupProbe", "livenessProbe", "readinessProbe")
              if kind in server}
    assert probes["livenessProbe"]["path"] == "/health/live"
    assert {probes[kind]["path"] for kind in probes if kind != "livenessProbe"} == {"/health/ready"}
    ports = {p["name"]: p["containerPort"] for p in server.get("ports", [])}
    assert all(ports.get(p["port"], p["port"]) == port for p in probes.values())
    # whole CPUs, requests == limits: Guaranteed QoS, and the server's default threads = the quota
    resources = server["resources"]
    assert resources["requests"] == resources["limits"]
    assert float(resources["limits"]["cpu"]).is_integer()
    # SIGTERM: the preStop pause and the server's drain must fit in the grace period
    pause = int(server.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", ["sleep", "0"])[1])
    drain = int(env(server, "INFINITY_DRAIN_TIMEOUT", "30"))
    assert pod["terminationGracePeriodSeconds"] > pause + drain
    user = server.get("securityContext", {}).get("runAsUser", pod.get("securityContext", {}).get("runAsUser"))
    assert user == 10001 and pod["securityContext"]["runAsNonRoot"]


def commented_affinity(path: Path) -> dict[str, Any]:
    """The `affinity:` block a manifest keeps commented out (for single-target images), uncommented."""
    lines = path.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "# affinity:")
    indent = lines[start].index("#")
    block = [lines[start]]
    for line in lines[start + 1:]:
        if not line[indent:].startswith("#   "):  # deeper than `affinity:`
            break
        block.append(line)
    parsed = yaml.safe_load("\n".join(line[indent + 2:] for line in block))
    assert isinstance(parsed, dict)
    return dict(parsed["affinity"])


def dockerfile_target() -> str:
    text = (DEPLOY.parents[1] / "Dockerfile.cpu").read_text()
    (target,) = [line.split("=", 1)[1] for line in text.splitlines() if line.startswith("ARG TARGET=")]
    return target


def nfd_labels(affinity: dict[str, Any]) -> list[set[str]]:
    terms = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    return [{e["key"] for e in term["matchExpressions"] if e["operator"] == "In" and e["values"] == ["true"]}
            for term in terms]


def test_a_bundle_image_goes_to_any_node_and_a_single_target_one_to_nodes_with_its_cpu_flags() -> None:
    """The default image holds a bundle (Dockerfile.cpu's TARGET): each pod serves the target its node fits, so
    the Deployment pins nothing; the affinity for a single-target image (its first target) is kept commented out,
    and uncommented it is valid and asks Node Feature Discovery for that target's flags."""
    deployment = by_kind("Deployment")["infinity-minilm"]
    targets = deployment["metadata"]["annotations"]["infinity.dev/targets"].split(",")
    assert tuple(targets) == target_list(dockerfile_target()) and len(targets) > 1
    assert "affinity" not in deployment["spec"]["template"]["spec"]
    pinned = copy.deepcopy(deployment)
    pinned["spec"]["template"]["spec"]["affinity"] = commented_affinity(DEPLOY / "deployment.yaml")
    for version in KUBERNETES_VERSIONS:
        kubernetes_validate.validate(pinned, version, strict=True)
    preset = PRESETS[targets[0]]
    for required in nfd_labels(pinned["spec"]["template"]["spec"]["affinity"]):
        # Node Feature Discovery labels: avx512_vnni -> feature.node.kubernetes.io/cpu-cpuid.AVX512VNNI
        assert {f"feature.node.kubernetes.io/cpu-cpuid.{flag.replace('_', '').upper()}"
                for flag in preset.required_cpu_flags} <= required


def test_service_and_autoscalers_point_at_the_deployment() -> None:
    deployment = by_kind("Deployment")["infinity-minilm"]
    service = by_kind("Service")["infinity-minilm"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    target = {"apiVersion": "apps/v1", "kind": "Deployment", "name": "infinity-minilm"}
    for name, doc in AUTOSCALING.items():
        if doc["kind"] in ("HorizontalPodAutoscaler", "ScaledObject"):
            assert doc["spec"]["scaleTargetRef"] == target, name
            assert doc["spec"].get("minReplicas", doc["spec"].get("minReplicaCount")) >= 2, name


def test_queue_depth_autoscalers_read_a_metric_the_server_exports_from_what_prometheus_scrapes() -> None:
    from infinity.metrics import Metrics

    exported = {metric.name for metric in Metrics(lambda: 0).registry.collect()}
    keda = AUTOSCALING["keda-queue-depth.yaml#0"]
    (trigger,) = keda["spec"]["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metricType"] == "AverageValue"
    assert float(trigger["metadata"]["threshold"]) > 0
    assert "infinity_queue_depth" in exported and "infinity_queue_depth" in trigger["metadata"]["query"]
    assert 'service="infinity-minilm"' in trigger["metadata"]["query"]
    hpa = AUTOSCALING["hpa-queue-depth.yaml#0"]
    (metric,) = hpa["spec"]["metrics"]
    assert metric["pods"]["metric"]["name"] == "infinity_queue_depth"
    assert metric["pods"]["target"]["averageValue"] == trigger["metadata"]["threshold"]

    monitor = AUTOSCALING["servicemonitor.yaml#0"]
    service = by_kind("Service")["infinity-minilm"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == service["spec"]["ports"][0]["name"] and endpoint["path"] == "/metrics"
    secret = next(v["secret"]["secretName"] for v in by_kind("Deployment")["infinity-minilm"]["spec"]["template"]
                  ["spec"]["volumes"] if "secret" in v)
    assert endpoint["authorization"]["credentials"]["name"] == secret


def test_the_sidecar_is_only_reachable_inside_the_pod() -> None:
    pod = by_kind("Deployment")["search-api"]["spec"]["template"]["spec"]
    (server,) = server_containers(pod)
    assert server["restartPolicy"] == "Always"  # a native sidecar: starts before the app, stops after it
    assert env(server, "INFINITY_HOST", "0.0.0.0") == "127.0.0.1"
    (app,) = [c for c in pod["containers"] if c is not server]
    port = env(server, "INFINITY_PORT", "8080")
    assert env(app, "EMBEDDINGS_URL", "") == f"http://127.0.0.1:{port}/predict"


def test_every_server_variable_is_a_setting_the_server_parses(tmp_path: Path) -> None:
    from infinity.cli import build_parser, settings_from

    (tmp_path / "keys").write_text("a-key-from-the-secret\n")
    for deployment in by_kind("Deployment").values():
        for server in server_containers(deployment["spec"]["template"]["spec"]):
            variables = {e["name"]: e["value"] for e in server.get("env", []) if e["name"].startswith("INFINITY_")}
            assert variables
            files = {"INFINITY_API_KEY_FILE": str(tmp_path / "keys")}  # read at start-up, so it must exist here
            parsed = settings_from(build_parser().parse_args(["serve", "/model"]), {**variables, **{
                name: path for name, path in files.items() if name in variables}})
            for name in set(variables) - set(files):
                assert hasattr(parsed, name.removeprefix("INFINITY_").lower()), name
            if "INFINITY_API_KEY_FILE" in variables:
                assert parsed.api_keys == ("a-key-from-the-secret",)


def test_the_deployment_reads_its_api_keys_from_a_mounted_secret() -> None:
    pod = by_kind("Deployment")["infinity-minilm"]["spec"]["template"]["spec"]
    (server,) = server_containers(pod)
    path = Path(env(server, "INFINITY_API_KEY_FILE", ""))
    (mount,) = [m for m in server["volumeMounts"] if Path(m["mountPath"]) == path.parent]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert mount["readOnly"] and volume["secret"]["secretName"] == "infinity-api-keys"
    assert not volume["secret"].get("optional", False)
