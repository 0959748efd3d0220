"""docker-compose.yml and compose/: well-formed, and every command is a real ``offramp`` one.

No Docker engine is needed: the files are parsed and each service's command is run
through the CLI's own argparse parser, so renaming or removing a subcommand in
services/cli/main.py breaks this test instead of a cluster start.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

from services.cli.main import build_parser
from services.common import config as config_mod
from services.common.readiness import READY_FILE_ENV
from services.zoo.registry import ZOO

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "compose" / "Dockerfile"
ENV_FILE = ROOT / "compose" / "offramp.env"
NATS_CONF = ROOT / "compose" / "nats-server.conf"

REQUIRED = {"nats", "postgres", "migrate", "router", "monitor", "worker"}
OFFRAMP_SERVICES = {"credentials", "migrate", "router", "monitor", "worker"}


class NotAnOfframpCommand(AssertionError):
    pass


def parse_offramp(command) -> object:
    """Parse a compose ``command`` (string or list) as ``offramp`` argv; raise if it is not one."""
    argv = shlex.split(command) if isinstance(command, str) else [str(a) for a in command]
    if argv and argv[0] == "offramp":  # entrypoint written out in full
        argv = argv[1:]
    try:
        return build_parser().parse_args(argv)
    except SystemExit as exc:
        raise NotAnOfframpCommand(f"not an offramp command: {argv!r} (exit {exc.code})") from None


@pytest.fixture(scope="module")
def compose() -> dict:
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module")
def services(compose) -> dict:
    return compose["services"]


def read_env_file() -> dict[str, str]:
    env = {}
    for line in ENV_FILE.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        assert sep, f"bad env line {line!r}"
        env[key.strip()] = value.strip()
    return env


def test_compose_parses_and_has_required_services(services):
    assert REQUIRED <= set(services)


def test_parser_rejects_bogus_commands():
    # The checks below are only worth something if a wrong command fails them.
    for bogus in (["serve", "planner"], ["frobnicate"], "offramp serve-worker",
                  ["db", "migrate"], ["offramp"], []):
        with pytest.raises(NotAnOfframpCommand):
            parse_offramp(bogus)


@pytest.mark.parametrize("name", sorted(OFFRAMP_SERVICES))
def test_offramp_service_command_is_a_real_subcommand(services, name):
    svc = services[name]
    assert "command" in svc, f"{name} has no command"
    args = parse_offramp(svc["command"])
    assert callable(args.fn)


def test_commands_do_what_each_service_is_for(services):
    assert parse_offramp(services["migrate"]["command"]).command == "db"
    assert parse_offramp(services["migrate"]["command"]).action == "upgrade"
    for name in ("router", "monitor", "worker", "optimizer"):
        args = parse_offramp(services[name]["command"])
        assert (args.command, args.service) == ("serve", name)
    # the scalable workers are a pool: their stages come from the optimizer's plans
    worker = parse_offramp(services["worker"]["command"])
    assert worker.pool and worker.model is None
    served = read_env_file()["OFFRAMP_MODELS"].split(",")
    assert served and all(m in ZOO for m in served)


@pytest.mark.parametrize("name", sorted(OFFRAMP_SERVICES))
def test_offramp_services_share_image_and_env(services, name):
    svc = services[name]
    assert svc["build"] == {"context": ".", "dockerfile": "compose/Dockerfile"}
    env_file = svc["env_file"]
    env_files = [env_file] if isinstance(env_file, str) else env_file
    assert "compose/offramp.env" in env_files
    assert (ROOT / svc["build"]["dockerfile"]).is_file()


@pytest.mark.parametrize("name", ["router", "monitor", "worker"])
def test_long_running_services_wait_for_nats_and_migrations(services, name):
    svc = services[name]
    assert svc["restart"] == "unless-stopped"
    deps = svc["depends_on"]
    assert deps["nats"]["condition"] == "service_started"
    assert deps["migrate"]["condition"] == "service_completed_successfully"


@pytest.mark.parametrize("name", ["router", "monitor", "profiler", "tuner", "optimizer",
                                  "helios", "worker"])
def test_long_running_services_are_healthy_once_ready(services, name):
    """`docker compose ps` says healthy when the service wrote its ready file, on a tmpfs
    that each container start empties."""
    svc = services[name]
    path = svc["environment"][READY_FILE_ENV]
    assert path.startswith(tuple(svc["tmpfs"]))
    assert path in " ".join(svc["healthcheck"]["test"])


def test_migrate_waits_for_healthy_postgres(services):
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert "pg_isready" in str(services["postgres"]["healthcheck"]["test"])


def test_worker_is_scalable(services):
    worker = services["worker"]
    assert "container_name" not in worker
    assert "ports" not in worker


def test_nats_publishes_client_port_and_mounts_conf(services):
    nats = services["nats"]
    assert any(str(p).split(":")[-2:] == ["4222", "4222"] for p in nats["ports"])
    assert any("nats-server.conf" in str(v) for v in nats["volumes"])
    assert "/etc/nats/nats-server.conf" in " ".join(map(str, nats["command"]))


def test_the_bus_admits_only_generated_role_logins(services):
    """NATS starts after the credentials one-shot wrote every role's login and the
    authorization block its config includes; services read their login from that volume."""
    creds = parse_offramp(services["credentials"]["command"])
    assert creds.command == "credentials" and creds.server_config == "/credentials/auth.conf"
    nats = services["nats"]
    assert nats["depends_on"]["credentials"]["condition"] == "service_completed_successfully"
    assert "nats-credentials:/etc/nats/auth:ro" in nats["volumes"]
    assert 'include "auth/auth.conf"' in NATS_CONF.read_text()
    assert read_env_file()["OFFRAMP_NATS_CREDENTIALS"] == "/credentials/credentials.json"
    for name in ("router", "monitor", "worker", "tuner", "profiler"):
        assert "nats-credentials:/credentials:ro" in services[name]["volumes"], name
    # published on loopback unless the operator says otherwise
    assert all(str(p).startswith(("127.0.0.1:", "${OFFRAMP_BIND:-127.0.0.1}:"))
               for p in nats["ports"]), nats["ports"]


def test_env_file_names_known_variables():
    env = read_env_file()
    assert env["OFFRAMP_NATS_URL"] == "nats://nats:4222"
    assert env["OFFRAMP_DATABASE_URL"].startswith("postgresql+psycopg://")
    assert "@postgres:5432/" in env["OFFRAMP_DATABASE_URL"]
    documented = {name for name, _, _ in config_mod.DOCUMENTED}
    assert set(env) <= documented, f"unknown variables: {set(env) - documented}"
    for model in env["OFFRAMP_MODELS"].split(","):
        assert model.strip() in ZOO


def test_nats_conf_has_jetstream_and_max_payload():
    text = NATS_CONF.read_text()
    assert re.search(r"^\s*jetstream\s*[{:]", text, re.MULTILINE)
    assert re.search(r"store_dir\s*:\s*/data", text)
    assert re.search(r"^\s*max_payload\s*:\s*8MB\s*$", text, re.MULTILINE)
    assert re.search(r"^\s*http_port\s*:\s*8222\s*$", text, re.MULTILINE)


def test_dockerfile_entrypoint_and_prepare_commands():
    text = DOCKERFILE.read_text()
    assert re.search(r'^ENTRYPOINT \["offramp"\]', text, re.MULTILINE)
    assert "pip install torch==2.13.0" in text
    assert text.index("torch==2.13.0") < text.index("pip install -e .")
    prepares = re.findall(r"offramp (prepare [\w-]+)", text)
    assert {p.split()[1] for p in prepares} >= {"tiny", "efficientnet-lite0"}
    for p in prepares:
        assert parse_offramp(p).model in ZOO


# ------------------------------------------------------------------ metrics: Prometheus, Grafana

PROMETHEUS_CONF = ROOT / "compose" / "prometheus.yml"
GRAFANA = ROOT / "compose" / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "offramp.json"


def served(services) -> dict[str, str]:
    """Compose services that run ``offramp serve X`` (they serve /metrics): name -> X."""
    out = {}
    for name, svc in services.items():
        if "command" in svc and svc.get("build"):
            args = parse_offramp(svc["command"])
            if args.command == "serve":
                out[name] = args.service
    return out


def mounts(svc) -> dict[str, str]:
    """A service's bind mounts: container path -> host path (relative to the repository)."""
    out = {}
    for v in svc.get("volumes", []):
        host, target = str(v).split(":")[:2]
        if host.startswith("./"):
            out[target] = host[2:]
    return out


