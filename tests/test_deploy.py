"""The docker-compose deployment of cdn-3dc agrees with the topology and with the CLI it runs.

Docker cannot run here, so the containers never start in these tests: the compose file is read
as YAML and checked against ``topologies/cdn-3dc.yaml``, the planner and ``jetstream``'s own
argument parser, and validated with ``docker-compose config`` when that is installed.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from jetstream.aggtree.loader import load_topology
from jetstream.aggtree.planner import plan_query
from jetstream.aggtree.topology import Topology
from jetstream.cli import parser
from jetstream.queryfile import load_query
from jetstream.units import parse_bandwidth

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
COMPOSE_FILE = DEPLOY / "docker-compose.yml"
TOPOLOGY_FILE = ROOT / "topologies" / "cdn-3dc.yaml"
#: The query the deployment is there to run: its plan decides each site's parent.
QUERY_FILE = ROOT / "examples" / "cdn_topk.py"
#: Where the site containers find their logs, one folder per site.
LOGS = "/data/logs"

COMPOSE: dict[str, Any] = yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8"))
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
#: The services that run the JetStream image, whose command is a ``jetstream`` command line.
JETSTREAM = sorted(name for name, s in SERVICES.items() if "build" in s)


def argv(service: str) -> list[str]:
    """The arguments ``jetstream`` gets in ``service`` (the image's entrypoint is jetstream)."""
    command = SERVICES[service].get("command", [])
    return shlex.split(command) if isinstance(command, str) else [str(a) for a in command]


def parse(service: str) -> argparse.Namespace:
    """``service``'s command line as the CLI reads it; a refused one fails the test, saying why."""
    line = shlex.join(["jetstream", *argv(service)])
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            return parser().parse_args(argv(service))
    except SystemExit:
        pytest.fail(f"service {service} runs `{line}`, which the CLI refuses:\n"
                    f"{errors.getvalue().strip()}")


def flag(service: str, name: str) -> str | None:
    """The value ``service``'s command line gives the option ``name``, None without it."""
    args = argv(service)
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(f"{name}="):
            return arg.partition("=")[2]
    return None


def running(command: str) -> list[str]:
    """The services whose command is ``jetstream COMMAND``."""
    return [s for s in JETSTREAM if argv(s)[:1] == [command]]


def environment(service: str) -> dict[str, str]:
    env = SERVICES[service].get("environment") or {}
    if isinstance(env, list):  # the KEY=VALUE form
        env = dict(item.partition("=")[::2] for item in env)
    return {key: "" if value is None else str(value) for key, value in env.items()}


@pytest.fixture(scope="module")
def topology() -> Topology:
    return load_topology(TOPOLOGY_FILE)


def test_one_site_service_per_topology_site(topology: Topology) -> None:
    names = sorted(parse(s).name for s in running("site"))
    assert names == sorted(s.name for s in topology.sites), (
        "deploy/docker-compose.yml should run `jetstream site --name SITE` once for each site "
        f"of {TOPOLOGY_FILE.name}")


def test_the_controller_and_the_log_generator_use_the_same_topology() -> None:
    controllers = running("controller")
    assert len(controllers) == 1, f"expected one controller service, got {controllers}"
    # The image's working directory is the checkout, so the path means what it means here.
    assert (ROOT / parse(controllers[0]).topology).resolve() == TOPOLOGY_FILE
    # Read off the command line, not parsed: test_every_jetstream_command_exists_in_the_cli
    # is the one to say whether the CLI has gen-logs.
    for service in running("gen-logs"):
        topology = flag(service, "--topology")
        assert topology and (ROOT / topology).resolve() == TOPOLOGY_FILE, service


@pytest.mark.parametrize("service", JETSTREAM)
def test_every_jetstream_command_exists_in_the_cli(service: str) -> None:
    args = parse(service)
    assert args.command == argv(service)[0]


def test_uplinks_are_the_links_to_the_parents_the_planner_picks(topology: Topology) -> None:
    plan = plan_query(load_query(QUERY_FILE), topology)
    parents = {f.site: f.parent for f in plan.fragments.values()}
    for service in running("site"):
        site = parse(service).name
        uplink = environment(service).get("JETSTREAM_UPLINK", "")
        parent = parents.get(site)
        if parent is None:
            assert not uplink, f"{service}: {site} has no parent in the plan, so no uplink"
            continue
        expected = topology.link(site, parent).bandwidth_bps
        assert uplink, f"{service}: no JETSTREAM_UPLINK; its uplink is the link {site}-{parent}"
        assert parse_bandwidth(uplink, what=f"{service}: JETSTREAM_UPLINK") == expected, (
            f"{service}: JETSTREAM_UPLINK is {uplink}, the link {site}-{parent} {expected:g} bit/s")


def test_sites_shape_their_uplink_and_then_run_jetstream() -> None:
    for service in running("site"):
        spec = SERVICES[service]
        assert "NET_ADMIN" in spec.get("cap_add", []), f"{service}: tc needs NET_ADMIN"
        shell, flag, script, zeroth = spec["entrypoint"]
        assert (shell, flag, zeroth) == ("/bin/sh", "-c", "jetstream"), service
        # Compose reads $$ as a literal $, which the shell then expands.
        assert re.search(r'tc qdisc replace dev eth0 root tbf rate "\$\$JETSTREAM_UPLINK"', script)
        assert script.rstrip().endswith('exec jetstream "$$@"'), service
    dockerfile = (DEPLOY / "Dockerfile").read_text(encoding="utf-8")
    assert re.search(r'^ENTRYPOINT \["jetstream"\]$', dockerfile, re.MULTILINE)
    assert "iproute2" in dockerfile


def test_sites_are_reachable_and_read_what_the_generator_writes() -> None:
    controller = running("controller")[0]
    controller_address = f"{controller}:{parse(controller).port}"
    for service in running("site"):
        args = parse(service)
        assert args.controller == controller_address, service
        # A site registers as --host:--port and is dialled there, so it must be its own name.
        assert args.host == service and args.port > 0, service
        assert args.input == f"{LOGS}/{args.name}", service
        assert f"logs:{LOGS}:ro" in SERVICES[service]["volumes"], service
    generators = running("gen-logs")
    assert generators, "no service runs `jetstream gen-logs`: the sites would read nothing"
    for service in generators:
        assert flag(service, "--out") == LOGS, service
        assert f"logs:{LOGS}" in SERVICES[service]["volumes"], service
    assert "logs" in COMPOSE["volumes"]


def test_prometheus_scrapes_the_controller_and_every_site() -> None:
    prometheus = yaml.safe_load((DEPLOY / "prometheus.yml").read_text(encoding="utf-8"))
    targets = {target.rpartition(":")[0]
               for job in prometheus["scrape_configs"]
               for group in job.get("static_configs", [])
               for target in group["targets"]}
    wanted = {*running("controller"), *running("site")}
    assert wanted <= targets, f"not scraped: {sorted(wanted - targets)}"
    for job in prometheus["scrape_configs"]:  # at the port each serves its metrics on
        for group in job.get("static_configs", []):
            for target in group["targets"]:
                service, _, port = target.rpartition(":")
                assert flag(service, "--metrics-port") == port, f"{target}: no metrics there"
    assert targets <= set(SERVICES), f"not services: {sorted(targets - set(SERVICES))}"
    mount = "./prometheus.yml:/etc/prometheus/prometheus.yml:ro"
    assert mount in SERVICES["prometheus"]["volumes"]
    # Every scrape carries the token, read from the volume the certs service fills.
    (certs,) = running("certs")
    token = f"{parse(certs).out_dir}/token"
    assert all(job["authorization"] == {"credentials_file": token}
               for job in prometheus["scrape_configs"])
    assert any(v.startswith(f"tls:{parse(certs).out_dir}") for v in
               SERVICES["prometheus"]["volumes"])


def compose_command() -> list[str] | None:
    """``docker-compose``, else ``docker compose`` if that plugin is there, else None."""
    if found := shutil.which("docker-compose"):
        return [found]
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True,
                                 check=False).returncode == 0:
        return [docker, "compose"]
    return None


