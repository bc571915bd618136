"""Node configuration: Throttle's TOML format, read exactly as Throttle reads it.

```toml
[semaphores]
A = 42                        # max 42, level 0
B = { max = 1, level = 1 }

[logging.stderr]
level = "WARN"
```

Unknown keys and sections are ignored, so Throttle configuration files with keys we do not know
load. Our own sections are checked strictly: a mistake there is refused at start, naming the key.
Every setting is also a flag and an environment variable (`node/settings.py`).

Rate limits, each `algorithm` with its two settings, and `mode` "exact" (the default: the key's
owner decides, no overshoot), "gossip" (the node asked decides at once) or "lease" (our clients
decide from slices the owner hands them for a `term`, default 1s; see docs/rate_limits.md):

```toml
[rate_limits]
api = { algorithm = "token_bucket", capacity = 100, rate = 50 }   # rate per second
burst = { algorithm = "gcra", burst = 10, rate = 5 }
crawl = { algorithm = "fixed_window", limit = 5, window = "800ms" }
smooth = { algorithm = "sliding_window", limit = 100, window = "1m" }
search = { algorithm = "sliding_log", limit = 8, window = "1s", mode = "gossip" }
fetch = { algorithm = "token_bucket", capacity = 200, rate = 1000, mode = "lease", term = "2s" }
```

Our own section, for running several nodes as one cluster:

```toml
[cluster]
node_id = "n1"                    # default: ADDRESS:PORT of this node
join = ["10.0.0.2:8000"]          # seeds: host:port of other nodes, or dns:NAME:PORT
resolver = "10.96.0.10:53"        # the DNS server dns: seeds ask (default: /etc/resolv.conf's)
secret = "..."                    # shared by all nodes; or SLUICEGATE_CLUSTER_SECRET(_FILE)
advertise = "10.0.0.1:8000"       # where other nodes reach this one (default: the bound address)
down_after = "3s"                 # a member silent this long is down
gossip_interval = "500ms"
lease = "3s"                      # an owner acts this long past its quorum's word (down_after)
cold_start_grace = "0s"           # after a cold start of the whole cluster: restores only
rate_gossip_interval = "50ms"     # how often rate limiters in gossip mode share their "go"s
state_dir = "/var/lib/sluicegate" # keeps the era and generation across lives (default: none)
```

TLS on the node's port, for clients and for the other nodes (README, "Security"):

```toml
[tls]
certificate = "/etc/sluicegate/node.pem"  # the node's certificate chain (PEM)
key = "/etc/sluicegate/node-key.pem"      # its private key (PEM)
ca = "/etc/sluicegate/cluster-ca.pem"     # signs the nodes' certificates: links verify with it
client_ca = "/etc/sluicegate/clients.pem" # clients must show a certificate it signs (mutual TLS)
minimum_version = "1.2"                   # or "1.3"
```

Tokens for clients (README, "Security"): with any, a request without a known token is refused.
Each token's secret comes from the environment or a file, never from this one:

```toml
[auth]
open = ["/health", "/ready"]      # what needs no token (default: /, /health, /ready, /version,
                                  # /favicon.ico and /metrics)
[auth.crawler]
secret_env = "CRAWLER_TOKEN"      # or secret_file = "/run/secrets/crawler"
semaphores = ["crawl-*"]          # the semaphores it may use (glob patterns; default: all)
rate_limits = ["crawl"]           # the rate limiters it may use (default: all)
read_only = false                 # true: remainder and is_acquired only
admin = false                     # true: also /status and everyone's peers
```

Bounds on what clients can make a node hold (README, "Limits"):

```toml
[limits]
connections = 4096                # open connections; one more is answered 503 and closed
peers = 100000                    # peers homed on this node
peers_per_connection = 1000       # live peers one /ws connection made
waits_per_peer = 16               # acquires of one peer waiting at once
waits = 20000                     # acquires waiting on this node at once, of all its peers
longest_expires_in = "90d"        # a longer expiry is refused
longest_block_for = "1h"          # a longer long poll is cut to this
restore_count = 1000000           # the largest count a restore may claim for one lock
rate_limit_keys = 100000          # keys one rate limiter keeps on this node
key_length = 256                  # characters of a rate-limit key
request_size = 1048576            # bytes of an HTTP request body
```
"""

from __future__ import annotations

import hashlib
import json
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, overload

