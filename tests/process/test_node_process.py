"""The node as a process: command line, configuration, logging, signals, exit codes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from sluicegate.node.config import ConfigError, parse_config
from tests.nodes import NodeProcess, free_port, wait_healthy

pytestmark = pytest.mark.process


def run_node_expecting_exit(args: list[str], cwd, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sluicegate.node", *args],
        cwd=cwd,
        env=dict(os.environ, **(env or {})),
        capture_output=True,
        text=True,
        timeout=20,
    )


def test_ctrl_c_stops_within_a_second_with_exit_code_zero(tmp_path):
    with NodeProcess("[semaphores]\nA = 1\n", workdir=tmp_path) as node:
        started = time.monotonic()
        node.signal(signal.SIGINT)
        assert node.wait(5) == 0
        assert time.monotonic() - started < 1.0
        assert "Received SIGINT" in node.log()
        assert "Traceback" not in node.log()


def test_bad_configuration_exits_2_naming_the_key(tmp_path):
    config = tmp_path / "bad.toml"
    config.write_text('[semaphores]\nA = "many"\n')
    result = run_node_expecting_exit(["-c", str(config), "--port", "0"], tmp_path)
    assert result.returncode == 2
    assert "semaphores.A must be an integer" in result.stderr


def test_missing_explicit_configuration_exits_2(tmp_path):
    result = run_node_expecting_exit(["-c", str(tmp_path / "nope.toml")], tmp_path)
    assert result.returncode == 2
    assert "nope.toml" in result.stderr


def test_without_configuration_the_default_file_is_optional(tmp_path):
    process = subprocess.Popen(
        [sys.executable, "-m", "sluicegate.node", "--port", "0"],
        cwd=tmp_path,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        lines = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and len(lines) < 2:
            lines.append(process.stderr.readline())
        text = "".join(lines)
        assert "No configuration file throttle.toml found" in text
        assert "No semaphores configured." in text
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(10) == 0


def test_throttle_toml_in_the_working_directory_is_read(tmp_path):
    (tmp_path / "throttle.toml").write_text("[semaphores]\nFromDefault = 7\n")
    process = subprocess.Popen(
        [sys.executable, "-m", "sluicegate.node", "--port", "0"],
        cwd=tmp_path,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, SLUICEGATE_LOG="INFO"),
    )
    try:
        url = None
        deadline = time.monotonic() + 20
        while url is None and time.monotonic() < deadline:
            line = process.stderr.readline()
            if "Listening on " in line:
                url = line.split("Listening on ", 1)[1].strip()
        assert url
        with urllib.request.urlopen(f"{url}/remainder?semaphore=FromDefault", timeout=5) as r:
            assert r.read() == b"7"
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(10) == 0


def test_port_in_use_exits_1(tmp_path):
    with NodeProcess("", workdir=tmp_path) as first:
        result = run_node_expecting_exit(["--port", str(first.port)], tmp_path)
        assert result.returncode == 1
        assert "Cannot serve" in result.stderr


@pytest.mark.parametrize(
    ("env", "config_level", "flags", "expect_info"),
    [
        ({}, None, [], False),
        ({}, "INFO", [], True),
        ({"THROTTLE_LOG": "INFO"}, "ERROR", [], True),
        ({"THROTTLE_LOG": "INFO", "SLUICEGATE_LOG": "ERROR"}, None, [], False),
        ({"SLUICEGATE_LOG": "ERROR"}, "ERROR", ["--log-level", "info"], True),
    ],
)
def test_log_level_precedence(tmp_path, env, config_level, flags, expect_info):
    config = "[semaphores]\nA = 1\n"
    if config_level:
        config += f'[logging.stderr]\nlevel = "{config_level}"\n'
    path = tmp_path / "node.toml"
    path.write_text(config)
    clean_env = {k: v for k, v in os.environ.items() if k not in ("THROTTLE_LOG", "SLUICEGATE_LOG")}
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "sluicegate.node", "-c", str(path), "--port", str(port), *flags],
        cwd=tmp_path,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(clean_env, **env),
    )
    try:
        wait_healthy(f"http://127.0.0.1:{port}", timeout=20)
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=10)
    assert process.returncode == 0
    assert ("Listening on" in stderr) is expect_info


def test_config_parsing_matches_throttle():
    config = parse_config(
        """
        unknown_top_level = 1
        [semaphores]
        A = 42
        B = { max = 1, level = 1 }
        [semaphores.C]
        max = 3
        level = 0
        extra = "ignored"
        [logging.stderr]
        level = "warn"
        [some_future_section]
        x = 1
        """
    )
    assert {name: (s.max, s.level) for name, s in config.semaphores.items()} == {
        "A": (42, 0),
        "B": (1, 1),
        "C": (3, 0),
    }
    assert config.log_level == "WARN"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[semaphores]\nA = 1.5\n", "semaphores.A must be an integer"),
        ("[semaphores]\nA = { level = 1 }\n", "semaphores.A needs a `max`"),
        ("[semaphores]\nA = { max = 1, level = true }\n", "semaphores.A.level must be an integer"),
        ("[semaphores]\nA = 99999999999999999999\n", "semaphores.A is out of range"),
        ('[logging.stderr]\nlevel = "LOUD"\n', "logging.stderr.level must be one of"),
        ('[cluster]\nadvertise = "nohost"\n', "cluster.advertise must be a host:port string"),
        ('[cluster]\ndown_after = "0s"\n', "cluster.down_after must be longer than zero"),
        ("[cluster]\njoin = [1]\n", "cluster.join must be a list of host:port strings"),
        ('[cluster]\njoin = ["dns:peers:http"]\n', "cluster.join: 'dns:peers:http' is not dns:"),
        ("[cluster]\nresolver = 53\n", "cluster.resolver must be an IP:PORT string"),
        ("semaphores = 3\n", "[semaphores] must be a table"),
        ("[rate_limits]\napi = 3\n", "rate_limits.api must be a table"),
        ('[rate_limits]\napi = { algorithm = "leaky" }\n', "rate_limits.api.algorithm must be"),
        (
            '[rate_limits]\napi = { algorithm = "gcra", burst = 2 }\n',
            "rate_limits.api needs `rate` (gcra)",
        ),
        (
            '[rate_limits]\napi = { algorithm = "token_bucket", capacity = 0, rate = 1 }\n',
            "rate_limits.api.capacity is out of range",
        ),
        (
            '[rate_limits]\napi = { algorithm = "token_bucket", capacity = 2, rate = 0 }\n',
            "rate_limits.api.rate must be a number above 0",
        ),
        (
            '[rate_limits]\napi = { algorithm = "fixed_window", limit = 2, window = "soon" }\n',
            "rate_limits.api.window: expected number",
        ),
        (
            '[rate_limits]\napi = { algorithm = "sliding_log", limit = 2, window = "1s", '
            "rate = 1 }\n",
            "rate_limits.api.rate is not a setting of sliding_log",
        ),
        (
            '[rate_limits]\napi = { algorithm = "fixed_window", limit = 2, window = "1s", '
            'mode = "fast" }\n',
            "rate_limits.api.mode must be one of exact, gossip, lease",
        ),
        (
            '[rate_limits]\napi = { algorithm = "sliding_log", limit = 2, window = "1s", '
            'mode = "lease" }\n',
            "rate_limits.api: mode lease takes token_bucket, gcra, fixed_window, not sliding_log",
        ),
        (
            '[rate_limits]\napi = { algorithm = "gcra", burst = 2, rate = 1, term = "1s" }\n',
            "rate_limits.api.term is a setting of mode lease only",
        ),
        (
            '[rate_limits]\napi = { algorithm = "gcra", burst = 2, rate = 1, mode = "lease", '
            'term = "0s" }\n',
            "rate_limits.api.term must be longer than zero",
        ),
        (
            '[rate_limits]\napi = { algorithm = "sliding_log", limit = 1000000, window = "1s" }\n',
            "rate_limits.api.limit is out of range",
        ),
        ("[semaphores\n", "not valid TOML"),
    ],
)
def test_config_errors_name_the_key(text, message):
    with pytest.raises(ConfigError, match=None) as error:
        parse_config(text, "node.toml")
    assert message in str(error.value)
    assert str(error.value).startswith("node.toml: ")


def test_a_cluster_secret_shorter_than_16_bytes_exits_2(tmp_path):
    result = run_node_expecting_exit(
        ["--port", "0", "--node-id", "n1"], tmp_path, env={"SLUICEGATE_CLUSTER_SECRET": "short"}
    )
    assert result.returncode == 2
    assert "the cluster secret must be 16 bytes or longer, not 5" in result.stderr


def test_a_node_configured_by_environment_variables_alone(tmp_path):
    """No file: semaphores, a limit, the port and the log level from the environment, one
    limit overridden by its flag."""
    port = free_port()
    env = dict(
        os.environ,
        SLUICEGATE_SEMAPHORES="A = 2, B = { max = 1, level = 1 }",
        SLUICEGATE_LIMITS_PEERS="1",
        SLUICEGATE_LIMITS_LONGEST_EXPIRES_IN="1m",
        SLUICEGATE_PORT=str(port),
        SLUICEGATE_LOG="INFO",
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "sluicegate.node", "--limits-peers", "2"],
        cwd=tmp_path,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, timeout=20)
        with urllib.request.urlopen(f"{url}/remainder?semaphore=B", timeout=5) as answer:
            assert answer.read() == b"1"
        peers = [_post(f"{url}/new_peer", b'{"expires_in": "30s"}') for _ in range(2)]
        assert all(status == 200 for status, _ in peers)
        status, body = _post(f"{url}/new_peer", b'{"expires_in": "30s"}')
        assert (status, "[limits] peers" in body) == (429, True)
        status, body = _post(f"{url}/new_peer", b'{"expires_in": "2m"}')
        assert (status, "longest_expires_in" in body) == (400, True)
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=10)
    assert process.returncode == 0
    assert "No configuration file" not in stderr


def _post(url: str, body: bytes) -> tuple[int, str]:
    request = urllib.request.Request(
        url, data=body, method="POST", headers={"content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_json_log_lines(tmp_path):
    process = subprocess.Popen(
        [sys.executable, "-m", "sluicegate.node", "--port", "0", "--log-format", "json"],
        cwd=tmp_path,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, SLUICEGATE_LOG="INFO", SLUICEGATE_SEMAPHORES="A = 1"),
    )
    try:
        lines = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not any("Listening on" in x for x in lines):
            lines.append(process.stderr.readline())
    finally:
        process.send_signal(signal.SIGTERM)
        _, rest = process.communicate(timeout=10)
    records = [json.loads(line) for line in [*lines, *rest.splitlines()] if line.strip()]
    listening = [r for r in records if r["message"].startswith("Listening on http://")]
    assert listening and listening[0]["level"] == "INFO"
    assert listening[0]["logger"].startswith("sluicegate")
    assert listening[0]["time"].endswith("+00:00")
    assert process.returncode == 0
