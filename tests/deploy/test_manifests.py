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
EDGE = ROOT / "deploy" / "nginx" / "edge"  # the limits every nginx we ship includes
TEMPLATE = ROOT / "deploy" / "nginx" / "templates" / "default.conf.template"
FRONT = ROOT / "deploy" / "front" / "nginx.conf"  # the image's own nginx


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
    size = re.search(r"^\s*client_max_body_size (\S+);", (EDGE / "server.conf").read_text(), re.M).group(1)
    assert nginx_size(size) == DEFAULTS.max_request_bytes
    read = int(re.search(r"^\s*proxy_read_timeout (\d+)s;", template, re.M).group(1))
    assert read == int(ann[prefix + "proxy-read-timeout"]) > DEFAULTS.queue_timeout_s
    retry = re.search(r"^\s*proxy_next_upstream (.+);", template, re.M).group(1)
    assert retry == ann[prefix + "proxy-next-upstream"]


def test_nginx_and_the_ingress_buffer_requests_whole_before_a_replica_sees_them():
    ann = docs()[("Ingress", "vlservice")]["metadata"]["annotations"]
    prefix = "nginx.ingress.kubernetes.io/"
    assert ann[prefix + "proxy-request-buffering"] == "on"
    edge = (EDGE / "server.conf").read_text()  # included by the balancer's template and the image's front
    assert re.search(r"^\s*proxy_request_buffering on;", edge, re.M)
    assert nginx_size(re.search(r"^\s*client_body_buffer_size (\S+);", edge, re.M).group(1)) \
        == nginx_size(ann[prefix + "client-body-buffer-size"])
    header = int(re.search(r"^\s*client_header_timeout (\d+)s;", edge, re.M).group(1))
    body = int(re.search(r"^\s*client_body_timeout (\d+)s;", edge, re.M).group(1))
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


def secret_ref(env: list, name: str) -> tuple[str, str]:
    """(Secret, key) an env entry of a container takes its value from."""
    (entry,) = [e for e in env if e["name"] == name]
    ref = entry["valueFrom"]["secretKeyRef"]
    assert "value" not in entry and ref.get("optional") is not True, name
    return ref["name"], ref["key"]


def test_redis_requires_the_password_the_replicas_are_given_on_kubernetes():
    d = docs()
    (redis,) = d[("Deployment", "vlservice-redis")]["spec"]["template"]["spec"]["containers"]
    args = redis["args"]
    var = re.fullmatch(r"\$\((\w+)\)", args[args.index("--requirepass") + 1]).group(1)  # expanded by the kubelet
    secret = secret_ref(redis["env"], var)
    assert secret_ref(container()["env"], "VL_REDIS_PASSWORD") == secret
    env = {e["name"]: e.get("value", "") for e in container()["env"]}
    assert "@" not in env["VL_REDIS_URL"]  # the password is never written in a manifest
    # the Secret is generated from a file that is not in git (nor in the image's build context)
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    (gen,) = [g for g in kustomization["secretGenerator"] if g["name"] == secret[0]]
    (source,) = gen["envs"]
    assert f"/deploy/k8s/{source}" in (ROOT / ".gitignore").read_text().splitlines()
    assert f"deploy/k8s/{source}" in (ROOT / ".dockerignore").read_text().splitlines()
    assert f"{secret[1]}=" in (K8S / "kustomization.yaml").read_text()  # the comment says how to write it


def test_redis_requires_the_password_the_replicas_are_given_in_compose():
    services = yaml.safe_load((ROOT / "compose.scale.yaml").read_text())["services"]
    command = services["redis"]["command"]
    required = re.compile(r"\$\{VL_REDIS_PASSWORD:\?[^}]+\}")  # compose refuses to start without it
    assert required.fullmatch(command[command.index("--requirepass") + 1])
    replicas = [s for s in services.values() if "VL_REDIS_URL" in s.get("environment", {})]
    for s in replicas:
        env = s["environment"]
        assert required.fullmatch(env["VL_REDIS_PASSWORD"]) and "@" not in env["VL_REDIS_URL"]
    assert "ports" not in services["redis"]  # reached only on the project's network
    assert ".env" in (ROOT / ".gitignore").read_text().splitlines()
    assert ".env" in (ROOT / ".dockerignore").read_text().splitlines()


