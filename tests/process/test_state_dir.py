"""`[cluster] state_dir`: what a node keeps across its lives (node/state_file.py). A cold start of
the whole cluster goes above the era its members kept, whatever their clocks say, so fencing
tokens rise; a directory the node cannot use is refused at start."""

from __future__ import annotations

import json
import urllib.request

import pytest

from sluicegate.cluster.semaphore_leases import TOKEN_EPOCH_SHIFT
from sluicegate.node.state_file import Kept, StateError, StateFile
from tests.nodes import NodeProcess, cluster_of, is_ready, refusal_to_start, wait_until

SECRET = "state-dir-test-secret-0123456789"
CONFIG = '[semaphores]\nA = 1\n[cluster]\ndown_after = "1s"\ngossip_interval = "200ms"\n'


def test_a_state_file_round_trips_and_refuses_what_it_did_not_write(tmp_path):
    state = StateFile(tmp_path)
    assert state.read() == Kept(0, 0)
    state.write(Kept(7, 11))
    assert state.read() == Kept(7, 11)
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]
    (tmp_path / "state.json").write_text('{"era": -1, "generation": 3}')
    with pytest.raises(StateError, match="not a state file"):
        state.read()
    (tmp_path / "state.json").write_text("{")
    with pytest.raises(StateError, match="cannot read"):
        state.read()
    with pytest.raises(StateError, match="not a directory"):
        StateFile(tmp_path / "missing").check()


def grant_token(url: str) -> int:
    def call(method: str, path: str, body: object) -> tuple[int, str | None, bytes]:
        request = urllib.request.Request(url + path, data=json.dumps(body).encode(), method=method)
        request.add_header("content-type", "application/json")
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.headers.get("sluicegate-fencing-token"), answer.read()

    _, _, body = call("POST", "/new_peer", {"expires_in": "1m"})
    status, token, _ = call("PUT", f"/peers/{int(body)}/A", 1)
    assert status == 200 and token is not None
    call("DELETE", f"/peers/{int(body)}", None)
    return int(token)


@pytest.mark.process
def test_a_cold_start_goes_above_the_era_the_members_kept_though_every_clock_is_behind_it(tmp_path):
    configs = {
        node_id: CONFIG + f'state_dir = "{tmp_path / node_id}"\n' for node_id in ("n1", "n2", "n3")
    }
    for node_id in configs:
        (tmp_path / node_id).mkdir()
    env = {"SLUICEGATE_CLUSTER_SECRET": SECRET}
    with cluster_of(tmp_path, CONFIG, env, configs=configs) as nodes:
        first = wait_until_granted(nodes[0].url)
        era = first >> TOKEN_EPOCH_SHIFT
        kept = [StateFile(tmp_path / n).read() for n in configs]
        assert all(k.era >= era for k in kept), kept
        for node in nodes:
            node.kill()
        # As if the last era had been started by a clock three hours ahead of every one now.
        ahead = era + 3 * 3600 * 1000
        for node_id, k in zip(configs, kept, strict=True):
            StateFile(tmp_path / node_id).write(Kept(ahead, k.generation))
        for node in nodes:
            node.restart()
        wait_until(lambda: all(is_ready(n.url) for n in nodes), 30, "all ready again")
        assert wait_until_granted(nodes[1].url) > (ahead << TOKEN_EPOCH_SHIFT) > first
        assert all(StateFile(tmp_path / n).read().era > ahead for n in configs)


def wait_until_granted(url: str) -> int:
    tokens: list[int] = []

    def granted() -> bool:
        try:
            tokens.append(grant_token(url))
        except OSError:  # 503 while the slot moves
            return False
        return True

    wait_until(granted, 20, "a grant")
    return tokens[-1]


def test_a_state_dir_the_node_cannot_use_is_refused_at_start(tmp_path):
    missing = tmp_path / "missing"
    text = f'[cluster]\nsecret = "{SECRET}"\nstate_dir = "{missing}"\n'
    assert f"cluster.state_dir: {missing} is not a directory" in refusal_to_start(text, tmp_path)


@pytest.mark.process
def test_a_single_node_goes_on_above_the_epoch_it_kept(tmp_path):
    (state := tmp_path / "state").mkdir()
    config = f'[semaphores]\nA = 1\n[cluster]\nstate_dir = "{state}"\n'
    with NodeProcess(config, workdir=tmp_path / "node") as node:
        first = wait_until_granted(node.url)
        assert StateFile(state).read().era == first >> TOKEN_EPOCH_SHIFT
        node.kill()
        ahead = (first >> TOKEN_EPOCH_SHIFT) + 3 * 3600 * 1000
        StateFile(state).write(Kept(ahead, 0))
        node.restart()
        assert wait_until_granted(node.url) > (ahead << TOKEN_EPOCH_SHIFT)
