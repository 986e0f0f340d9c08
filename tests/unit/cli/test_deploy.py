"""Deployment files agree with the server: parsed and checked by structure (no cluster here)."""
from __future__ import annotations

import re
from pathlib import Path

import yaml

from ringserve.cli import build_parser, settings_from_args

from .test_docker import DOCKERFILES, stages

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"
SERVE_DEFAULTS = settings_from_args(build_parser().parse_args(["serve", "--model-repository", "/m"]))


def manifests(name: str) -> list[dict]:
    return list(yaml.safe_load_all((DEPLOY / "kubernetes" / name).read_text()))


def container_args(container: dict) -> dict[str, str]:
    args = container["args"]
    return {args[i]: args[i + 1] for i in range(0, len(args) - 1) if args[i].startswith("--")}


def mebibytes(quantity: str) -> int:
    units = {"Mi": 1, "Gi": 1024}
    return int(quantity[:-2]) * units[quantity[-2:]]


def test_deployment_probes_ports_and_shm_agree_with_the_server():
    (deployment,) = manifests("deployment.yaml")
    pod = deployment["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    args = container_args(container)
    port = int(args["--port"])
    assert port == SERVE_DEFAULTS.port
    assert container["ports"][0]["containerPort"] == port
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert "preStop" in container["lifecycle"]
    assert pod["spec"]["terminationGracePeriodSeconds"] > float(args["--drain-timeout-s"]) + 5
    annotations = pod["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == args["--metrics-port"] and annotations["prometheus.io/path"] == "/metrics"
    assert "nvidia.com/gpu" in container["resources"]["limits"]
    # /dev/shm must hold the ring: slot_count x slot_mb plus the header page.
    (dshm,) = [v for v in pod["spec"]["volumes"] if v["name"] == "dshm"]
    assert dshm["emptyDir"]["medium"] == "Memory"
    ring_mib = int(args["--slot-count"]) * int(args["--slot-mb"]) + 1
    assert mebibytes(dshm["emptyDir"]["sizeLimit"]) >= ring_mib
    assert {"mountPath": "/dev/shm", "name": "dshm"} in container["volumeMounts"]


def built_images() -> dict[str, str]:
    """Image tag -> its Dockerfile, from each file's `docker build -t TAG` line."""
    tags = {}
    for path in DOCKERFILES.values():
        (tag,) = re.findall(r"docker build -t (\S+)", path.read_text())
        tags[tag] = path.name
    return tags


def container_settings(container: dict):
    assert container["command"] == ["ringserve", "serve"]
    return settings_from_args(build_parser().parse_args(["serve", *container["args"]]))


def pod_containers() -> list[tuple[dict, dict, dict]]:
    """(pod spec, container, pod metadata) of the Deployment and the InferenceService."""
    (deployment,) = manifests("deployment.yaml")
    (isvc,) = manifests("inferenceservice.yaml")
    template = deployment["spec"]["template"]
    return [(template["spec"], template["spec"]["containers"][0], template["metadata"]),
            (isvc["spec"]["predictor"], isvc["spec"]["predictor"]["containers"][0], isvc["metadata"])]


def test_the_manifests_run_an_image_the_dockerfiles_build_as_its_user_with_its_ports():
    images = built_images()
    assert set(images) == {"ringserve:latest", "ringserve:cuda"}
    uid = int(stages(DOCKERFILES["cpu"])[-1].last("USER").split(":")[0])
    for pod, container, metadata in pod_containers():
        assert container["image"] in images
        if "nvidia.com/gpu" in container.get("resources", {}).get("limits", {}):
            assert images[container["image"]] == "Dockerfile.cuda", "a GPU pod runs the CUDA image"
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == uid
        settings = container_settings(container)
        assert settings.host == "0.0.0.0" and settings.metrics_port
        ports = {p["containerPort"]: p.get("name") for p in container["ports"]}
        assert ports.get(settings.port) in ("http", "h1c")
        annotations = metadata["annotations"]
        scrape_port = annotations.get("prometheus.io/port") or annotations["prometheus.kserve.io/port"]
        assert int(scrape_port) == settings.metrics_port  # scraped on --metrics-port
        if len(ports) > 1:  # (KServe's predictor takes one port)
            assert ports == {settings.port: "http", settings.grpc_port: "grpc", settings.metrics_port: "metrics"}


def test_dev_shm_holds_every_gateways_ring_and_the_gateway_count_is_fixed():
    """A pod sees its node's CPUs: the default gateway count (one per 4) would size the rings by the node."""
    for pod, container, _ in pod_containers():
        settings = container_settings(container)
        assert "--gateways" in container["args"] and settings.gateways >= 1
        (dshm,) = [v for v in pod["volumes"] if v["name"] == "dshm"]
        assert dshm["emptyDir"]["medium"] == "Memory"
        rings_mib = settings.gateways * settings.slot_count * settings.slot_mb + settings.gateways  # + header pages
        assert mebibytes(dshm["emptyDir"]["sizeLimit"]) >= rings_mib
        assert {"mountPath": "/dev/shm", "name": "dshm"} in container["volumeMounts"]


def test_service_targets_the_named_port_and_inferenceservice_uses_v2_probes():
    (service,) = manifests("service.yaml")
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    assert {p["targetPort"] for p in service["spec"]["ports"]} == {"http", "grpc"}
    (isvc,) = manifests("inferenceservice.yaml")
    assert isvc["kind"] == "InferenceService"
    (container,) = isvc["spec"]["predictor"]["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert container["ports"][0]["containerPort"] == int(container_args(container)["--port"])


def test_haproxy_checks_readiness_and_retries_503():
    text = (DEPLOY / "haproxy" / "haproxy.cfg").read_text()
    assert "option httpchk GET /v2/health/ready" in text
    assert "retry-on" in text and " 503" in text.split("retry-on", 1)[1].splitlines()[0]


def test_the_systemd_env_file_keeps_client_shared_memory_off_and_says_what_on_trusts():
    units = DEPLOY.parent / "systemd"
    env, service = (units / "ringserve.env").read_text(), (units / "ringserve.service").read_text()
    assert "\nRINGSERVE_ALLOW_CLIENT_SHM=false\n" in env and "--client-shm-key-prefix" in env
    assert "true trusts every client that can reach the" in env
    assert "--allow-client-shm ${RINGSERVE_ALLOW_CLIENT_SHM}" in service
    assert "RINGSERVE_ALLOW_CLIENT_SHM=false" in next(l for l in service.splitlines() if l.startswith("Environment="))
    parsed = settings_from_args(build_parser().parse_args(["serve", "--model-repository", "/m",
                                                           "--allow-client-shm", "false"]))
    assert parsed.allow_client_shm is SERVE_DEFAULTS.allow_client_shm is False
