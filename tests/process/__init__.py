"""Real node processes on free loopback ports: the HTTP API, clusters, TLS, tokens, deployment."""
