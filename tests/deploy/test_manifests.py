"""The deployment files, checked offline: the Kubernetes manifests against the API's schemas
(kubernetes-validate, strict: an unknown or misspelt field fails), and every number or name they
share with the server against the server itself: probe paths are its routes, the probe port is
the one it binds, every VL_* variable is a setting whose value parses, VL_THREADS equals the CPU
limit, body limits equal VL_MAX_REQUEST_BYTES; compose.scale.yaml and the nginx template agree."""

from __future__ import annotations

import re

import kubernetes_validate
import pytest
import yaml
from flask import Flask

from conftest import ROOT
from vlservice.config import Settings

K8S = ROOT / "deploy" / "k8s"
K8S_VERSION = "1.37.0"  # the newest schemas kubernetes-validate ships
DEFAULTS = Settings()
PORT = int(DEFAULTS.bind.rsplit(":", 1)[1])


def nginx_size(text: str) -> int:
    """nginx's size syntax ("64m") in bytes."""
    m = re.fullmatch(r"(\d+)([kmg]?)", text.strip().lower())
    assert m, text
    return int(m.group(1)) * 1024 ** " kmg".index(m.group(2) or " ")


def docs() -> dict:
    """(kind, name) -> the resource, from every file the kustomization lists."""
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    found = {}
    for name in kustomization["resources"]:
        for doc in yaml.safe_load_all((K8S / name).read_text()):
            found[(doc["kind"], doc["metadata"]["name"])] = doc
    return found


def test_the_kustomization_lists_every_manifest():
    listed = yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"]
    assert sorted(listed) == sorted(p.name for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")


@pytest.mark.parametrize("key", sorted(docs()), ids=lambda k: f"{k[0]}/{k[1]}")
def test_manifests_pass_the_kubernetes_schemas(key):
    kubernetes_validate.validate(docs()[key], K8S_VERSION, strict=True)


def test_a_schema_violation_is_caught():
    bad = docs()[("Deployment", "vlservice")]
    bad = {**bad, "spec": {**bad["spec"], "replicas": "two"}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)


def container() -> dict:
    (c,) = docs()[("Deployment", "vlservice")]["spec"]["template"]["spec"]["containers"]
    return c


def test_probes_ask_the_servers_own_routes_on_its_port():
    from vlservice.http import ops

    app = Flask(__name__)
    app.register_blueprint(ops.bp)
    routes = {rule.rule for rule in app.url_map.iter_rules()}
    c = container()
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"http": PORT}
    probes = {name: c[name]["httpGet"] for name in ("startupProbe", "readinessProbe", "livenessProbe")}
    assert probes["readinessProbe"]["path"] == "/readyz"
    assert probes["livenessProbe"]["path"] == probes["startupProbe"]["path"] == "/healthz"
    for probe in probes.values():
        assert probe["path"] in routes and probe["port"] in ports


def test_environment_is_settings_that_parse_and_threads_match_the_cpu_limit():
    c = container()
    env = {e["name"]: e.get("value", "from-the-pod") for e in c["env"]}
    fields = {"VL_" + name.upper() for name in Settings.__dataclass_fields__}
    assert {n for n in env if n.startswith("VL_")} <= fields
    settings = Settings.from_env(env)  # every value parses and validates
    limits, requests = c["resources"]["limits"], c["resources"]["requests"]
    assert settings.threads == int(limits["cpu"]) == int(requests["cpu"])
    assert settings.workers == 1
    redis = docs()[("Service", "vlservice-redis")]["spec"]["ports"][0]["port"]
    assert settings.redis_url == f"redis://vlservice-redis:{redis}/0"
    grace = docs()[("Deployment", "vlservice")]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > settings.graceful_timeout + c["lifecycle"]["preStop"]["sleep"]["seconds"]


def test_memory_comes_from_the_measured_pod_and_the_caches_budgets():
    """The request covers the working set `memory --pod` measured for the float32 worker the
    deployment runs; the limit covers its anonymous peak plus the caches' full budgets."""
    import json

    c = container()
    settings = Settings.from_env({e["name"]: e.get("value", "") for e in c["env"] if "value" in e})
    assert settings.llm_quant in ("", None, "float32")
    pod = json.loads((ROOT / "docs" / "bench" / "pod-memory-float32.json").read_text())
    assert pod["llm"] == "float32" and pod["loaded"] and pod["answered"] == pod["asked"] and not pod["oom_kills"]
    assert pod["cpu"]["model"] and pod["date"] and "--pod" in pod["command"]
    working_set = max(p["working_set_mib"] for p in pod["phases"].values())
    anon = max(p["anon_mib"] for p in pod["phases"].values())
    request, limit = (nginx_size(c["resources"][k]["memory"].rstrip("i").lower()) >> 20 for k in ("requests", "limits"))
    assert request >= working_set
    assert limit >= anon + settings.feature_cache_mb + settings.kv_cache_mb


