"""The node's actors and shells (`node/`), in one process: no node processes."""
