"""Every setting of the file as a flag and an environment variable (node/settings.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from sluicegate.cluster.limits import Limits
from sluicegate.cluster.semaphores import SemaphoreConfig
from sluicegate.node import cli
from sluicegate.node.config import (
    ClusterConfig,
    ConfigError,
    NodeConfig,
    parse_config,
    whole_number,
)
from sluicegate.node.settings import SETTINGS, apply, given

FILE = """
[semaphores]
A = 5
B = { max = 1, level = 1 }

[cluster]
down_after = "3s"
join = ["10.0.0.1:8000"]

[limits]
peers = 100
"""
README = Path(__file__).resolve().parents[2] / "README.md"


def configured(argv: list[str], environ: dict[str, str], text: str = FILE) -> NodeConfig:
    args = cli.parse_args(argv, environ)
    return apply(parse_config(text, "node.toml"), given(args, environ))


def test_every_setting_of_the_file_has_a_variable_and_all_but_the_secret_a_flag():
    keys = {(s.section, s.key) for s in SETTINGS}
    for field in dataclasses.fields(ClusterConfig):
        assert ("cluster", field.name) in keys
    for field in dataclasses.fields(Limits):
        assert ("limits", field.name) in keys
    assert {("semaphores", ""), ("rate_limits", "")} <= keys
    assert [s.variable for s in SETTINGS if s.flag is None] == ["SLUICEGATE_CLUSTER_SECRET"]
    assert len({s.variable for s in SETTINGS}) == len(SETTINGS)


def test_the_readme_names_every_flag_and_variable():
    readme = README.read_text(encoding="utf-8")
    for setting in SETTINGS:
        assert setting.variable in readme
        if setting.flag is not None:
            assert f"`{setting.flag}`" in readme


def test_a_flag_wins_over_its_variable_which_wins_over_the_file():
    assert configured([], {}).cluster.down_after == 3.0
    environ = {"SLUICEGATE_CLUSTER_DOWN_AFTER": "5s", "SLUICEGATE_LIMITS_PEERS": "7"}
    from_environment = configured([], environ)
    assert from_environment.cluster.down_after == 5.0
    assert from_environment.limits.peers == 7
    flags = configured(["--down-after", "2s", "--limits-peers", "9"], environ)
    assert flags.cluster.down_after == 2.0
    assert flags.limits.peers == 9
    # What neither names stays as the file says.
    assert flags.cluster.join == ("10.0.0.1:8000",)
    assert flags.limits.waits_per_peer == Limits().waits_per_peer


def test_join_takes_commas_and_repeated_flags():
    environ = {"SLUICEGATE_CLUSTER_JOIN": "a:1, b:2"}
    assert configured([], environ).cluster.join == ("a:1", "b:2")
    flags = configured(["--join", "c:3", "--join", "d:4,e:5"], environ)
    assert flags.cluster.join == ("c:3", "d:4", "e:5")


def test_join_takes_dns_names_beside_addresses_and_a_resolver_for_them():
    text = '[cluster]\njoin = ["dns:peers.test:8000"]\nresolver = "127.0.0.1:5353"\n'
    from_file = configured([], {}, text=text).cluster
    assert (from_file.join, from_file.resolver) == (("dns:peers.test:8000",), "127.0.0.1:5353")
    environ = {
        "SLUICEGATE_CLUSTER_JOIN": "dns:sluicegate-peers:8000,10.0.0.9:8000",
        "SLUICEGATE_CLUSTER_RESOLVER": "[fd00::10]:53",
    }
    from_environment = configured([], environ).cluster
    assert from_environment.join == ("dns:sluicegate-peers:8000", "10.0.0.9:8000")
    assert from_environment.resolver == "[fd00::10]:53"
    flags = configured(["--join", "dns:a.test:1", "--resolver", "10.96.0.10"], environ).cluster
    assert (flags.join, flags.resolver) == (("dns:a.test:1",), "10.96.0.10")


def test_semaphores_replace_the_entries_they_name_and_keep_the_others():
    one_line = configured([], {"SLUICEGATE_SEMAPHORES": "A = 2, C = { max = 3, level = 2 }"})
    assert one_line.semaphores == {
        "A": SemaphoreConfig(2, 0),
        "B": SemaphoreConfig(1, 1),
        "C": SemaphoreConfig(3, 2),
    }
    lines = configured(["--semaphores", "A = 4\nD = 1\n"], {})
    assert lines.semaphores["A"] == SemaphoreConfig(4, 0)
    assert lines.semaphores["D"] == SemaphoreConfig(1, 0)
    braces = configured([], {"SLUICEGATE_SEMAPHORES": "{ E = 6 }"}, text="")
    assert braces.semaphores == {"E": SemaphoreConfig(6, 0)}


def test_rate_limits_from_a_variable():
    text = '{ api = { algorithm = "token_bucket", capacity = 10, rate = 5, mode = "gossip" } }'
    config = configured([], {"SLUICEGATE_RATE_LIMITS": text}, text="")
    assert config.rate_limits["api"].limit == 10
    assert config.rate_limits["api"].mode == "gossip"


def test_auth_from_a_variable_adds_tokens_and_may_close_routes():
    file = '[auth.a]\nsecret_env = "A"\n'
    config = configured([], {"SLUICEGATE_AUTH": 'b = { secret_env = "B" }'}, text=file)
    assert sorted(config.auth.tokens) == ["a", "b"] and config.auth.open is None
    closed = configured(["--auth", 'open = ["/health"]'], {}, text=file)
    assert sorted(closed.auth.tokens) == ["a"] and closed.auth.open == ("/health",)


@pytest.mark.parametrize(
    ("argv", "environ", "said"),
    [
        (
            [],
            {"SLUICEGATE_LIMITS_PEERS": "many"},
            "SLUICEGATE_LIMITS_PEERS: must be a whole number",
        ),
        (["--limits-peers", "0"], {}, "--limits-peers: limits.peers is out of range"),
        ([], {"SLUICEGATE_CLUSTER_DOWN_AFTER": "soon"}, "SLUICEGATE_CLUSTER_DOWN_AFTER: cluster"),
        (["--advertise", "nohost"], {}, "--advertise: cluster.advertise must be a host:port"),
        ([], {"SLUICEGATE_SEMAPHORES": "A = = 1"}, "SLUICEGATE_SEMAPHORES: not the body of a"),
        (["--semaphores", "A = 'x'"], {}, "--semaphores: semaphores.A must be an integer"),
        ([], {"SLUICEGATE_RATE_LIMITS": "x = 1"}, "SLUICEGATE_RATE_LIMITS: rate_limits.x must"),
        (
            ["--join", "a:1,dns:peers"],
            {},
            "--join: cluster.join: 'dns:peers' is not dns:NAME:PORT",
        ),
        (
            [],
            {"SLUICEGATE_CLUSTER_JOIN": "dns:10.0.0.1:8000"},
            "SLUICEGATE_CLUSTER_JOIN: cluster.join: 'dns:10.0.0.1:8000' names an address",
        ),
        (
            [],
            {"SLUICEGATE_CLUSTER_RESOLVER": "dns.google:53"},
            "SLUICEGATE_CLUSTER_RESOLVER: cluster.resolver: 'dns.google:53' is not a DNS server",
        ),
    ],
)
def test_a_mistake_names_the_flag_or_variable_it_came_from(argv, environ, said):
    with pytest.raises(ConfigError, match="^" + said.replace("(", r"\(")):
        configured(argv, environ)


def test_a_secret_file_wins_over_the_secret_variable_and_is_never_a_flag(tmp_path):
    secret_file = tmp_path / "secret"
    secret_file.write_text("from-the-file-0123456789\n")
    environ = {"SLUICEGATE_CLUSTER_SECRET": "from-the-variable-0123456789"}
    assert configured([], environ).cluster.secret == "from-the-variable-0123456789"
    both = configured(["--secret-file", str(secret_file)], environ)
    assert both.cluster.secret == "from-the-file-0123456789"
    environ["SLUICEGATE_CLUSTER_SECRET_FILE"] = str(tmp_path / "missing")
    with pytest.raises(ConfigError, match="SLUICEGATE_CLUSTER_SECRET_FILE: cannot read"):
        configured([], environ)
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigError, match="--secret-file: .* is empty"):
        configured(["--secret-file", str(tmp_path / "empty")], {})
    with pytest.raises(SystemExit):
        cli.parse_args(["--secret", "x"], {})


def test_the_command_lines_own_settings_have_variables_too():
    args = cli.parse_args([], {"SLUICEGATE_ADDRESS": "0.0.0.0", "SLUICEGATE_PORT": "9000"})
    assert (args.address, args.port) == ("0.0.0.0", "9000")
    args = cli.parse_args(["--port", "1"], {"SLUICEGATE_PORT": "9000"})
    assert args.port == "1"
    args = cli.parse_args([], {"SLUICEGATE_CONFIGURATION": "/etc/sluicegate.toml"})
    assert args.configuration == Path("/etc/sluicegate.toml")


@pytest.mark.parametrize(
    ("argv", "environ", "said"),
    [
        (["--port", "http"], {}, "not a port number"),
        ([], {"SLUICEGATE_PORT": "70000"}, "not a port number"),
        (["--log-level", "LOUD"], {}, "--log-level: logging.stderr.level must be one of"),
        ([], {"SLUICEGATE_LOG_FORMAT": "yaml"}, "SLUICEGATE_LOG_FORMAT: text or json"),
        (["--join", "a:1"], {}, "a cluster needs a shared secret"),
        (
            ["--address", "0.0.0.0", "--node-id", "n1"],
            {"SLUICEGATE_CLUSTER_SECRET": "s" * 16},
            "set --advertise HOST:PORT",
        ),
    ],
)
def test_the_node_exits_2_on_a_mistake_in_a_flag_or_variable(
    argv, environ, said, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    assert cli.main(argv) == 2
    assert said in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0", 0),
        ("8000", 8000),
        ("65535", 65535),
        ("65536", 65536),
        ("99999999", 65536),  # above the cap
        ("9" * 5000, 65536),  # int() alone refuses 4,301 digits
        ("", None),
        ("-1", None),
        ("+1", None),
        (" 1", None),
        ("1_000", None),
        ("\u0661\u0662", None),  # Arabic-Indic digits, which int() takes
    ],
)
def test_a_whole_number_is_ascii_digits_only_and_capped(text, value):
    assert whole_number(text, 65536) == value
