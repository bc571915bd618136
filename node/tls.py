"""TLS for the node's port and for the links it dials, from `[tls]`'s files (README, "Security").

The node's certificate serves clients and the other nodes alike. A link dials with TLS when the
node runs it, verifies the other node's certificate against `ca` (the system's authorities if
none), and shows its own certificate, for the others' `client_ca` if they ask for one. The
cluster's shared secret still proves both ends on top of that (node/links.py).
"""

from __future__ import annotations

import ssl

from .config import ConfigError, TlsConfig

_VERSIONS = {"1.2": ssl.TLSVersion.TLSv1_2, "1.3": ssl.TLSVersion.TLSv1_3}


class Tls:
    """A node's TLS contexts: `server` for the connections it accepts, `client` for the links
    it dials. `reload` makes both again from the same files (on SIGHUP): connections open
    already keep what they began with, new ones get the new."""

    def __init__(self, config: TlsConfig) -> None:
        check(config)
        self.config = config
        self.server, self.client = _contexts(config)

    def reload(self) -> None:
        """Read the files again; on a `ConfigError` the contexts stay as they were."""
        self.server, self.client = _contexts(self.config)


def from_config(config: TlsConfig) -> Tls | None:
    """The node's TLS, or None if it runs none; `ConfigError` if the settings do not go
    together, or a file is missing or holds no certificate or key that fits."""
    check(config)
    return Tls(config) if config.on else None


def check(config: TlsConfig) -> None:
    """How the settings go together (each alone, node/config.py checks)."""
    if (config.certificate is None) != (config.key is None):
        raise ConfigError("[tls] certificate and key go together: give both, or neither")
    for key in ("ca", "client_ca"):
        if getattr(config, key) is not None and not config.on:
            raise ConfigError(f"[tls] {key} needs a certificate and its key")


def _contexts(config: TlsConfig) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    client = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    for context in (server, client):
        context.minimum_version = _VERSIONS[config.minimum_version]
        _load(context.load_cert_chain, "certificate and key", config.certificate, config.key)
    if config.client_ca is not None:
        _load(server.load_verify_locations, "client_ca", config.client_ca)
        server.verify_mode = ssl.CERT_REQUIRED
    if config.ca is not None:
        _load(client.load_verify_locations, "ca", config.ca)
    # The node speaks HTTP/1.1 (hypercorn) and WebSocket over it, nothing else.
    server.set_alpn_protocols(["http/1.1"])
    return server, client


def _load(load, what: str, *paths: str | None) -> None:
    try:
        load(*paths)
    except ssl.SSLError as error:
        why = error.reason or str(error)
        raise ConfigError(f"[tls] {what} ({', '.join(p for p in paths if p)}): {why}") from None
    except OSError as error:
        # ssl's own loads say which error, not which file: the files it could not open do.
        named = [p for p in paths if p]
        unreadable = [error.filename] if error.filename else [p for p in named if not _readable(p)]
        why = error.strerror or str(error)
        files = ", ".join(unreadable or named)
        raise ConfigError(f"[tls] {what}: cannot read {files}: {why}") from None


def _readable(path: str) -> bool:
    try:
        with open(path, "rb"):
            return True
    except OSError:
        return False
