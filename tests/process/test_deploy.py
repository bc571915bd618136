"""deploy/: the container image, compose, Kubernetes and systemd files say only what the node
has, and what the image runs works as processes here (this machine cannot build images)."""

from __future__ import annotations

import configparser
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tomllib
import urllib.request
from pathlib import Path

import pytest
import yaml

from sluicegate.node.cli import parse_args
from sluicegate.node.config import parse_config
from sluicegate.node.settings import apply, given
from tests.dns_server import DnsServer, loopback_port
from tests.nodes import free_port, is_ready, wait_healthy, wait_until

pytestmark = pytest.mark.process

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"


def dockerfile() -> list[tuple[str, str]]:
    """(instruction, arguments) of deploy/Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", (DEPLOY / "Dockerfile").read_text())
    lines = [line.strip() for line in text.splitlines()]
    return [tuple(line.split(None, 1)) for line in lines if line and not line.startswith("#")]


def final_stage() -> list[tuple[str, str]]:
    instructions = dockerfile()
    last_from = max(i for i, (name, _) in enumerate(instructions) if name == "FROM")
    return instructions[last_from:]


def image_env() -> dict[str, str]:
    env = {}
    for name, args in final_stage():
        if name == "ENV":
            for pair in shlex.split(args):
                key, value = pair.split("=", 1)
                env[key] = value
    return env


def exec_form(name: str) -> list[str]:
    (args,) = [args for instruction, args in final_stage() if instruction == name]
    if name == "HEALTHCHECK":
        args = args[args.index("CMD") + len("CMD") :]
    return yaml.safe_load(args)  # a JSON array


def manifests() -> list[dict]:
    return [
        doc for path in sorted(K8S.glob("*.yaml")) for doc in yaml.safe_load_all(path.read_text())
    ]


def kind(name: str) -> list[dict]:
    return [doc for doc in manifests() if doc["kind"] == name]


def node_help() -> str:
    done = subprocess.run(
        [sys.executable, "-m", "sluicegate.node", "--help"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def variables_in(text: str) -> set[str]:
    return set(re.findall(r"\bSLUICEGATE_[A-Z_]+\b", text))


def test_every_variable_and_flag_the_files_use_is_the_nodes():
    help_text = node_help()
    haproxy = (DEPLOY / "haproxy.cfg").read_text()
    for path in [DEPLOY / "Dockerfile", DEPLOY / "compose.yaml", *K8S.glob("*.yaml")]:
        for variable in variables_in(path.read_text()):
            assert variable in help_text or variable in haproxy, f"{path.name}: {variable}"
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.read(DEPLOY / "systemd" / "sluicegate.service")
    command = shlex.split(unit["Service"]["ExecStart"])
    assert Path(command[0]).name == "sluicegate-node"
    for flag in (arg for arg in command[1:] if arg.startswith("-")):
        assert re.search(rf"(^|[\s,]){re.escape(flag)}\b", help_text), flag


def test_the_image_listens_where_the_manifests_and_probes_look():
    env = image_env()
    exposed = [args for name, args in final_stage() if name == "EXPOSE"]
    assert exposed == [env["SLUICEGATE_PORT"]]
    (statefulset,) = kind("StatefulSet")
    pod = statefulset["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {"http": int(env["SLUICEGATE_PORT"])}
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["port"] in ports
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    assert exec_form("HEALTHCHECK")[-1] == "health"
    services = {service["metadata"]["name"]: service["spec"] for service in kind("Service")}
    headless = services[statefulset["spec"]["serviceName"]]
    assert headless["clusterIP"] == "None" and headless["publishNotReadyAddresses"] is True
    for spec in services.values():
        assert spec["selector"] == pod["metadata"]["labels"]
        assert all(port["targetPort"] in ports for port in spec["ports"])
    (budget,) = kind("PodDisruptionBudget")
    assert budget["spec"]["selector"]["matchLabels"] == pod["metadata"]["labels"]
    # The configuration is mounted where the image works, and the node reads it from there.
    (mount,) = container["volumeMounts"]
    workdir = [args for name, args in final_stage() if name == "WORKDIR"][-1]
    assert mount["mountPath"] == workdir
    (configmap,) = kind("ConfigMap")
    parse_config(configmap["data"]["throttle.toml"], "configmap")


def test_the_pods_find_each_other_by_the_headless_services_name():
    (statefulset,) = kind("StatefulSet")
    (container,) = statefulset["spec"]["template"]["spec"]["containers"]
    env = {variable["name"]: variable for variable in container["env"]}
    (port,) = [port["containerPort"] for port in container["ports"]]
    service = statefulset["spec"]["serviceName"]
    assert env["SLUICEGATE_CLUSTER_JOIN"]["value"] == f"dns:{service}:{port}"
    # The name answers pod IPs: a node skips its own among them only if it advertises it.
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert env["SLUICEGATE_CLUSTER_ADVERTISE"]["value"] == f"$(POD_IP):{port}"
    names = [variable["name"] for variable in container["env"]]
    assert names.index("POD_IP") < names.index("SLUICEGATE_CLUSTER_ADVERTISE")


def test_compose_gives_each_node_an_id_and_an_address_the_others_join():
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    nodes = {name: s for name, s in compose["services"].items() if s.get("image") == "sluicegate"}
    assert len(nodes) == 3
    advertised = set()
    for name, service in nodes.items():
        env = {key: str(value) for key, value in service["environment"].items()}
        assert env["SLUICEGATE_CLUSTER_NODE_ID"] == name
        advertised.add(env["SLUICEGATE_CLUSTER_ADVERTISE"])
        assert set(env["SLUICEGATE_CLUSTER_JOIN"].split(",")) == {f"{n}:8000" for n in nodes}
        config = apply(parse_config("", "compose"), given(parse_args([], {}), env))
        assert config.semaphores
    assert advertised == {f"{n}:8000" for n in nodes}


def install_as_the_image_does(tmp_path: Path) -> Path:
    """The build stage's COPY and `pip install .`, into a directory of its own: what the image
    gets is the package as installed, not this checkout."""
    source = tmp_path / "src"
    source.mkdir()
    build = dockerfile()[: [name for name, _ in dockerfile()].index("FROM", 1)]
    for name, args in build:
        if name == "COPY":
            *paths, _ = args.split()
            for path in paths:
                target = source / path
                if (ROOT / path).is_dir():
                    shutil.copytree(
                        ROOT / path, target, ignore=shutil.ignore_patterns("__pycache__")
                    )
                else:
                    shutil.copy(ROOT / path, target)
    site = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(site),
            str(source),
        ],
        check=True,
        timeout=300,
        capture_output=True,
    )
    return site


def test_the_image_runs_its_entrypoint_with_its_variables_and_its_health_check(tmp_path):
    site = install_as_the_image_does(tmp_path)
    workdir = tmp_path / "etc-sluicegate"  # WORKDIR /etc/sluicegate, with a mounted file
    workdir.mkdir()
    (workdir / "throttle.toml").write_text("[semaphores]\nMounted = 3\n")
    port = free_port()
    env = dict(os.environ, **image_env())
    env.update(
        PATH=f"{site / 'bin'}{os.pathsep}{os.environ['PATH']}",
        PYTHONPATH=str(site),
        SLUICEGATE_ADDRESS="127.0.0.1",  # loopback here; the image binds 0.0.0.0
        SLUICEGATE_PORT=str(port),
    )
    where = subprocess.run(
        [sys.executable, "-c", "import sluicegate.node.cli as c; print(c.__file__)"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert where.stdout.startswith(str(site)), where.stdout + where.stderr
    entrypoint = exec_form("ENTRYPOINT")
    health = [sys.executable if arg == "python" else arg for arg in exec_form("HEALTHCHECK")]
    node = subprocess.Popen(
        [shutil.which(entrypoint[0], path=env["PATH"]), *entrypoint[1:]],
        cwd=workdir,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, timeout=20)
        assert subprocess.run(health, env=env, timeout=10).returncode == 0
        with urllib.request.urlopen(f"{url}/remainder?semaphore=Mounted", timeout=5) as answer:
            assert answer.read() == b"3"
    finally:
        node.send_signal(signal.SIGTERM)
        node.communicate(timeout=10)
    assert node.returncode == 0
    failed = subprocess.run(health, env=env, timeout=10, capture_output=True, text=True)
    assert failed.returncode == 1 and "/health" in failed.stderr


def test_the_statefulsets_settings_make_a_cluster(tmp_path):
    """Three pods as three processes, each on a loopback address of its own as its pod IP and
    all on one port as in the pods, with the StatefulSet's variables, the headless Service's name
    answered by a DNS server of our own, and the ConfigMap's file in the working directory."""
    (statefulset,) = kind("StatefulSet")
    (container,) = statefulset["spec"]["template"]["spec"]["containers"]
    (configmap,) = kind("ConfigMap")
    (workdir := tmp_path / "config").mkdir()
    (workdir / "throttle.toml").write_text(configmap["data"]["throttle.toml"])
    pods = [
        f"{statefulset['metadata']['name']}-{i}" for i in range(statefulset["spec"]["replicas"])
    ]
    pod_ips = {pod: f"127.0.0.{i + 2}" for i, pod in enumerate(pods)}
    port = loopback_port(list(pod_ips.values()))
    (container_port,) = [p["containerPort"] for p in container["ports"]]
    processes = []
    with DnsServer() as dns:
        dns.answer(statefulset["spec"]["serviceName"], list(pod_ips.values()))
        try:
            for pod in pods:
                env = dict(
                    os.environ,
                    SLUICEGATE_ADDRESS=pod_ips[pod],
                    SLUICEGATE_PORT=str(port),
                    SLUICEGATE_CLUSTER_RESOLVER=dns.address,  # in place of the cluster's DNS
                )
                fields = {"metadata.name": pod, "status.podIP": pod_ips[pod]}
                for variable in container["env"]:
                    if "value" in variable:
                        value = variable["value"]
                        value = value.replace("$(POD_NAME)", pod).replace("$(POD_IP)", pod_ips[pod])
                    elif "fieldRef" in variable["valueFrom"]:
                        value = fields[variable["valueFrom"]["fieldRef"]["fieldPath"]]
                    else:
                        value = "a-cluster-secret-of-32-characters"
                    env[variable["name"]] = value.replace(f":{container_port}", f":{port}")
                processes.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "sluicegate.node"],
                        cwd=workdir,
                        env=env,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                )
            urls = [f"http://{pod_ips[pod]}:{port}" for pod in pods]
            wait_until(lambda: all(is_ready(url) for url in urls), 30, "every pod ready")
            with urllib.request.urlopen(f"{urls[1]}/remainder?semaphore=A", timeout=5) as answer:
                assert answer.read() == b"42"
        finally:
            for process in processes:
                process.send_signal(signal.SIGTERM)
            for process in processes:
                try:
                    process.wait(10)
                except subprocess.TimeoutExpired:
                    process.kill()


