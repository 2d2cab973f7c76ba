"""Issue 35 items 1, 2 and 7 on the front's side, in-process (a stand-in pool, a controlled clock): a replica whose
worker is gone, or that is silent with work past the watchdog, goes down; its requests that produced nothing are
served by a live replica, the others fail with the cause; it is restarted; /health and the router see "stalled"
replicas and a draining server."""

import asyncio

import pytest
from transformers import AutoTokenizer

from lightllm_mtp.sampling_params import SamplingParams
from lightllm_mtp.server.engine_client import EngineClient
from lightllm_mtp.server.messages import AddRequest, TokenDelta, WorkerOutput, WorkerReady
from lightllm_mtp.server.metrics import ServerMetrics
from unit_tests.server.stand_in_pool import STALL_S, WATCHDOG_S, StandInPool, stats


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


@pytest.fixture
def setup(trained_dense_dir):
    pool, clock = StandInPool(), Clock()
    client = EngineClient(pool, AutoTokenizer.from_pretrained(str(trained_dense_dir)), ServerMetrics(0))
    client.health.clock = clock
    client.health.last_heard = [clock.now] * 2
    loop = asyncio.new_event_loop()
    client._loop = loop
    yield client, pool, clock, loop
    loop.close()


def run_loop(loop):
    loop.run_until_complete(asyncio.sleep(0))


def deltas(stream, loop):
    run_loop(loop)
    out = []
    while not stream.queue.empty():
        out.append(stream.queue.get_nowait())
    return out


def params():
    return SamplingParams(temperature=0.0, max_new_tokens=4)


def test_a_dead_replicas_unstarted_requests_move_and_started_ones_fail(setup):
    client, pool, clock, loop = setup
    a, b, c = (client.submit([5, 6, 7 + i], params()) for i in range(3))
    assert [a.rank, b.rank, c.rank] == [0, 1, 0]
    client._on_message(WorkerOutput(0, [TokenDelta(c.rid, [42])], stats(0)))  # c has output, a has none
    client._check_workers(ended=[0])  # replica 0's pipe ended: its worker is gone
    assert a.rank == 1 and (1, AddRequest(a.rid, [5, 6, 7], a.params)) in pool.sent
    [*_, last] = deltas(c, loop)
    assert last.finish_reason == "error" and last.error == "model worker 0 died"
    assert pool.restarted == [0] and client.replica_states() == ["restarting", "ok"]
    assert list(client.router.outstanding) == [0, 2]
    client._on_message(WorkerOutput(0, [TokenDelta(a.rid, [1, 2, 3, 4], "length")], stats(0)))  # its last words
    assert deltas(a, loop) == []
    client._on_message(WorkerOutput(1, [TokenDelta(a.rid, [8, 9, 10, 11], "length")], stats(1)))
    assert [d.token_ids for d in deltas(a, loop)] == [[8, 9, 10, 11]] and list(client.router.outstanding) == [0, 1]
    status, body = client.health_report()
    assert status == 200 and body["status"] == "degraded" and body["dead_workers"] == [0]
    client._on_message(WorkerReady(0, "cpu", 128, 1000, (0,), 0, 1, stats(0), follower_pids=(950,)))
    assert client.replica_states() == ["ok", "ok"] and client.follower_pids[0] == (950,)


def test_a_request_moves_once_and_fails_when_no_replica_is_left(setup):
    client, pool, clock, loop = setup
    a = client.submit([5, 6, 7], params())
    client._check_workers(ended=[a.rank])
    moved_to = a.rank
    client._check_workers(ended=[moved_to])
    [last] = deltas(a, loop)
    assert last.finish_reason == "error" and last.error == f"model worker {moved_to} died"
    assert client.health_report()[0] == 503 and client.health_report()[1]["status"] == "error"


def test_a_silent_replica_is_stalled_then_ended_by_the_watchdog(setup):
    client, pool, clock, loop = setup
    a = client.submit([5, 6, 7], params())
    assert a.rank == 0
    clock.now += STALL_S + 0.5  # replica 0 has work and said nothing: stalled; idle replica 1 is fine
    assert client.replica_states() == ["stalled", "ok"]
    status, body = client.health_report()
    assert status == 200 and body["stalled_workers"] == [0]
    b = client.submit([8, 9], params())
    assert b.rank == 1  # the router avoids the stalled replica
    client._on_message(WorkerOutput(0, [], stats(0)))  # a heartbeat: no longer silent
    assert client.replica_states() == ["ok", "ok"]
    clock.now += WATCHDOG_S + 0.5
    client._on_message(WorkerOutput(1, [], stats(1)))  # replica 1 keeps reporting
    client._check_workers()
    run_loop(loop)  # the restart runs on the event loop
    assert pool.killed == [(0, (900,))] and pool.restarted == [0]
    assert a.rank == 1  # nothing produced yet: served by replica 1
    assert client.replica_states() == ["restarting", "ok"]
    client.abort(b)
    c = client.submit([1, 2], params())
    clock.now += WATCHDOG_S + 0.5  # replica 1 silent too now: ended, its started request fails
    client._on_message(WorkerOutput(1, [TokenDelta(c.rid, [3])], stats(1)))
    clock.now += WATCHDOG_S + 0.5
    client._check_workers()
    [*_, last] = deltas(c, loop)
    assert last.finish_reason == "error" and "stopped answering" in last.error and "--worker_watchdog_s" in last.error


def test_a_restart_whose_worker_dies_unreported_is_tried_again(setup):
    client, pool, clock, loop = setup
    client._check_workers(ended=[0])
    run_loop(loop)  # the restart runs on the event loop
    assert pool.restarted == [0] and pool.generations[0] == 1
    pool.gone = [0]  # the new worker died before it reported anything
    client._check_workers(ended=[0])
    run_loop(loop)
    assert pool.restarted == [0, 0] and client.restarts_left[0] == 1


def test_health_while_draining_is_503(setup):
    client, pool, clock, loop = setup
    assert client.health_report() == (200, {"status": "ok", "replicas": ["ok", "ok"]})
    client.draining = True
    assert client.health_report() == (503, {"status": "draining", "replicas": ["ok", "ok"]})
