"""Every manifest in deploy/kubernetes validates against the schemas of what it is, offline.

Kubernetes' own kinds (Deployment, Service) against the API's OpenAPI schemas that kubernetes-validate
ships in its wheel, strict (an unknown field is an error, as `kubectl apply --validate=strict`);
KServe's (InferenceService, ClusterServingRuntime) against the openAPIV3Schema of KServe's published
CRDs (tests/kserve_crds/, copied unchanged) with jsonschema, unknown fields refused the same way."""
from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from ringserve.cli import build_parser, settings_from_args

ROOT = Path(__file__).resolve().parents[3]
MANIFESTS = sorted((ROOT / "deploy" / "kubernetes").glob("*.yaml"))
CRDS = ROOT / "tests" / "kserve_crds"
KSERVE_GROUP = "serving.kserve.io"
Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # (the InferenceService CRD is 2 MB: libyaml reads it in 0.6 s)


def documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.load_all(path.read_text(), Loader=Loader) if doc]


@functools.cache
def crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) -> the CRD's openAPIV3Schema, every object closed to unknown fields."""
    schemas = {}
    for path in CRDS.glob("*.yaml"):
        (crd,) = documents(path)
        for version in crd["spec"]["versions"]:
            api_version = f"{crd['spec']['group']}/{version['name']}"
            schemas[api_version, crd["spec"]["names"]["kind"]] = closed(version["schema"]["openAPIV3Schema"])
    return schemas


def closed(schema: Any) -> Any:
    """The schema with `additionalProperties: false` on each object that lists its properties and does not
    keep unknown fields (x-kubernetes-preserve-unknown-fields): the API server prunes those, silently."""
    if isinstance(schema, list):
        return [closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: closed(value) for key, value in schema.items()}
    keeps_unknown = out.get("x-kubernetes-preserve-unknown-fields")
    if "properties" in out and "additionalProperties" not in out and not keeps_unknown:
        out["additionalProperties"] = False
    return out


def problems(doc: dict[str, Any]) -> list[str]:
    """Why `doc` is not a valid object of its kind; [] when it is."""
    api_version, kind = doc.get("apiVersion", ""), doc.get("kind", "")
    if api_version.split("/")[0] == KSERVE_GROUP:
        schema = crd_schemas().get((api_version, kind))
        if schema is None:
            return [f"no KServe CRD for {api_version} {kind} in {CRDS}"]
        validator = jsonschema.Draft7Validator(schema)
        return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]
    try:
        kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)
    except kubernetes_validate.ValidationError as exc:
        return [f"{'.'.join(map(str, exc.path))}: {exc.message}"]
    return []


def test_there_are_manifests_of_both_origins() -> None:
    kinds = {doc["kind"] for path in MANIFESTS for doc in documents(path)}
    assert {"Deployment", "Service", "InferenceService", "ClusterServingRuntime"} <= kinds


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_the_manifest_validates_against_its_kinds_schema(path: Path) -> None:
    for doc in documents(path):
        assert problems(doc) == [], f"{path.name}: {doc['kind']} {doc['metadata']['name']}"


def runtime() -> dict[str, Any]:
    (doc,) = documents(ROOT / "deploy" / "kubernetes" / "clusterservingruntime.yaml")
    return doc


def test_a_misspelt_or_mistyped_field_is_refused_in_either_kind_of_manifest() -> None:
    """The validation above can fail: a field KServe does not know, a port that is not a number, and a
    Deployment's container field that Kubernetes does not know."""
    bad_runtime = copy.deepcopy(runtime())
    bad_runtime["spec"]["securityContext"] = {"runAsUser": 10001}  # (a pod field the runtime's spec lacks)
    bad_runtime["spec"]["containers"][0]["ports"][0]["containerPort"] = "8080"
    found = problems(bad_runtime)
    assert any("securityContext" in p for p in found) and any("'8080' is not of type 'integer'" in p for p in found)
    (deployment,) = documents(ROOT / "deploy" / "kubernetes" / "deployment.yaml")
    deployment["spec"]["template"]["spec"]["containers"][0]["imagee"] = "ringserve:cuda"
    assert problems(deployment) != []


def test_the_runtime_serves_triton_and_onnx_models_over_v2_http_and_grpc_with_ringserves_real_flags() -> None:
    spec = runtime()["spec"]
    assert {f["name"] for f in spec["supportedModelFormats"]} == {"triton", "onnx"}
    assert all(f["autoSelect"] for f in spec["supportedModelFormats"])
    assert set(spec["protocolVersions"]) == {"v2", "grpc-v2"}
    (container,) = spec["containers"]
    assert container["name"] == "kserve-container" and container["command"] == ["ringserve", "serve"]
    settings = settings_from_args(build_parser().parse_args(["serve", *container["args"]]))
    assert (settings.model_repository, settings.host, settings.port) == ("/mnt/models", "0.0.0.0", 8080)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http1": settings.port, "h2c": settings.grpc_port}
    assert spec["annotations"]["prometheus.kserve.io/port"] == str(settings.metrics_port)
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": settings.port}


def test_the_runtime_gives_dev_shm_the_rings_and_says_what_serverless_and_rawdeployment_need() -> None:
    spec = runtime()["spec"]
    (container,) = spec["containers"]
    settings = settings_from_args(build_parser().parse_args(["serve", *container["args"]]))
    (dshm,) = [v for v in spec["volumes"] if v["name"] == "dshm"]
    assert dshm["emptyDir"]["medium"] == "Memory"
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    rings_mib = settings.gateways * (settings.slot_count * settings.slot_mb + 1)  # (+ a header page each)
    assert int(dshm["emptyDir"]["sizeLimit"].removesuffix("Mi")) >= rings_mib
    text = (ROOT / "deploy" / "kubernetes" / "clusterservingruntime.yaml").read_text()
    assert "kubernetes.podspec-emptydir" in text and "RawDeployment" in text and "Serverless" in text
    assert "Triton's" in text  # the command line that is another issue


def test_the_inferenceservice_that_names_the_runtime_asks_for_a_format_it_supports() -> None:
    (isvc,) = documents(ROOT / "deploy" / "kubernetes" / "inferenceservice-runtime.yaml")
    model = isvc["spec"]["predictor"]["model"]
    assert model["runtime"] == runtime()["metadata"]["name"]
    assert model["modelFormat"]["name"] in {f["name"] for f in runtime()["spec"]["supportedModelFormats"]}
    assert model["protocolVersion"] in runtime()["spec"]["protocolVersions"]