def test_docker_compose_accepts_the_file() -> None:
    command = compose_command()
    if command is None:
        pytest.skip("neither docker-compose nor `docker compose` is installed "
                    "(apt-get install docker-compose)")
    done = subprocess.run([*command, "-f", str(COMPOSE_FILE), "config", "-q"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr


def test_every_process_runs_on_the_certificates_the_certs_service_makes() -> None:
    (certs,) = running("certs")
    made = parse(certs)
    assert made.keep and f"tls:{made.out_dir}" in SERVICES[certs]["volumes"]
    named = set(made.hosts.split(","))
    # A certificate per site, naming it, and one for the controller.
    assert set(made.sites.split(",")) == {parse(s).name for s in running("site")}
    for service in [*running("controller"), *running("site")]:
        args = parse(service)
        holder = args.name if service in running("site") else "controller"
        assert args.tls_dir == f"{made.out_dir}/{holder}" and not args.insecure, service
        assert args.http_token, f"{service}: /metrics without the token"
        assert f"tls:{made.out_dir}:ro" in SERVICES[service]["volumes"], service
        assert service in named, f"{service} is dialled by a name its certificate lacks"
        needs = SERVICES[service]["depends_on"]
        assert needs[certs] == {"condition": "service_completed_successfully"}, service
    assert "tls" in COMPOSE["volumes"]


def test_certs_keep_leaves_a_ca_as_it_is(tmp_path: Path) -> None:
    from jetstream.cli import main

    assert main(["certs", str(tmp_path / "tls")]) == 0
    before = (tmp_path / "tls" / "ca.pem").read_bytes()
    assert main(["certs", str(tmp_path / "tls"), "--keep"]) == 0
    assert (tmp_path / "tls" / "ca.pem").read_bytes() == before
