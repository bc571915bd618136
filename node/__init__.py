"""The sluicegate node: actors, the HTTP/ASGI shell, configuration and the command line."""