def test_every_served_offramp_service_is_scraped(services):
    port = int(read_env_file()["OFFRAMP_METRICS_PORT"])
    assert read_env_file()["OFFRAMP_METRICS_BIND"] == "0.0.0.0"  # reachable from prometheus
    conf = yaml.safe_load(PROMETHEUS_CONF.read_text())
    static, dns = set(), []
    for job in conf["scrape_configs"]:
        for sc in job.get("static_configs", []):
            static |= set(sc["targets"])
        dns += job.get("dns_sd_configs", [])
    kinds = served(services)
    assert set(kinds.values()) == {"router", "monitor", "profiler", "tuner", "optimizer", "helios",
                                  "worker"}
    scaled = {name for name, kind in kinds.items() if kind == "worker"}
    # one container each: by name; workers (--scale) by every address Docker's DNS returns
    assert static == {f"{name}:{port}" for name in kinds if name not in scaled}
    assert [(d["names"], d["type"], d["port"]) for d in dns] == [(sorted(scaled), "A", port)]


def test_prometheus_and_grafana_are_wired_and_local(services):
    prom, graf = services["prometheus"], services["grafana"]
    for svc in (prom, graf):
        assert all(str(p).startswith("127.0.0.1:") for p in svc["ports"]), svc["ports"]
    assert mounts(prom)["/etc/prometheus/prometheus.yml"] == "compose/prometheus.yml"
    assert "--config.file=/etc/prometheus/prometheus.yml" in prom["command"]
    graf_mounts = mounts(graf)
    assert graf_mounts["/etc/grafana/provisioning"] == "compose/grafana/provisioning"
    source = yaml.safe_load((GRAFANA / "provisioning/datasources/prometheus.yml").read_text())
    [ds] = source["datasources"]
    assert ds["url"] == "http://prometheus:9090" and ds["type"] == "prometheus"
    provider = yaml.safe_load((GRAFANA / "provisioning/dashboards/offramp.yml").read_text())
    path = provider["providers"][0]["options"]["path"]
    assert (ROOT / graf_mounts[path] / "offramp.json").is_file()
    dash = json.loads(DASHBOARD.read_text())
    assert {p["datasource"]["uid"] for p in dash["panels"]} == {ds["uid"]}


def test_dashboard_queries_name_only_defined_metrics():
    from services.common import metrics

    families = {m.describe()[0].name: m.describe()[0].type for m in vars(metrics).values()
                if hasattr(m, "describe") and not isinstance(m, type)}
    allowed = set()
    for name, kind in families.items():
        allowed |= {name, f"{name}_total"} if kind == "counter" else {name}
        if kind == "histogram":
            allowed |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    used = {n for e in exprs for n in re.findall(r"\bofframp_\w+", e)}
    assert used and used <= allowed, used - allowed
    titles = " ".join(p["title"].lower() for p in dash["panels"])
    for topic in ("latency", "exit", "agreement", "config"):
        assert topic in titles
