"""Deployment files agree with the server: parsed and checked by structure (no cluster here)."""
from __future__ import annotations

from pathlib import Path

import yaml

from ringserve.cli import build_parser, settings_from_args

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
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
    assert annotations["prometheus.io/port"] == str(port) and annotations["prometheus.io/path"] == "/metrics"
    assert "nvidia.com/gpu" in container["resources"]["limits"]
    # /dev/shm must hold the ring: slot_count x slot_mb plus the header page.
    (dshm,) = [v for v in pod["spec"]["volumes"] if v["name"] == "dshm"]
    assert dshm["emptyDir"]["medium"] == "Memory"
    ring_mib = int(args["--slot-count"]) * int(args["--slot-mb"]) + 1
    assert mebibytes(dshm["emptyDir"]["sizeLimit"]) >= ring_mib
    assert {"mountPath": "/dev/shm", "name": "dshm"} in container["volumeMounts"]


def test_service_targets_the_named_port_and_inferenceservice_uses_v2_probes():
    (service,) = manifests("service.yaml")
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    (isvc,) = manifests("inferenceservice.yaml")
    assert isvc["kind"] == "InferenceService"
    (container,) = isvc["spec"]["predictor"]["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert container["ports"][0]["containerPort"] == int(container_args(container)["--port"])


def test_haproxy_checks_readiness_and_retries_503():
    text = (DEPLOY / "haproxy" / "haproxy.cfg").read_text()
    assert "option httpchk GET /v2/health/ready" in text
    assert "retry-on" in text and " 503" in text.split("retry-on", 1)[1].splitlines()[0]