def selects(selector: dict, labels: dict) -> bool:
    assert set(selector) <= {"matchLabels"}, selector  # matchExpressions: not read here
    return selector.get("matchLabels", {}).items() <= labels.items()


def test_network_policies_let_only_the_replicas_reach_redis_and_the_ingress_reach_the_replicas():
    d = docs()
    pods = {name: d[("Deployment", name)]["spec"]["template"] for name in ("vlservice", "vlservice-redis")}
    labels = {name: pod["metadata"]["labels"] for name, pod in pods.items()}
    policies = {k[1]: doc["spec"] for k, doc in d.items() if k[0] == "NetworkPolicy"}
    for name in pods:  # every pod is covered by exactly one policy, which restricts ingress
        (policy,) = [p for p in policies.values() if selects(p["podSelector"], labels[name])]
        assert "Ingress" in policy["policyTypes"], name

    redis = next(p for p in policies.values() if selects(p["podSelector"], labels["vlservice-redis"]))
    (rule,) = redis["ingress"]
    (peer,) = rule["from"]
    assert set(peer) == {"podSelector"}  # pods of this namespace only, and only these:
    assert selects(peer["podSelector"], labels["vlservice"])
    assert not selects(peer["podSelector"], labels["vlservice-redis"])
    (port,) = rule["ports"]
    (redis_container,) = pods["vlservice-redis"]["spec"]["containers"]
    assert port["protocol"] == "TCP"
    assert port["port"] in (6379, "redis") and redis_container["ports"][0]["containerPort"] == 6379
    assert d[("Service", "vlservice-redis")]["spec"]["ports"][0]["port"] == 6379

    replicas = next(p for p in policies.values() if selects(p["podSelector"], labels["vlservice"]))
    (rule,) = replicas["ingress"]
    assert [p["port"] for p in rule["ports"]] == ["http"]  # the one port the pod serves on
    assert "http" in {p["name"] for p in container()["ports"]}
    assert d[("Service", "vlservice")]["spec"]["ports"][0]["targetPort"] == "http"
    (peer,) = rule["from"]
    assert set(peer) == {"namespaceSelector"}  # the ingress controller's namespace
    assert peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]


