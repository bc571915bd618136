"""The sluicegate node: actors, the HTTP/ASGI shell, configuration and the command line."""

from importlib.util import find_spec

if find_spec("hypercorn") is None:  # a client-only install
    raise ImportError(
        "the sluicegate node needs its own dependencies: pip install 'sluicegate[node]'"
    )
