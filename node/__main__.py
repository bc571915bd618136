"""`python -m sluicegate.node`: the node's command line (node/cli.py)."""

import sys

from .cli import main

sys.exit(main())
