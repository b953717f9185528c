"""The deployment files in deploy/ hold together: each says how to use it, Ray's own
validation accepts the cluster-launcher config, the KubeRay manifests and the compose
file have what they need, every image is pinned to a tag, and no credential is
written in any of them (they come from a Secret, an env file or the environment)."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
SECRET_NAME = re.compile(r"(SECRET|PASSWORD|ACCESS_KEY|TOKEN|ROOT_USER)", re.I)


def load(name: str) -> Any:
    return yaml.safe_load((DEPLOY / name).read_text())


def pinned(image: str) -> bool:
    """``repo:tag`` (or a digest) with a tag that is not ``latest``."""
    if "@sha256:" in image:
        return True
    name, _, tag = image.rpartition(":")
    return bool(name) and "/" not in tag and tag not in ("", "latest")


def walk(node: Any) -> Iterator[tuple[str, Any]]:
    """Every (key, value) pair of a YAML document, at any depth."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield key, value
            yield from walk(value)
    elif isinstance(node, list):
        for item in node:
            yield from walk(item)


def test_every_deploy_file_opens_with_how_to_use_it():
    files = [p for p in DEPLOY.iterdir() if p.is_file()]
    assert {"ray-cluster.yaml", "kuberay.yaml", "docker-compose.yml",
            "Dockerfile"} <= {p.name for p in files}
    for path in files:
        head = path.read_text().lstrip().splitlines()[:3]
        assert head[0].startswith(("#", '"""')), f"{path.name} has no header comment"


def test_pinned_accepts_tags_and_refuses_latest_or_none():
    assert pinned("minio/minio:RELEASE.2025-04-22T22-12-26Z")
    assert pinned("localhost:5000/bastion:0.1.0")
    assert not pinned("minio/minio:latest")
    assert not pinned("minio/minio")
    assert not pinned("localhost:5000/bastion")


# -- the Ray cluster launcher -------------------------------------------------------------


def test_cluster_launcher_config_passes_rays_own_validation():
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = load("ray-cluster.yaml")
    validate_config(prepare_config(copy.deepcopy(config)))  # raises when invalid
    assert pinned(config["docker"]["image"])
    workers = config["available_node_types"]["ray.worker.default"]
    assert workers["min_workers"] >= 2  # a node-loss drill needs three nodes
    assert any("--metrics-export-port" in c for c in config["head_start_ray_commands"])


def test_cluster_launcher_validation_catches_a_broken_config():
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = load("ray-cluster.yaml")
    config["available_node_types"]["ray.head.default"]["no_such_field"] = 1
    with pytest.raises(Exception, match="no_such_field"):
        validate_config(prepare_config(config))


def test_cluster_launcher_config_keeps_credentials_in_a_mounted_file():
    text = (DEPLOY / "ray-cluster.yaml").read_text()
    config = yaml.safe_load(text)
    assert not re.search(r"(ACCESS|SECRET)_KEY=\S", _without_comments(text))
    assert "/home/ray/.bastion/s3.env" in config["file_mounts"]
    for command in config["head_start_ray_commands"] + config["worker_start_ray_commands"]:
        if "ray start" in command:
            assert ". /home/ray/.bastion/s3.env" in command


# -- KubeRay -----------------------------------------------------------------------------


def kuberay() -> dict[str, list[dict]]:
    kinds: dict[str, list[dict]] = {}
    for doc in yaml.safe_load_all((DEPLOY / "kuberay.yaml").read_text()):
        kinds.setdefault(doc["kind"], []).append(doc)
    return kinds


def containers(doc: dict) -> list[dict]:
    return [c for key, value in walk(doc) if key == "containers" for c in value]


def test_kuberay_ray_cluster_has_a_head_and_worker_groups():
    [cluster] = kuberay()["RayCluster"]
    assert cluster["apiVersion"] == "ray.io/v1"
    spec = cluster["spec"]
    head = spec["headGroupSpec"]
    assert head["rayStartParams"]["metrics-export-port"] == "8080"
    assert head["template"]["spec"]["containers"]
    assert spec["workerGroupSpecs"]
    for group in spec["workerGroupSpecs"]:
        assert group["groupName"] and group["template"]["spec"]["containers"]
        assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
    assert sum(g["replicas"] for g in spec["workerGroupSpecs"]) >= 2