def test_the_installed_packages_say_their_annotations_are_theirs(tmp_path):
    """PEP 561: a type checker reads the annotations of an installed package only if it carries
    `py.typed`; in a namespace package, each package of it does."""
    site = install_as_the_image_does(tmp_path)
    for package in ("client", "cluster", "node"):
        assert (site / "sluicegate" / package / "py.typed").is_file(), package


# The `node` extra's distributions, and the module each is imported as.
NODE_MODULES = {
    "trio": "trio",
    "trio-websocket": "trio_websocket",
    "hypercorn": "hypercorn",
    "prometheus-client": "prometheus_client",
    "dnspython": "dns",
    "h11": "h11",
}


def test_the_client_needs_nothing_of_the_nodes_stack():
    """`pip install sluicegate` is the client: anyio and msgpack. The node's dependencies are
    the `node` extra (trio among them: an asyncio application need not have it), and the
    client imports none of them."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

    def names(requirements: list[str]) -> set[str]:
        return {re.split(r"[<>=\[ ]", requirement)[0] for requirement in requirements}

    assert names(project["dependencies"]) == {"anyio", "msgpack"}
    assert names(project["optional-dependencies"]["node"]) == set(NODE_MODULES)
    loaded = "import sys, sluicegate.client; print(*{m.split('.')[0] for m in sys.modules})"
    imported = subprocess.run(
        [sys.executable, "-c", loaded], check=True, capture_output=True, text=True, timeout=60
    ).stdout.split()
    assert "anyio" in imported
    assert not set(NODE_MODULES.values()) & set(imported)


def test_the_wheel_installs_the_client_alone_into_a_fresh_venv(tmp_path):
    """A release: `python -m build` (an sdist, and the wheel built from it), installed into a
    venv of its own brings the client's dependencies only, and the client imports there."""
    built, venv = tmp_path / "dist", tmp_path / "venv"
    subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", built, ROOT],
        check=True,
        capture_output=True,
        timeout=300,
    )
    [wheel] = built.glob("*.whl")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True, timeout=60)
    python = venv / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", python, "install", "--quiet", wheel],
        check=True,
        capture_output=True,
        timeout=300,
    )
    listed = (
        "import importlib.metadata as m, sluicegate.client;"
        "print(*{d.metadata['Name'].lower() for d in m.distributions()})"
    )
    installed = subprocess.run(
        [python, "-c", listed], check=True, capture_output=True, text=True, timeout=60
    ).stdout.split()
    assert "sluicegate" in installed and {"anyio", "msgpack"} <= set(installed)
    assert not set(NODE_MODULES) & set(installed)
    site = next((venv / "lib").glob("python3*/site-packages"))
    assert (site / "sluicegate-0.1.0.dist-info" / "licenses" / "LICENSE").is_file()
    assert (site / "sluicegate" / "node" / "static" / "status.html").is_file()
