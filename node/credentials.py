"""The tokens of `[auth]` with their secrets, read from the environment or from files when the
node starts (never logged, never in the configuration file)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from sluicegate.cluster.auth import SHORTEST_SECRET, Credentials, Token

from .config import AuthConfig, ConfigError, TokenConfig


def from_config(auth: AuthConfig, environ: Mapping[str, str]) -> Credentials | None:
    """The node's credentials, or None if it has no tokens (anyone may do anything, as on
    Throttle); `ConfigError` if a secret cannot be had or is too short."""
    tokens = auth.tokens
    if not tokens:
        return None
    named: dict[bytes, str] = {}
    found = []
    for name, config in tokens.items():
        secret = _secret(name, config, environ)
        if secret in named:
            # A request could not tell the two apart, nor a peer its maker.
            raise ConfigError(f"[auth] {named[secret]} and {name} have the same secret")
        named[secret] = name
        found.append(
            Token(
                name,
                secret,
                semaphores=config.semaphores,
                rate_limits=config.rate_limits,
                read_only=config.read_only,
                admin=config.admin,
            )
        )
    return Credentials(found) if auth.open is None else Credentials(found, auth.open)


def _secret(name: str, config: TokenConfig, environ: Mapping[str, str]) -> bytes:
    if config.secret_env is not None:
        secret = environ.get(config.secret_env, "").strip()
        where = f"the variable {config.secret_env}"
    else:
        assert config.secret_file is not None  # one of the two is given (node/config.py)
        where = f"the file {config.secret_file}"
        try:
            secret = Path(config.secret_file).read_text(encoding="utf-8").strip()
        except OSError as error:
            raise ConfigError(f"[auth] {name}: cannot read {where}: {error.strerror}") from None
        except UnicodeDecodeError:
            raise ConfigError(f"[auth] {name}: {where} is not UTF-8 text") from None
    if len(secret.encode()) < SHORTEST_SECRET:
        raise ConfigError(
            f"[auth] {name}: the secret in {where} must be {SHORTEST_SECRET} bytes or longer"
            + ("" if secret else " (it is empty or unset)")
        )
    return secret.encode()
