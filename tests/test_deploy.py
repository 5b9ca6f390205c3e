"""The deployment files are products too: the Dockerfiles lint clean, the image's entry command
is the server the tests run, and every manifest the Helm chart renders (default values and the
GPU/autoscaling values) validates against the Kubernetes schemas and agrees with the CLI."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest
import yaml

from model_builders import write_scaled_version
from ortserve.cli.serve import serve
from ortserve.testing import ServerProcess, free_port
from workers_helpers import ready_status

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "deploy" / "helm" / "ortserve"
KSERVE = ROOT / "deploy" / "kserve"
KUBERNETES_VERSION = "1.33.0"
_BIN = Path(sys.executable).parent

# Kinds defined by CRDs have no schema in kubernetes-validate: the fields their controllers
# need are checked here instead.
_CRD_SCHEMAS: dict[str, dict[str, Any]] = {
    "ServiceMonitor": {
        "type": "object",
        "required": ["apiVersion", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"},
            "spec": {
                "type": "object",
                "required": ["selector", "endpoints"],
                "properties": {
                    "endpoints": {
                        "type": "array",
                        "minItems": 1,
                        "items": {"type": "object", "required": ["port"]},
                    }
                },
            },
        },
    },
    "ClusterServingRuntime": {
        "type": "object",
        "required": ["apiVersion", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "serving.kserve.io/v1alpha1"},
            "spec": {
                "type": "object",
                "required": ["supportedModelFormats", "protocolVersions", "containers"],
                "properties": {
                    "supportedModelFormats": {
                        "type": "array",
                        "contains": {"type": "object", "properties": {"name": {"const": "onnx"}}},
                    },
                    "protocolVersions": {
                        "type": "array",
                        "items": {"enum": ["v1", "v2", "grpc-v1", "grpc-v2"]},
                    },
                    "containers": {
                        "type": "array",
                        "minItems": 1,
                        "items": {
                            "type": "object",
                            "required": ["name", "image"],
                            "properties": {"name": {"const": "kserve-container"}},
                        },
                    },
                },
            },
        },
    },
    "InferenceService": {
        "type": "object",
        "required": ["apiVersion", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "serving.kserve.io/v1beta1"},
            "spec": {
                "type": "object",
                "required": ["predictor"],
                "properties": {
                    "predictor": {
                        "type": "object",
                        "required": ["model"],
                        "properties": {
                            "model": {
                                "type": "object",
                                "required": ["modelFormat", "storageUri"],
                            }
                        },
                    }
                },
            },
        },
    },
}


def _validate(document: dict[str, Any]) -> None:
    kind = document["kind"]
    if kind in _CRD_SCHEMAS:
        jsonschema.validate(document, _CRD_SCHEMAS[kind])
    else:
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)


def _render(values_file: str | None) -> list[dict[str, Any]]:
    values = yaml.safe_load((CHART / values_file).read_text()) if values_file else {}
    with helm.Chart.load(str(CHART)) as chart:
        rendered = chart.render(values, name="demo", namespace="serving")
    return [doc for text in rendered.values() for doc in yaml.safe_load_all(text) if doc]


def _by_kind(documents: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {doc["kind"]: doc for doc in documents}


def test_dockerfiles_lint_clean() -> None:
    for name in ("Dockerfile", "Dockerfile.gpu"):
        result = subprocess.run([str(_BIN / "hadolint"), str(ROOT / name)], capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr


def test_chart_lints_without_errors() -> None:
    assert helm.lint(str(CHART))["errors"] == []


@pytest.mark.parametrize("values_file", [None, "values-gpu-autoscaling.yaml"])
def test_every_rendered_manifest_validates_and_agrees_with_the_cli(values_file: str | None) -> None:
    documents = _render(values_file)
    for document in documents:
        _validate(document)
    kinds = _by_kind(documents)
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    if values_file:
        values = _merge(values, yaml.safe_load((CHART / values_file).read_text()))
    pod = kinds["Deployment"]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    serve.make_context("serve", list(container["args"]))  # every flag the chart passes exists
    flags = dict(arg.split("=", 1) for arg in container["args"] if "=" in arg)
    shutdown = values["shutdown"]
    assert float(flags["--shutdown-delay"]) == shutdown["delaySeconds"]
    assert float(flags["--shutdown-grace"]) == shutdown["graceSeconds"]
    assert pod["terminationGracePeriodSeconds"] > sum(
        shutdown[k] for k in ("delaySeconds", "graceSeconds", "preStopSleepSeconds")
    )
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    for probe in ("readinessProbe", "livenessProbe"):  # one slow answer from a busy pod is not fatal
        assert container[probe]["failureThreshold"] >= 3 and container[probe]["timeoutSeconds"] >= 2
    assert pod["automountServiceAccountToken"] is False
    ports = {p["name"]: p for p in kinds["Service"]["spec"]["ports"]}
    assert set(ports) == {"http", "grpc", "http-metrics"}
    assert ports["grpc"]["appProtocol"] == "kubernetes.io/h2c"
    if values_file:
        assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
        assert {m["type"] for m in kinds["HorizontalPodAutoscaler"]["spec"]["metrics"]} == {
            "Resource",
            "Pods",
        }
        assert "ServiceMonitor" in kinds and "PodDisruptionBudget" in kinds
        assert container["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "2"]


def test_kserve_manifests_validate_and_the_runtime_args_are_cli_flags() -> None:
    for path in sorted(KSERVE.glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            _validate(document)
    runtime = yaml.safe_load((KSERVE / "clusterservingruntime.yaml").read_text())
    args = runtime["spec"]["containers"][0]["args"]
    serve.make_context("serve", list(args))
    assert "--http-port=8080" in args and "--model-repository=/mnt/models" in args
    assert "--model-name={{.Name}}" in args  # served under the InferenceService's name
    flags = dict(arg.split("=", 1) for arg in args if "=" in arg)
    predictor = yaml.safe_load((KSERVE / "inferenceservice.yaml").read_text())["spec"]["predictor"]
    drain = float(flags["--shutdown-delay"]) + float(flags["--shutdown-grace"])
    assert predictor["terminationGracePeriodSeconds"] > drain
    assert predictor["automountServiceAccountToken"] is False


@pytest.mark.parametrize(
    "values",
    [
        {"replicaCont": 3},
        {"probes": {"readiness": {"failureTreshold": 3}}},
        {"server": {"logFormat": "xml"}},
        {"ports": {"http": 0}},
    ],
)
def test_the_chart_refuses_values_its_schema_does_not_know(values: dict[str, Any]) -> None:
    with helm.Chart.load(str(CHART)) as chart, pytest.raises(Exception, match="schema"):
        chart.render(values, name="demo", namespace="serving")


def test_the_images_install_pinned_dependencies_as_a_layer_with_the_otel_extra_and_stop_on_sigterm() -> None:
    for name in ("Dockerfile", "Dockerfile.gpu"):
        dockerfile = (ROOT / name).read_text()
        build = dockerfile.split("\nFROM ")[1]  # the build stage
        assert build.index("COPY constraints.txt") < build.index("COPY src"), name
        assert '--no-deps ".[otel]"' in dockerfile, name
        assert _instruction(dockerfile, "STOPSIGNAL") == "SIGTERM", name
        assert "docker stop -t 40" in dockerfile, name


def test_constraints_pin_every_package_the_image_installs() -> None:
    """scripts/constraints.py --check: rerun the script after adding a dependency."""
    spec = importlib.util.spec_from_file_location("constraints", ROOT / "scripts" / "constraints.py")
    assert spec is not None and spec.loader is not None
    constraints = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(constraints)
    assert constraints.check(constraints.closure()) == []


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _instruction(dockerfile: str, name: str) -> str:
    """The last ``name`` instruction of the final stage, continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", dockerfile)
    return [line for line in text.splitlines() if line.startswith(name + " ")][-1][len(name) + 1 :]


