"""`python -m simulations chaos` end to end: real nodes behind HAProxy, client processes locking
and checking rate limits, SIGKILL and restarts, SIGSTOP and SIGCONT, for a minute; then no
promise may be broken, rate limits included.

The command runs in a session of its own, so that on a timeout here the whole process group
(nodes, HAProxy, clients) is killed, not only the command.
"""

from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from simulations.chaos_client import Journal, read_journal
from simulations.workload import RateSend

pytestmark = pytest.mark.process

ROOT = Path(__file__).resolve().parents[2]
DURATION = 45
# Set-up, the last recovery, stopping and checking come on top of the duration.
TIMEOUT = DURATION + 120


def run_chaos(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "simulations", "chaos", *args]
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate(timeout=10)
        pytest.fail(f"chaos did not end within {TIMEOUT} s:\n{stdout}\n{stderr[-3000:]}")
    finally:
        # Nothing it started may outlive it, whatever happened.
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def summary_field(stdout: str, name: str) -> str:
    match = re.search(rf"^{name} +(.*)$", stdout, re.MULTILINE)
    assert match, f"no {name!r} line in:\n{stdout}"
    return match.group(1)


def test_kills_and_pauses_of_real_nodes_break_no_promise():
    result = run_chaos("--duration", str(DURATION))
    report = f"{result.stdout}\n{result.stderr[-3000:]}"
    assert result.returncode == 0, report
    assert summary_field(result.stdout, "violations") == "0", report
    faults = dict(
        (kind, int(count))
        for kind, count in (
            part.split() for part in summary_field(result.stdout, "faults").split(", ")
        )
    )
    assert set(faults) == {"kill", "pause", "long_pause"}, report
    assert all(count >= 1 for count in faults.values()), report
    operations = int(summary_field(result.stdout, "operations").split()[0])
    assert operations >= 60, report
    # The rate checkers judged answers: requests were sent, and most were answered.
    figures = dict(
        part.rsplit(" ", 1) for part in summary_field(result.stdout, "figures").split(", ")
    )
    sent = int(figures["rate requests sent"])
    assert sent >= 60, report
    assert int(figures["rate requests unanswered"]) < sent / 2, report


def test_a_journal_gives_back_the_rate_requests_as_last_seen():
    out = io.StringIO()
    journal = Journal(out)
    answered = RateSend("c0", "n2", "check", "exact", "k0", 2, 2, (11, 12), sent=100.25)
    unanswered = RateSend("c0", "n1", "wait", "exact", "k1", 1, 1, (13,), sent=100.5)
    journal.rate_sent(answered)
    journal.rate_sent(unanswered)
    journal.rate_answered(
        answered, 100.75, [{"go": True, "remaining": 1}, {"go": False, "remaining": 1}], ""
    )
    journal.note("c0 stopped")

    # A client killed mid-write leaves half a line, which is not read.
    events, sends = read_journal(out.getvalue() + '{"rate_send": 2, "cli')

    assert sends == {0: answered, 1: unanswered}
    assert sends[0].goes == [True, False] and sends[0].remaining == [1, 1]
    assert sends[0].answered == 100.75 and sends[0].retry_ids == (11, 12)
    assert sends[1].answered is None
    assert [e.kind for e in events] == ["rate", "note"]