from sluicegate.cluster.auth import INFO_ROUTES
from sluicegate.cluster.dns_seeds import (
    AddressError,
    is_dns_entry,
    parse_dns_entry,
    parse_nameserver,
)
from sluicegate.cluster.durations import DurationError, parse_duration
from sluicegate.cluster.limits import Limits
from sluicegate.cluster.quota_leases import DEFAULT_TERM, LEASE_ALGORITHMS
from sluicegate.cluster.rate_limits import MODES, RateLimiterConfig
from sluicegate.cluster.semaphores import SemaphoreConfig

DEFAULT_PATH = Path("throttle.toml")
LOG_LEVELS = ("ERROR", "WARN", "INFO", "DEBUG", "TRACE")

# Throttle stores max as i64 and level as i32.
_I64 = (-(2**63), 2**63 - 1)
_I32 = (-(2**31), 2**31 - 1)


class ConfigError(ValueError):
    """The configuration cannot be used; the message names the file and the key."""


@dataclass(frozen=True)
class ClusterConfig:
    node_id: str | None = None
    # HOST:PORT, or dns:NAME:PORT for every address of NAME, looked up again and again.
    join: tuple[str, ...] = ()
    # The DNS server's IP:PORT that dns: seeds ask; None: the system's (/etc/resolv.conf).
    resolver: str | None = None
    secret: str | None = None
    advertise: str | None = None
    down_after: float = 3.0
    gossip_interval: float = 0.5
    # How long an acceptor's lease promise lasts (docs/cluster.md); None: `down_after`.
    lease: float | None = None
    # After a cold start of the whole cluster, restores are accepted but nothing new is granted
    # for this long: none, as Throttle does.
    cold_start_grace: float = 0.0
    # How often a node sends its rate limiters' "go" events to the others (gossip mode).
    rate_gossip_interval: float = 0.05
    # Where the node keeps its era and generation across lives (node/state_file.py); None:
    # nowhere, and eras across a cold start of the whole cluster rise only with the wall clock.
    state_dir: str | None = None


TLS_VERSIONS = ("1.2", "1.3")


@dataclass(frozen=True)
class TokenConfig:
    """Where a token's secret is (an environment variable or a file), and its scopes."""

    secret_env: str | None = None
    secret_file: str | None = None
    semaphores: tuple[str, ...] = ("*",)
    rate_limits: tuple[str, ...] = ("*",)
    read_only: bool = False
    admin: bool = False


@dataclass(frozen=True)
class AuthConfig:
    """`[auth]`: the tokens by name, and the routes of `INFO_ROUTES` that need none (None:
    all of them)."""

    tokens: dict[str, TokenConfig] = field(default_factory=dict)
    open: tuple[str, ...] | None = None

    def merged(self, other: AuthConfig) -> AuthConfig:
        """These settings with `other`'s on top (a flag's or a variable's over the file's)."""
        return AuthConfig(
            {**self.tokens, **other.tokens}, self.open if other.open is None else other.open
        )


@dataclass(frozen=True)
class TlsConfig:
    """Paths of PEM files: none (plain text), or a certificate and its key at least."""

    certificate: str | None = None
    key: str | None = None
    ca: str | None = None
    client_ca: str | None = None
    minimum_version: str = "1.2"

    @property
    def on(self) -> bool:
        return self.certificate is not None


@dataclass(frozen=True)
class NodeConfig:
    semaphores: dict[str, SemaphoreConfig] = field(default_factory=dict)
    rate_limits: dict[str, RateLimiterConfig] = field(default_factory=dict)
    log_level: str | None = None
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    limits: Limits = field(default_factory=Limits)
    tls: TlsConfig = field(default_factory=TlsConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)


