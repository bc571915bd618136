"""Every setting of the configuration file as a command-line flag and as an environment variable,
so that a container or a Kubernetes pod needs no file of its own per node.

Precedence: the flag, then the variable, then the file, then the default. One rule names them
from the TOML key (README, "Settings"):

| TOML                   | flag             | variable                        |
|------------------------|------------------|---------------------------------|
| `[cluster] down_after` | `--down-after`   | `SLUICEGATE_CLUSTER_DOWN_AFTER` |
| `[limits] peers`       | `--limits-peers` | `SLUICEGATE_LIMITS_PEERS`       |
| `[semaphores]`         | `--semaphores`   | `SLUICEGATE_SEMAPHORES`         |
| `[rate_limits]`        | `--rate-limits`  | `SLUICEGATE_RATE_LIMITS`        |

The cluster secret has a variable and a file (`--secret-file`), never a flag: a command line is
visible to every user of the machine. `[semaphores]` and `[rate_limits]` take the body of a TOML
table, an entry a line or several on one line between commas; each entry replaces the file's
entry of its name, and the file's others stay. Values are checked by the file's rules, and a
mistake names the flag or variable it came from.
"""

from __future__ import annotations

import argparse
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from sluicegate.cluster.limits import Limits

from .config import ConfigError, NodeConfig, parse_section, whole_number
from .logs import clip

# How the text of a flag or variable becomes what the file would hold.
TEXT = "text"
INTEGER = "integer"
ADDRESSES = "addresses"  # comma-separated; a flag may be repeated
TABLE = "table"
SECRET_FILE = "secret file"


@dataclass(frozen=True)
class Setting:
    section: str
    key: str  # "" for a whole section
    kind: str
    flag: str | None
    variable: str
    metavar: str
    help: str

    @property
    def dest(self) -> str:
        """The attribute argparse keeps the flag's value in."""
        return self.variable.lower()


def _cluster_setting(
    key: str, metavar: str, text: str, kind: str = TEXT, flag: bool = True
) -> Setting:
    return Setting(
        "cluster",
        key,
        kind,
        "--" + key.replace("_", "-") if flag else None,
        f"SLUICEGATE_CLUSTER_{key.upper()}",
        metavar,
        text,
    )


def _limit_setting(key: str, default: object) -> Setting:
    duration = isinstance(default, float)
    return Setting(
        "limits",
        key,
        TEXT if duration else INTEGER,
        "--limits-" + key.replace("_", "-"),
        f"SLUICEGATE_LIMITS_{key.upper()}",
        "DURATION" if duration else "N",
        f"[limits] {key} (default: {_seconds(default) if isinstance(default, float) else default})",
    )


def _seconds(seconds: float) -> str:
    """A whole number of days, hours, minutes or seconds, as the file would say it."""
    for unit, length in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= length and seconds % length == 0:
            return f"{seconds / length:g}{unit}"
    return f"{seconds:g}s"


SETTINGS: tuple[Setting, ...] = (
    _cluster_setting("node_id", "ID", "this node's id in the cluster (default: ADDRESS:PORT)"),
    _cluster_setting(
        "join",
        "HOST:PORT",
        "seed nodes, or dns:NAME:PORT for every address of NAME; repeat, or separate with commas",
        ADDRESSES,
    ),
    _cluster_setting(
        "resolver", "IP:PORT", "the DNS server dns: seeds ask (default: the system's)"
    ),
    _cluster_setting(
        "advertise", "HOST:PORT", "where other nodes reach this one (default: bound address)"
    ),
    _cluster_setting("secret", "", "the cluster secret, 16 bytes or more", flag=False),
    _cluster_setting(
        "secret_file",
        "PATH",
        "a file holding the cluster secret (wins over the variable)",
        SECRET_FILE,
    ),
    _cluster_setting("down_after", "DURATION", "a member silent this long is down (default: 3s)"),
    _cluster_setting(
        "gossip_interval", "DURATION", "how often membership is gossiped (default: 500ms)"
    ),
    _cluster_setting("lease", "DURATION", "an owner's lease from its quorum (default: down_after)"),
    _cluster_setting(
        "cold_start_grace", "DURATION", "after a cold start, restores only (default: 0s)"
    ),
    _cluster_setting(
        "rate_gossip_interval", "DURATION", "how often gossip-mode limiters share (50ms)"
    ),
    _cluster_setting(
        "state_dir", "PATH", "where the era and generation are kept across lives (default: none)"
    ),
    *(_limit_setting(f.name, f.default) for f in fields(Limits)),
    *(
        Setting(
            "tls",
            key,
            TEXT,
            "--tls-" + key.replace("_", "-"),
            f"SLUICEGATE_TLS_{key.upper()}",
            metavar,
            f"[tls] {key}: {text}",
        )
        for key, metavar, text in (
            ("certificate", "PATH", "the node's certificate chain (PEM); with a key, TLS is on"),
            ("key", "PATH", "the certificate's private key (PEM)"),
            ("ca", "PATH", "the CA of the nodes' certificates, which links verify (PEM)"),
            ("client_ca", "PATH", "clients must show a certificate this CA signed (PEM)"),
            ("minimum_version", "VERSION", "the oldest TLS version taken: 1.2 or 1.3 (1.2)"),
        )
    ),
    Setting(
        "semaphores",
        "",
        TABLE,
        "--semaphores",
        "SLUICEGATE_SEMAPHORES",
        "TABLE",
        "semaphores, as 'A = 5, B = { max = 1, level = 1 }'",
    ),
    Setting(
        "rate_limits",
        "",
        TABLE,
        "--rate-limits",
        "SLUICEGATE_RATE_LIMITS",
        "TABLE",
        "rate limiters, as 'api = { algorithm = \"gcra\", burst = 10, rate = 5 }'",
    ),
    Setting(
        "auth",
        "",
        TABLE,
        "--auth",
        "SLUICEGATE_AUTH",
        "TABLE",
        'tokens, as \'crawler = { secret_env = "CRAWLER_TOKEN", semaphores = ["crawl-*"] }\'',
    ),
)


