"""The Kubernetes manifests (deploy/kubernetes/) and the Containerfile: every manifest
valid against the Kubernetes schemas, and consistent with the worker's own config,
tenants file, probes and image."""

from __future__ import annotations

import copy
import re
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from hipr.worker.config import load_config
from hipr.worker.tenants import load_tenants

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy" / "kubernetes"
MANIFESTS = sorted(DEPLOY.glob("*.yaml"))
#: The newest schemas the validator bundles, and an older release still in service.
VERSIONS = [kubernetes_validate.latest_version(), "1.29.0"]


def _docs(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _one(kind: str, path: Path | None = None) -> dict[str, Any]:
    found = [
        doc for p in ([path] if path else MANIFESTS) for doc in _docs(p) if doc["kind"] == kind
    ]
    assert len(found) == 1, (kind, len(found))
    return found[0]


def _daemonsets() -> dict[str, dict[str, Any]]:
    return {
        vendor: _one("DaemonSet", DEPLOY / f"daemonset-{vendor}.yaml")
        for vendor in ("nvidia", "amd")
    }


def test_there_are_manifests() -> None:
    names = {p.name for p in MANIFESTS}
    assert {
        "namespace.yaml",
        "configmap.yaml",
        "secret.yaml",
        "service.yaml",
        "daemonset-nvidia.yaml",
        "daemonset-amd.yaml",
        "networkpolicy.yaml",
    } <= names


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifest_is_valid(path: Path, version: str) -> None:
    for doc in _docs(path):
        # strict: an unknown field (a typo) is an error, not silently dropped.
        kubernetes_validate.validate(doc, version, strict=True)


def test_the_validator_catches_mistakes() -> None:
    ds = copy.deepcopy(_daemonsets()["nvidia"])
    ds["spec"]["template"]["spec"]["containers"][0]["securityContext"]["readOnlyRootFs"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(ds, VERSIONS[0], strict=True)


def _worker_toml() -> str:
    return str(_one("ConfigMap")["data"]["worker.toml"])


def test_configmap_is_a_valid_worker_config(tmp_path: Path) -> None:
    tenants = tmp_path / "tenants.toml"
    tenants.write_text(_one("Secret")["stringData"]["tenants.toml"])
    text = _worker_toml().replace("/etc/hipr/tenants/tenants.toml", str(tenants))
    path = tmp_path / "worker.toml"
    path.write_text(text)
    config = load_config(path)
    assert config.metrics_listen == "0.0.0.0:9464"
    assert "unix:///run/hipr/worker.sock" in config.listen


def test_secret_holds_token_hashes_only(tmp_path: Path) -> None:
    text = _one("Secret")["stringData"]["tenants.toml"]
    data = tomllib.loads(text)
    for name, tenant in data["tenants"].items():
        for token in tenant.get("tokens", []):
            assert re.fullmatch(r"[0-9a-f]{64}", token), (name, token)
    path = tmp_path / "tenants.toml"
    path.write_text(text)
    registry = load_tenants(path)
    uid = _daemonsets()["nvidia"]["spec"]["template"]["spec"]["securityContext"]["runAsUser"]
    # The probes authenticate by the pod's uid, not by a token kept in the pod.
    assert registry.authenticate(None, unix_uid=uid).name == "probe"


@pytest.mark.parametrize("vendor", ["nvidia", "amd"])
def test_daemonset_is_hardened_probed_and_scraped(vendor: str) -> None:
    ds = _daemonsets()[vendor]
    pod = ds["spec"]["template"]
    spec = pod["spec"]
    (container,) = spec["containers"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] != 0
    assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    assert spec["automountServiceAccountToken"] is False
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["privileged"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert "add" not in sc["capabilities"]
    # Requests and limits, the GPU among them.
    resources = container["resources"]
    assert {"cpu", "memory"} <= set(resources["requests"])
    assert resources["limits"][f"{vendor}.com/gpu"] >= 1
    assert "memory" in resources["limits"]
    # Probes: `hipr ping` over the Unix socket the config listens on.
    for probe in ("readinessProbe", "livenessProbe"):
        command = container[probe]["exec"]["command"]
        assert command[:2] == ["hipr", "ping"], command
        assert command[2] in tomllib.loads(_worker_toml())["listen"]
        assert "--timeout" in command
    # Prometheus: the annotation, the container port and the config agree.
    metrics_port = int(tomllib.loads(_worker_toml())["metrics_listen"].rsplit(":", 1)[1])
    annotations = pod["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert int(annotations["prometheus.io/port"]) == metrics_port
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["metrics"] == metrics_port
    assert ports["hipr"] == 18515
    # The config and the tenants file come from the ConfigMap and the Secret.
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert volumes["config"]["configMap"]["name"] == _one("ConfigMap")["metadata"]["name"]
    assert volumes["tenants"]["secret"]["secretName"] == _one("Secret")["metadata"]["name"]
    config_arg = container["args"][container["args"].index("--config") + 1]
    assert config_arg == f"{mounts['config']['mountPath']}/worker.toml"
    tenants_file = tomllib.loads(_worker_toml())["tenants_file"]
    assert tenants_file == f"{mounts['tenants']['mountPath']}/tenants.toml"
    # Writable places are emptyDirs; the root filesystem is read-only.
    for name in ("run", "cache", "tmp"):
        assert "emptyDir" in volumes[name]


def test_the_two_daemonsets_differ_only_in_the_gpu() -> None:
    nvidia, amd = (copy.deepcopy(d) for d in _daemonsets().values())
    for ds in (nvidia, amd):
        spec = ds["spec"]["template"]["spec"]
        container = spec["containers"][0]
        vendor = ds["metadata"]["labels"].pop("hipr.io/gpu-vendor")
        assert container["resources"]["limits"].pop(f"{vendor}.com/gpu") >= 1
        assert spec["tolerations"][0]["key"] == f"{vendor}.com/gpu"
        for key in ("nodeSelector", "tolerations"):
            spec.pop(key)
        spec["securityContext"].pop("supplementalGroups")
        container.pop("image")
    assert nvidia == amd


def test_headless_service_lists_the_workers() -> None:
    service = _one("Service")
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is False
    pod_labels = _daemonsets()["nvidia"]["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
    assert ports == {"hipr": 18515, "metrics": 9464}
    namespaces = {doc["metadata"].get("namespace") for p in MANIFESTS for doc in _docs(p)}
    assert namespaces == {None, _one("Namespace")["metadata"]["name"]}


def test_containerfile_matches_the_manifests() -> None:
    text = (REPO / "Containerfile").read_text()
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    for extra in re.findall(r"--build-arg EXTRAS=(\w*)", text):
        assert extra == "" or extra in extras, extra
    assert re.search(r"^ARG EXTRAS=(\w+)$", text, re.M)
    assert re.search(r"^FROM \$\{BASE\}", text, re.M)
    assert "python:3.11-slim" in text
    uid = _daemonsets()["nvidia"]["spec"]["template"]["spec"]["securityContext"]["runAsUser"]
    assert f"USER {uid}:" in text
    assert '"/etc/hipr/config/worker.toml"' in text
    readme = (REPO / "docs" / "guide.md").read_text()  # the README links the guide
    assert "Containerfile" in readme and "build" in readme