def test_kuberay_minio_is_a_deployment_with_a_service():
    kinds = kuberay()
    [minio] = [d for d in kinds["Deployment"] if d["metadata"]["name"] == "minio"]
    labels = minio["spec"]["template"]["metadata"]["labels"]
    assert minio["spec"]["selector"]["matchLabels"] == labels
    [service] = [s for s in kinds["Service"] if s["metadata"]["name"] == "minio"]
    assert service["spec"]["selector"] == labels
    assert 9000 in [p["port"] for p in service["spec"]["ports"]]


def test_kuberay_job_runs_a_node_loss_drill_against_the_cluster():
    [job] = kuberay()["Job"]
    [container] = containers(job)
    command = container["command"]
    assert command[:2] == ["bastion", "drill"]
    assert any(a.startswith("--kill-node=") for a in command)
    assert any(a.startswith("--address=bastion-head-svc:") for a in command)
    storage = next(a for a in command if a.startswith("--storage="))
    assert storage.startswith("--storage=s3://") and "endpoint=minio:9000" in storage
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"


def test_kuberay_images_are_pinned_and_credentials_come_from_a_secret():
    docs = [d for ds in kuberay().values() for d in ds]
    assert "Secret" not in kuberay()  # made with kubectl, never written in the file
    found = [c for d in docs for c in containers(d)]
    assert len(found) >= 4  # minio, head, worker, drill
    for c in found:
        assert pinned(c["image"]), c["image"]
        secret_vars = [e for e in c.get("env", []) if SECRET_NAME.search(e["name"])]
        assert secret_vars, f"{c['name']} gets no credentials"
        for e in secret_vars:
            assert "value" not in e, f"{c['name']}: {e['name']} written inline"
            assert e["valueFrom"]["secretKeyRef"]["name"] == "bastion-s3"


# -- docker compose ----------------------------------------------------------------------


def test_compose_runs_a_ray_head_two_workers_and_minio():
    services = load("docker-compose.yml")["services"]
    assert {"ray-head", "ray-worker-1", "ray-worker-2", "minio"} <= set(services)
    assert "--head" in services["ray-head"]["command"]
    for name in ("ray-worker-1", "ray-worker-2"):
        assert "--address=ray-head:6379" in services[name]["command"]
    assert all("--metrics-export-port" in services[n]["command"]
               for n in ("ray-head", "ray-worker-1", "ray-worker-2"))


def test_compose_images_are_pinned_ports_loopback_and_secrets_from_the_environment():
    services = load("docker-compose.yml")["services"]
    for name, service in services.items():
        assert pinned(service["image"]), (name, service["image"])
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), (name, port)
        env = service.get("environment", {})
        secret_vars = {k: v for k, v in env.items() if SECRET_NAME.search(k)}
        for key, value in secret_vars.items():
            assert re.fullmatch(r"\$\{[A-Z][A-Z0-9_]*(:\?[^}]*)?\}", str(value)), (name, key)
    assert pinned(services["minio"]["image"])
    assert services["minio"]["image"].startswith("minio/minio:RELEASE.")


def test_dockerfile_base_image_is_pinned():
    base = next(line.split()[1] for line in (DEPLOY / "Dockerfile").read_text().splitlines()
                if line.startswith("FROM "))
    assert pinned(base)


def test_env_example_is_the_only_place_with_placeholder_credentials():
    example = (DEPLOY / "bastion.env.example").read_text()
    assert "BASTION_S3_SECRET_KEY=" in example
    ignored = (DEPLOY.parent / ".gitignore").read_text().splitlines()
    assert "deploy/bastion.env" in ignored


def _without_comments(text: str) -> str:
    return "\n".join(line.split("#", 1)[0] for line in text.splitlines())