@pytest.mark.skipif(not __import__("shutil").which("kubectl"), reason="kubectl (its kustomize) is not installed")
def test_kustomize_builds_with_a_password_file_and_refuses_without(tmp_path):
    import shutil
    import subprocess

    k8s = tmp_path / "k8s"
    shutil.copytree(K8S, k8s, ignore=shutil.ignore_patterns("redis.env"))
    missing = subprocess.run(["kubectl", "kustomize", str(k8s)], capture_output=True, text=True)
    assert missing.returncode != 0 and "redis.env" in missing.stderr
    (k8s / "redis.env").write_text("password=from-the-file\n")
    built = subprocess.run(["kubectl", "kustomize", str(k8s)], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    out = {(doc["kind"], doc["metadata"]["name"]): doc for doc in yaml.safe_load_all(built.stdout)}
    (secret,) = [k[1] for k in out if k[0] == "Secret"]
    assert secret.startswith("vlservice-redis-")  # its name hashes the content: a new password rolls the pods
    for name in ("vlservice", "vlservice-redis"):
        (c,) = out[("Deployment", name)]["spec"]["template"]["spec"]["containers"]
        refs = [e["valueFrom"]["secretKeyRef"]["name"] for e in c["env"] if "valueFrom" in e
                and "secretKeyRef" in e["valueFrom"]]
        assert refs == [secret], name


def directives(text: str) -> dict[str, str]:
    """`name args;` lines of an nginx file (comments dropped), by name (the last one wins)."""
    found = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        m = re.fullmatch(r"([a-z_]+)\s+(.*);", line)
        if m:
            found[m.group(1)] = m.group(2)
    return found


def test_every_nginx_we_ship_includes_the_one_edge():
    """The balancer's template and the image's front include the same two files (zones at http
    level, everything else in their server) and set none of the edge's directives themselves, so
    the edge cannot drift between them; their proxying agrees where both proxy."""
    edge_text = (EDGE / "server.conf").read_text()
    edge = directives(edge_text[:edge_text.index("\nerror_page")])  # the limits, not the error pages
    for path in (TEMPLATE, FRONT):
        text = path.read_text()
        server = text[text.index("server {"):]
        assert "include ${VL_EDGE_DIR}/zones.conf;" in text[:text.index("server {")], path
        assert "include ${VL_EDGE_DIR}/server.conf;" in server, path
        own = directives(re.sub(r"upstream \S+ \{.*?\n\s*\}", "", text, flags=re.S))  # upstream keepalive_* differ
        overlap = set(own) & set(edge) - {"client_max_body_size"}
        assert not overlap, f"{path.name} sets edge directives itself: {sorted(overlap)}"
    front = directives(FRONT.read_text())
    assert front["client_max_body_size"] == "${FRONT_MAX_BODY}"  # VL_MAX_REQUEST_BYTES, rendered
    assert "user" not in front and front["listen"] == "${FRONT_LISTEN}"
    template = directives(TEMPLATE.read_text())
    for name in ("proxy_buffering", "proxy_read_timeout", "proxy_send_timeout", "proxy_connect_timeout"):
        assert front[name] == template[name], name


def test_the_edge_holds_every_limit_and_the_ingress_the_same_numbers():
    edge = directives((EDGE / "server.conf").read_text())
    zones = (EDGE / "zones.conf").read_text()
    for name in ("client_header_timeout", "client_body_timeout", "send_timeout", "keepalive_timeout",
                 "keepalive_requests", "large_client_header_buffers", "client_body_buffer_size",
                 "limit_conn", "limit_req", "reset_timedout_connection", "lingering_time"):
        assert name in edge, name
    assert edge["proxy_request_buffering"] == "on" and edge["reset_timedout_connection"] == "on"
    assert nginx_size(edge["client_max_body_size"]) == DEFAULTS.max_request_bytes
    assert edge["limit_conn_status"] == edge["limit_req_status"] == "429"
    count, size = edge["large_client_header_buffers"].split()
    assert int(count) * nginx_size(size) <= 64 * 1024  # small: a head is at most this much memory
    header, body = (int(edge[n].rstrip("s")) for n in ("client_header_timeout", "client_body_timeout"))
    assert header <= 30 and body <= 30
    ann = docs()[("Ingress", "vlservice")]["metadata"]["annotations"]
    prefix = "nginx.ingress.kubernetes.io/"
    conns = int(re.fullmatch(r"vl_conn (\d+)", edge["limit_conn"]).group(1))
    burst = int(re.fullmatch(r"zone=vl_req burst=(\d+) nodelay", edge["limit_req"]).group(1))
    rate = int(re.search(r"zone=vl_req:\S+ rate=(\d+)r/s;", zones).group(1))
    assert int(ann[prefix + "limit-connections"]) == conns
    assert int(ann[prefix + "limit-rps"]) == rate
    assert int(ann[prefix + "limit-rps"]) * int(ann[prefix + "limit-burst-multiplier"]) == burst


def test_the_edge_refuses_in_openai_json():
    """Every status the edge maps has an internal page that answers that status (494: nginx's
    header-too-large, as 431) with OpenAI's error object; so does the front's Gunicorn-down page."""
    import json

    text = (EDGE / "server.conf").read_text()
    pages = re.findall(r"^error_page (\d+) (?:=(\d+) )?(\S+);", text, re.M)
    assert {int(code) for code, _, _ in pages} >= {400, 408, 413, 414, 429, 494, 500}
    for code, shown, uri in pages:
        block = re.search(rf"location = {re.escape(uri)} \{{(.*?)\n\}}", text, re.S)
        assert block, uri
        assert "internal;" in block.group(1) and "default_type application/json;" in block.group(1)
        status, body = re.search(r"return (\d+) '(.*)';", block.group(1)).groups()
        assert int(status) == int(shown or code), uri
        error = json.loads(body.replace("\\n", ""))["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["code"], uri
    assert "add_header Retry-After" in re.search(r"location = /\.vl-edge/429 \{(.*?)\n\}", text, re.S).group(1)
    front = FRONT.read_text()
    down = re.search(r"location @vl_unavailable \{(.*?)\n        \}", front, re.S).group(1)
    assert json.loads(re.search(r"return 503 '(.*)';", down).group(1).replace("\\n", ""))["error"]["code"]


def test_the_replicas_fronts_count_clients_behind_the_balancer_and_the_ingress():
    compose = yaml.safe_load((ROOT / "compose.scale.yaml").read_text())
    services = compose["services"]
    nginx = services["nginx"]
    mount = next(v for v in nginx["volumes"] if v.startswith("./deploy/nginx/edge:"))
    assert mount.split(":")[1] == nginx["environment"]["VL_EDGE_DIR"]
    for name, s in services.items():
        if "VL_REDIS_URL" in s.get("environment", {}):
            assert s["environment"]["FRONT_REAL_IP_FROM"], name
            assert s["stop_grace_period"] == compose["services"][name]["stop_grace_period"]
    env = {e["name"]: e.get("value") for e in container()["env"]}
    assert env["FRONT_REAL_IP_FROM"]


@pytest.mark.skipif(not __import__("shutil").which("nginx"), reason="Debian's nginx is not installed")
def test_the_rendered_configs_pass_nginx_t(tmp_path):
    """`nginx -t` on the image's front as its launcher renders it, and on the balancer's template
    inside an nginx.conf like the nginx image's own (it sets keepalive_timeout at http level)."""
    import importlib.util
    import subprocess

    from vlservice.tools.services import render_nginx

    spec = importlib.util.spec_from_file_location("launch", ROOT / "deploy" / "front" / "launch.py")
    launch = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(launch)
    front = tmp_path / "front"
    front.mkdir()
    (front / "nginx.conf").write_text(launch.nginx_config(front, "127.0.0.1:1", DEFAULTS, "10.0.0.0/8"))
    balancer = tmp_path / "balancer"
    balancer.mkdir()
    (balancer / "default.conf").write_text(render_nginx({"VL_LISTEN": "127.0.0.1:1", "VL_REPLICA_1": "127.0.0.1:8001",
                                                         "VL_REPLICA_2": "127.0.0.1:8002", "VL_EDGE_DIR": str(EDGE)}))
    (balancer / "nginx.conf").write_text(f"""
pid {balancer}/nginx.pid;
events {{ worker_connections 1024; }}
http {{
    include /etc/nginx/mime.types;
    default_type application/octet-stream;
    sendfile on;
    keepalive_timeout 65;
    client_body_temp_path {balancer}/body;
    proxy_temp_path {balancer}/proxy;
    include {balancer}/default.conf;
}}
""")
    for folder in (front, balancer):
        check = subprocess.run(["nginx", "-p", str(folder), "-e", "stderr", "-c", str(folder / "nginx.conf"), "-t"],
                               capture_output=True, text=True)
        assert check.returncode == 0, check.stderr


def test_every_deployment_starts_on_the_allocator_the_image_installs():
    """Issue 45: glibc's malloc keeps what a long-running worker frees, so the image installs
    jemalloc and names it (VL_ALLOCATOR: gunicorn.conf.py re-executes the master with it preloaded
    and fails to start when it is missing), and compose and Kubernetes say the same."""
    from vlservice import allocator

    docker = (ROOT / "Dockerfile").read_text()
    (chosen,) = re.findall(r"^\s*VL_ALLOCATOR=(\S+?)\s*\\?$", docker, re.M)
    assert chosen == "jemalloc" and allocator.wanted(chosen) == "jemalloc"
    assert re.search(r"apt-get install -y --no-install-recommends [^\n]*\blibjemalloc2\b", docker)
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]["vlservice"]["environment"]
    assert compose["VL_ALLOCATOR"] == "${VL_ALLOCATOR:-jemalloc}"
    scale = yaml.safe_load((ROOT / "compose.scale.yaml").read_text())["services"]
    replicas = [s for s in scale.values() if "VL_REDIS_URL" in s.get("environment", {})]
    assert [s["environment"]["VL_ALLOCATOR"] for s in replicas] == ["${VL_ALLOCATOR:-jemalloc}"] * 2
    env = {e["name"]: e.get("value") for e in container()["env"]}
    assert env["VL_ALLOCATOR"] == chosen
    assert Settings.from_env({"VL_ALLOCATOR": chosen}).allocator == chosen