def definitions_digest(config: NodeConfig) -> str:
    """A digest of what decides answers: every semaphore (max, level) and rate limiter
    (algorithm, limit, rate, window, mode, and the term of lease mode), by name. Nodes gossip it
    to find members configured otherwise (docs: README, "Changing semaphores and rate
    limits")."""
    definitions = {
        "semaphores": {name: [s.max, s.level] for name, s in config.semaphores.items()},
        "rate_limits": {
            name: [r.algorithm, r.limit, r.rate, r.window, r.mode]
            + ([r.term] if r.mode == "lease" else [])
            for name, r in config.rate_limits.items()
        },
    }
    text = json.dumps(definitions, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def parse_config(text: str, source: str = "<config>") -> NodeConfig:
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{source}: not valid TOML: {error}") from None
    return NodeConfig(
        semaphores=_semaphores(doc.get("semaphores", {}), source),
        rate_limits=_rate_limits(doc.get("rate_limits", {}), source),
        log_level=_log_level(doc.get("logging", {}), source),
        cluster=_cluster(doc.get("cluster", {}), source),
        limits=_limits(doc.get("limits", {}), source),
        tls=_tls(doc.get("tls", {}), source),
        auth=_auth(doc.get("auth", {}), source),
    )


def parse_section(name: str, table: object, source: str) -> Any:
    """One section of the file (`semaphores`, `rate_limits`, `logging`, `cluster`, `limits`,
    `tls`, `auth`) checked by the file's rules: what `parse_config` makes of it."""
    return _SECTIONS[name](table, source)


def load_config(path: Path | None) -> tuple[NodeConfig, str | None]:
    """Read the configuration file; returns it and a notice to log, if any.

    With no path given, `throttle.toml` in the working directory is used if it exists, and an
    empty configuration otherwise (as Throttle does). A path given explicitly must exist.
    """
    if path is None:
        if not DEFAULT_PATH.exists():
            return NodeConfig(), f"No configuration file {DEFAULT_PATH} found; using an empty one."
        path = DEFAULT_PATH
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise ConfigError(f"cannot read configuration {path}: {error.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text") from None
    return parse_config(text, str(path)), None


def _semaphores(table: object, source: str) -> dict[str, SemaphoreConfig]:
    if not isinstance(table, dict):
        raise ConfigError(f"{source}: [semaphores] must be a table")
    result = {}
    for name, value in table.items():
        key = f"semaphores.{name}"
        if isinstance(value, dict):
            if "max" not in value:
                raise ConfigError(f"{source}: {key} needs a `max`")
            max_ = _integer(value["max"], f"{key}.max", source, _I64)
            level = _integer(value.get("level", 0), f"{key}.level", source, _I32)
        else:
            max_ = _integer(value, key, source, _I64)
            level = 0
        result[name] = SemaphoreConfig(max=max_, level=level)
    return result


# What each algorithm is given: (the key that is its `limit`, the other key).
_ALGORITHM_KEYS = {
    "token_bucket": ("capacity", "rate"),
    "gcra": ("burst", "rate"),
    "fixed_window": ("limit", "window"),
    "sliding_window": ("limit", "window"),
    "sliding_log": ("limit", "window"),
}
# The sliding log keeps `limit` timestamps per key: a bound on its memory.
MAX_LOG_LIMIT = 100_000


def _rate_limits(table: object, source: str) -> dict[str, RateLimiterConfig]:
    if not isinstance(table, dict):
        raise ConfigError(f"{source}: [rate_limits] must be a table")
    result = {}
    for name, value in table.items():
        key = f"rate_limits.{name}"
        if not isinstance(value, dict):
            raise ConfigError(
                f"{source}: {key} must be a table such as "
                f'{{ algorithm = "token_bucket", capacity = 100, rate = 50 }}'
            )
        algorithm = value.get("algorithm")
        if algorithm not in _ALGORITHM_KEYS:
            choices = ", ".join(_ALGORITHM_KEYS)
            raise ConfigError(f"{source}: {key}.algorithm must be one of {choices}")
        limit_key, other_key = _ALGORITHM_KEYS[algorithm]
        unknown = set(value) - {"algorithm", "mode", "term", limit_key, other_key}
        if unknown:
            raise ConfigError(
                f"{source}: {key}.{sorted(unknown)[0]} is not a setting of {algorithm} "
                f"(it takes {limit_key} and {other_key})"
            )
        for needed in (limit_key, other_key):
            if needed not in value:
                raise ConfigError(f"{source}: {key} needs `{needed}` ({algorithm})")
        bound = MAX_LOG_LIMIT if algorithm == "sliding_log" else _I64[1]
        limit = _integer(value[limit_key], f"{key}.{limit_key}", source, (1, bound))
        mode = value.get("mode", "exact")
        if mode not in MODES:
            raise ConfigError(f"{source}: {key}.mode must be one of {', '.join(MODES)}")
        if mode == "lease" and algorithm not in LEASE_ALGORITHMS:
            raise ConfigError(
                f"{source}: {key}: mode lease takes {', '.join(LEASE_ALGORITHMS)}, not "
                f"{algorithm} (its rule is about when each admission happened)"
            )
        if "term" in value and mode != "lease":
            raise ConfigError(f"{source}: {key}.term is a setting of mode lease only")
        term = _duration(value, "term", DEFAULT_TERM, source, prefix=key)
        if other_key == "rate":
            rate = value["rate"]
            if isinstance(rate, bool) or not isinstance(rate, int | float) or not rate > 0:
                raise ConfigError(f"{source}: {key}.rate must be a number above 0 (per second)")
            if not math.isfinite(rate):
                raise ConfigError(f"{source}: {key}.rate must be finite")
            config = RateLimiterConfig(algorithm, limit, rate=float(rate), mode=mode, term=term)
        else:
            window = _duration(value, "window", 0.0, source, prefix=key)
            config = RateLimiterConfig(algorithm, limit, window=window, mode=mode, term=term)
        result[name] = config
    return result


def whole_number(text: str, cap: int) -> int | None:
    """`text` as a whole number if it is ASCII digits and nothing else (None if not), at most
    `cap`: a larger one comes back as `cap`. int() alone would take signs, spaces, underscores
    and other scripts' digits, and fails on more than 4,300 digits with an error of its own."""
    if not text.isascii() or not text.isdigit():
        return None
    if len(text) > len(str(cap)):
        return cap
    return min(int(text), cap)


def _integer(value: object, key: str, source: str, bounds: tuple[int, int]) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{source}: {key} must be an integer, found {value!r}")
    if not bounds[0] <= value <= bounds[1]:
        raise ConfigError(f"{source}: {key} is out of range: {value}")
    return value


def _log_level(table: object, source: str) -> str | None:
    stderr = table.get("stderr") if isinstance(table, dict) else None
    if not isinstance(stderr, dict) or "level" not in stderr:
        return None
    level = stderr["level"]
    if not isinstance(level, str) or level.upper() not in LOG_LEVELS:
        choices = ", ".join(LOG_LEVELS)
        raise ConfigError(
            f"{source}: logging.stderr.level must be one of {choices}, found {level!r}"
        )
    return level.upper()


def _cluster(table: object, source: str) -> ClusterConfig:
    if not isinstance(table, dict):
        raise ConfigError(f"{source}: [cluster] must be a table")
    node_id = table.get("node_id")
    if node_id is not None and (not isinstance(node_id, str) or not node_id):
        raise ConfigError(f"{source}: cluster.node_id must be a non-empty string")
    join = table.get("join", [])
    if isinstance(join, str):
        join = [join]
    if not isinstance(join, list) or not all(isinstance(a, str) and a for a in join):
        raise ConfigError(f"{source}: cluster.join must be a list of host:port strings")
    try:
        for entry in join:
            if is_dns_entry(entry):
                parse_dns_entry(entry)
    except AddressError as error:
        raise ConfigError(f"{source}: cluster.join: {error}") from None
    resolver = table.get("resolver")
    if resolver is not None and not isinstance(resolver, str):
        raise ConfigError(f"{source}: cluster.resolver must be an IP:PORT string")
    try:
        if resolver is not None:
            parse_nameserver(resolver)
    except AddressError as error:
        raise ConfigError(f"{source}: cluster.resolver: {error}") from None
    secret = table.get("secret")
    if secret is not None and (not isinstance(secret, str) or not secret):
        raise ConfigError(f"{source}: cluster.secret must be a non-empty string")
    advertise = table.get("advertise")
    if advertise is not None and (not isinstance(advertise, str) or ":" not in advertise):
        raise ConfigError(f"{source}: cluster.advertise must be a host:port string")
    state_dir = table.get("state_dir")
    if state_dir is not None and (not isinstance(state_dir, str) or not state_dir):
        raise ConfigError(f"{source}: cluster.state_dir must be a directory's path")
    return ClusterConfig(
        node_id=node_id,
        join=tuple(join),
        resolver=resolver,
        secret=secret,
        advertise=advertise,
        down_after=_duration(table, "down_after", 3.0, source),
        gossip_interval=_duration(table, "gossip_interval", 0.5, source),
        lease=_duration(table, "lease", None, source),
        cold_start_grace=_duration(table, "cold_start_grace", 0.0, source, zero_ok=True),
        rate_gossip_interval=_duration(table, "rate_gossip_interval", 0.05, source),
        state_dir=state_dir,
    )


def _limits(table: object, source: str) -> Limits:
    if not isinstance(table, dict):
        raise ConfigError(f"{source}: [limits] must be a table")
    limits: dict[str, Any] = {}
    for key, value in table.items():
        if key not in Limits.__dataclass_fields__:
            raise ConfigError(f"{source}: limits.{key} is not a limit")
        default = getattr(Limits, key)
        if isinstance(default, float):
            limits[key] = _duration(table, key, default, source, prefix="limits")
        else:
            limits[key] = _integer(value, f"limits.{key}", source, (1, _I64[1]))
    return Limits(**limits)


def _tls(table: object, source: str) -> TlsConfig:
    """Each setting by itself (a flag may give one alone); how they go together, and whether
    the files hold what they should, node/tls.py checks when the node starts."""
    if not isinstance(table, dict):
        raise ConfigError(f"{source}: [tls] must be a table")
    for key, value in table.items():
        if key not in TlsConfig.__dataclass_fields__:
            raise ConfigError(f"{source}: tls.{key} is not a TLS setting")
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{source}: tls.{key} must be a non-empty string")
    tls = TlsConfig(**table)
    if tls.minimum_version not in TLS_VERSIONS:
        raise ConfigError(
            f"{source}: tls.minimum_version must be one of {', '.join(TLS_VERSIONS)}, "
            f"found {tls.minimum_version!r}"
        )
    return tls


def _auth(table: object, source: str) -> AuthConfig:
    if not isinstance(table, dict):
        raise ConfigError(f"{source}: [auth] must be a table of tokens")
    tokens = {}
    open_routes = None
    for name, value in table.items():
        key = f"auth.{name}"
        if name == "open":
            if not isinstance(value, list) or not set(value) <= set(INFO_ROUTES):
                raise ConfigError(
                    f"{source}: auth.open must be a list of routes among {', '.join(INFO_ROUTES)}"
                )
            open_routes = tuple(value)
            continue
        if not isinstance(value, dict):
            raise ConfigError(f"{source}: {key} must be a table (secret_env or secret_file, ...)")
        if "secret" in value:
            raise ConfigError(
                f"{source}: {key}: a token's secret comes from secret_env or secret_file, so "
                "that the file never holds it"
            )
        for setting in value:
            if setting not in TokenConfig.__dataclass_fields__:
                raise ConfigError(f"{source}: {key}.{setting} is not a token setting")
        if ("secret_env" in value) == ("secret_file" in value):
            raise ConfigError(
                f"{source}: {key} needs its secret from secret_env or secret_file (one of them)"
            )
        where = value.get("secret_env", value.get("secret_file"))
        if not isinstance(where, str) or not where:
            raise ConfigError(f"{source}: {key}'s secret_env or secret_file must be a string")
        scopes = {}
        for scope in ("semaphores", "rate_limits"):
            patterns = value.get(scope, ["*"])
            if not isinstance(patterns, list) or not all(isinstance(p, str) for p in patterns):
                raise ConfigError(f"{source}: {key}.{scope} must be a list of glob patterns")
            scopes[scope] = tuple(patterns)
        for flag in ("read_only", "admin"):
            if not isinstance(value.get(flag, False), bool):
                raise ConfigError(f"{source}: {key}.{flag} must be true or false")
        tokens[name] = TokenConfig(
            secret_env=value.get("secret_env"),
            secret_file=value.get("secret_file"),
            read_only=value.get("read_only", False),
            admin=value.get("admin", False),
            **scopes,
        )
    return AuthConfig(tokens, open_routes)


@overload
def _duration(
    table: dict, key: str, default: float, source: str, zero_ok=..., prefix: str = ...
) -> float: ...
@overload
def _duration(
    table: dict, key: str, default: None, source: str, zero_ok=..., prefix: str = ...
) -> float | None: ...
def _duration(
    table: dict, key: str, default: float | None, source: str, zero_ok=False, prefix="cluster"
) -> float | None:
    value = table.get(key)
    if value is None:
        return default
    if not isinstance(value, str):
        raise ConfigError(f'{source}: {prefix}.{key} must be a duration such as "3s"')
    try:
        seconds = parse_duration(value)
    except DurationError as error:
        raise ConfigError(f"{source}: {prefix}.{key}: {error}") from None
    if seconds <= 0 and not (zero_ok and seconds == 0):
        raise ConfigError(f"{source}: {prefix}.{key} must be longer than zero")
    return seconds


_SECTIONS = {
    "semaphores": _semaphores,
    "rate_limits": _rate_limits,
    "logging": _log_level,
    "cluster": _cluster,
    "limits": _limits,
    "tls": _tls,
    "auth": _auth,
}