def add_flags(parser: argparse.ArgumentParser) -> None:
    """A flag for every setting that has one, its variable named in its help."""
    group = parser.add_argument_group(
        "settings", "each wins over the file; the variable named is read when the flag is not given"
    )
    for setting in SETTINGS:
        if setting.flag is not None:
            group.add_argument(
                setting.flag,
                dest=setting.dest,
                action="append" if setting.kind == ADDRESSES else "store",
                metavar=setting.metavar,
                help=f"{setting.help}; {setting.variable}",
            )


def given(
    args: argparse.Namespace, environ: Mapping[str, str]
) -> list[tuple[Setting, object, str]]:
    """The settings a flag or a variable gives: (setting, its text, where it came from)."""
    chosen: list[tuple[Setting, object, str]] = []
    for setting in SETTINGS:
        flag = setting.flag
        flag_value = getattr(args, setting.dest, None) if flag else None
        if flag and flag_value:
            chosen.append((setting, flag_value, flag))
        elif environ.get(setting.variable):
            chosen.append((setting, environ[setting.variable], setting.variable))
    return chosen


def apply(config: NodeConfig, chosen: list[tuple[Setting, object, str]]) -> NodeConfig:
    """`config` with what flags and variables give in place of the file's."""
    for setting, text, origin in chosen:
        config = _apply(config, setting, text, origin)
    return config


def _apply(config: NodeConfig, setting: Setting, text: object, origin: str) -> NodeConfig:
    section, key, kind = setting.section, setting.key, setting.kind
    if kind == SECRET_FILE:
        secret = _read_secret(Path(str(text)), origin)
        return replace(config, cluster=replace(config.cluster, secret=secret))
    if kind == TABLE:
        entries = parse_section(section, _table(str(text), origin), origin)
        current = getattr(config, section)
        merged = current.merged(entries) if section == "auth" else {**current, **entries}
        tables: dict[str, Any] = {section: merged}
        return replace(config, **tables)
    value = {ADDRESSES: _addresses, INTEGER: _integer}.get(kind, _as_is)(text, origin)
    parsed = parse_section(section, {key: value}, origin)
    return replace(
        config, **{section: replace(getattr(config, section), **{key: getattr(parsed, key)})}
    )


def _as_is(text: object, origin: str) -> object:
    return text


def _addresses(text: object, origin: str) -> list[str]:
    values = text if isinstance(text, list) else [text]
    return [part.strip() for value in values for part in str(value).split(",") if part.strip()]


def _integer(text: object, origin: str) -> int:
    value = whole_number(str(text).strip().replace("_", ""), 2**63)
    if value is None or value == 2**63:
        raise ConfigError(f"{origin}: must be a whole number, found {clip(str(text), 40)!r}")
    return value


def _table(text: str, origin: str) -> dict:
    """The body of a TOML table: entries a line each, or on one line between commas."""
    body = text.strip()
    if body.startswith("{") and body.endswith("}"):
        body = body[1:-1]
    try:
        return tomllib.loads(body)
    except tomllib.TOMLDecodeError:
        pass
    try:
        return tomllib.loads(f"table = {{ {body} }}")["table"]
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(
            f"{origin}: not the body of a TOML table such as 'A = 5, B = {{ max = 1 }}': {error}"
        ) from None


def _read_secret(path: Path, origin: str) -> str:
    try:
        secret = path.read_text(encoding="utf-8").strip()
    except OSError as error:
        raise ConfigError(f"{origin}: cannot read {path}: {error.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{origin}: {path} is not UTF-8 text") from None
    if not secret:
        raise ConfigError(f"{origin}: {path} is empty")
    return secret
