"""Every message that travels on node links, with its tag. Tags are forever: never reuse one."""

from __future__ import annotations

from sluicegate.cluster.membership import Gossip, MemberState

from .links import HANDSHAKE_MESSAGES
from .wire import Codec

LINK_CODEC = Codec({1: Gossip, 2: MemberState, **HANDSHAKE_MESSAGES})