def _image_env(dockerfile: str) -> dict[str, str]:
    final = dockerfile.rsplit("\nFROM ", 1)[1]
    env: dict[str, str] = {}
    for line in re.sub(r"\\\n\s*", " ", final).splitlines():
        if line.startswith("ENV "):
            for pair in shlex.split(line[4:]):
                name, _, value = pair.partition("=")
                env[name] = value
    return env


@pytest.mark.e2e
def test_the_image_entry_command_serves_and_its_healthcheck_passes(tmp_path: Path) -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    entrypoint = json.loads(_instruction(dockerfile, "ENTRYPOINT"))
    healthcheck = json.loads(_instruction(dockerfile, "HEALTHCHECK").split(" CMD ", 1)[1])
    assert entrypoint == ["ortserve", "serve"]  # the console script the tests start as -m ortserve
    repository = tmp_path / "models"
    write_scaled_version(repository, "scaled", 1, 2.0)
    ports = {name: str(free_port()) for name in ("HTTP", "GRPC", "METRICS")}
    env = {
        **os.environ,
        **{k: v for k, v in _image_env(dockerfile).items() if k != "PATH"},
        "PATH": f"{_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "ORTSERVE_MODEL_REPOSITORY": str(repository),  # the volume, mounted elsewhere here
        "ORTSERVE_SHUTDOWN_DELAY": "0",
        **{f"ORTSERVE_{name}_PORT": port for name, port in ports.items()},
    }
    log = tmp_path / "server.log"
    with log.open("wb") as output:
        process = subprocess.Popen(entrypoint, env=env, stdout=output, stderr=subprocess.STDOUT)
    server = ServerProcess(
        process, "127.0.0.1", int(ports["HTTP"]), int(ports["GRPC"]), int(ports["METRICS"]), log
    )
    try:
        server.wait_ready(90)
        assert subprocess.run(healthcheck, env=env, timeout=30).returncode == 0
        assert ready_status(server) == 200
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0
    finally:
        server.stop()


def test_ci_runs_the_readmes_test_command() -> None:
    """CI must run exactly what the README tells a new developer to run (the extras included)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    commands = [line for line in readme.splitlines() if "pip install -c constraints.txt" in line]
    assert len(commands) == 1, "README.md shows one test command"
    assert commands[0] in ci.splitlines()
