"""The members' statuses a node asks for `/status.json?all=1` (node/cluster_status.py): asked at
most once a fresh period, however many pages ask."""

from __future__ import annotations

import trio

from sluicegate.node.cluster_status import FRESH, MemberStatuses


async def test_the_members_are_asked_once_a_fresh_period_however_many_pages_ask(autojump_clock):
    rounds = []

    async def ask(members, me, authorization):
        rounds.append(trio.current_time())
        await trio.sleep(0.3)  # a member slow to answer
        return [{"id": "n2", "status": {"round": len(rounds)}}]

    statuses = MemberStatuses(ask)
    answers = []

    async def page():
        answers.append(await statuses.get([], "n1"))

    async with trio.open_nursery() as nursery:
        for _ in range(50):
            nursery.start_soon(page)
    assert len(rounds) == 1 and len(answers) == 50
    await trio.sleep(FRESH / 2)
    await page()
    assert len(rounds) == 1
    await trio.sleep(FRESH)
    await page()
    assert len(rounds) == 2 and answers[-1][0]["status"] == {"round": 2}