def test_pods_run_as_non_root_and_are_selected_by_service_pdb_and_hpa():
    d = docs()
    pod = d[("Deployment", "vlservice")]["spec"]["template"]
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert container()["securityContext"]["allowPrivilegeEscalation"] is False
    labels = pod["metadata"]["labels"]
    for key in (("Service", "vlservice"), ("PodDisruptionBudget", "vlservice")):
        spec = d[key]["spec"]
        selector = spec["selector"].get("matchLabels", spec["selector"])
        assert selector.items() <= labels.items(), key
    assert d[("Service", "vlservice")]["spec"]["ports"][0]["targetPort"] == "http"
    hpa = d[("HorizontalPodAutoscaler", "vlservice")]["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "vlservice"}
    assert hpa["minReplicas"] >= 2 and hpa["metrics"][0]["resource"]["name"] == "cpu"
    assert "vlservice_queue_depth" in (K8S / "hpa.yaml").read_text()  # the commented adapter example


def test_the_ingress_hashes_sessions_like_the_nginx_template():
    ann = docs()[("Ingress", "vlservice")]["metadata"]["annotations"]
    prefix = "nginx.ingress.kubernetes.io/"
    assert ann[prefix + "upstream-hash-by"] == "$http_x_session_id"
    assert nginx_size(ann[prefix + "proxy-body-size"]) == DEFAULTS.max_request_bytes
    assert ann[prefix + "proxy-buffering"] == "off"
    template = (ROOT / "deploy" / "nginx" / "templates" / "default.conf.template").read_text()
    assert re.search(r"^\s*hash \$http_x_session_id consistent;", template, re.M)
    assert re.search(r"^\s*least_conn;", template, re.M)
    assert re.search(r"^\s*proxy_buffering off;", template, re.M)
    size = re.search(r"^\s*client_max_body_size (\S+);", template, re.M).group(1)
    assert nginx_size(size) == DEFAULTS.max_request_bytes
    read = int(re.search(r"^\s*proxy_read_timeout (\d+)s;", template, re.M).group(1))
    assert read == int(ann[prefix + "proxy-read-timeout"]) > DEFAULTS.queue_timeout_s
    retry = re.search(r"^\s*proxy_next_upstream (.+);", template, re.M).group(1)
    assert retry == ann[prefix + "proxy-next-upstream"]


def test_nginx_and_the_ingress_buffer_requests_whole_before_a_replica_sees_them():
    ann = docs()[("Ingress", "vlservice")]["metadata"]["annotations"]
    prefix = "nginx.ingress.kubernetes.io/"
    assert ann[prefix + "proxy-request-buffering"] == "on"
    template = (ROOT / "deploy" / "nginx" / "templates" / "default.conf.template").read_text()
    assert re.search(r"^\s*proxy_request_buffering on;", template, re.M)
    assert nginx_size(re.search(r"^\s*client_body_buffer_size (\S+);", template, re.M).group(1)) \
        == nginx_size(ann[prefix + "client-body-buffer-size"])
    header = int(re.search(r"^\s*client_header_timeout (\d+)s;", template, re.M).group(1))
    body = int(re.search(r"^\s*client_body_timeout (\d+)s;", template, re.M).group(1))
    # a slow sender is cut off within half a minute of silence (Gunicorn itself would wait forever)
    assert header <= 30 and body <= 30


def test_compose_scale_runs_what_the_tests_start():
    compose = yaml.safe_load((ROOT / "compose.scale.yaml").read_text())
    services = compose["services"]
    replicas = {n: s for n, s in services.items() if "VL_REDIS_URL" in s.get("environment", {})}
    assert len(replicas) == 2
    fields = {"VL_" + name.upper() for name in Settings.__dataclass_fields__}
    names = set()
    for s in replicas.values():
        env = s["environment"]
        assert {n for n in env if n.startswith("VL_")} <= fields
        assert env["VL_REDIS_URL"] == "redis://redis:6379/0" and env["VL_DISK_CACHE_MB"] == "0"
        names.add(env["VL_REPLICA_NAME"])
    assert len(names) == 2
    nginx = services["nginx"]
    assert "./deploy/nginx/templates:/etc/nginx/templates:ro" in nginx["volumes"]
    template = (ROOT / "deploy" / "nginx" / "templates" / "default.conf.template").read_text()
    assert set(nginx["environment"]) == set(re.findall(r"\$\{(\w+)\}", template))
    assert sorted(nginx["environment"][k] for k in ("VL_REPLICA_1", "VL_REPLICA_2")) == \
        sorted(f"{n}:{PORT}" for n in replicas)
    assert services["redis"]["command"][:5] == ["redis-server", "--maxmemory", "2gb", "--maxmemory-policy",
                                                "allkeys-lru"]
