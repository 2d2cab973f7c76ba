"""A follower rank that dies or hangs ends the whole group with a clear error within the collective timeout,
instead of hanging the driver; later calls fail the same way at once. A second engine beside a live group is
refused (the parallel state is per process)."""

import os
import signal
import threading
import time

import pytest

from lightllm_mtp.engine.parallel.group import ParallelGroupError
from lightllm_mtp.sampling_params import SamplingParams
from unit_tests.parallel.workload import DENSE, engine

TIMEOUT = 4.0


def one_request(eng):
    req = eng.add_request([5, 17, 300, 42], SamplingParams(temperature=0, max_new_tokens=4))
    while eng.has_unfinished():
        eng.step_outputs()
    return req.output_ids


@pytest.mark.parametrize("signal_name,state", [("SIGKILL", "exited with code -9"), ("SIGSTOP", "not answering")])
def test_a_dead_or_hung_rank_ends_the_group(signal_name, state):
    eng = engine(DENSE, {}, tp=2, dist_timeout_s=TIMEOUT)
    follower = eng.parallel_group.procs[0]
    try:
        assert len(one_request(eng)) == 4
        os.kill(follower.pid, getattr(signal, signal_name))
        begin = time.monotonic()
        with pytest.raises(ParallelGroupError) as e:
            one_request(eng)
        assert time.monotonic() - begin < TIMEOUT + 10
        assert "rank 1" in str(e.value) and state in str(e.value) and "dist_timeout_s" in str(e.value)
        follower.join(timeout=10)
        assert not follower.is_alive()  # the driver ended it
        with pytest.raises(ParallelGroupError):
            one_request(eng)
    finally:
        if follower.is_alive():
            follower.kill()
        eng.shutdown()


def test_a_rank_that_cannot_load_fails_the_start_on_every_rank(tmp_path):
    """Every rank reports its start status; one failing rank ends the start with each rank's reason."""
    (tmp_path / "config.json").write_text((DENSE / "config.json").read_text())
    (tmp_path / "model.safetensors").write_bytes(b"not a safetensors file")
    begin = time.monotonic()
    with pytest.raises(ParallelGroupError, match="failed to start: rank 0: WeightLoadError.*rank 1: WeightLoadError"):
        engine(tmp_path, {}, tp=2)
    assert time.monotonic() - begin < 30


def in_thread(call, timeout_s: float) -> dict:
    """call() in a daemon thread: {"error": what it raised, "alive": still running after timeout_s}."""
    result: dict = {}

    def run():
        try:
            call()
        except Exception as e:
            result["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout_s)
    result["alive"], result["thread"] = thread.is_alive(), thread
    return result


@pytest.mark.slow
def test_a_follower_stopped_inside_a_forward_ends_the_group_within_the_timeout():
    """Issue 35 item 2: the step ops went out, then the follower stops; the driver waits in the forward's
    all-reduce on the tp group, which must give up after dist_timeout_s (torch's default for a group is 30 min)."""
    eng = engine(DENSE, {}, tp=2, dist_timeout_s=TIMEOUT)
    follower = eng.parallel_group.procs[0]
    own = eng.runner.runner  # the driver's shard: DriverRunner calls its launch after sending the step's ops
    launch = own.launch

    def stop_follower_then_launch(scheduled, after=None):
        os.kill(follower.pid, signal.SIGSTOP)
        return launch(scheduled, after=after)

    result = {}
    try:
        assert len(one_request(eng)) == 4
        own.launch = stop_follower_then_launch
        begin = time.monotonic()
        result = in_thread(lambda: one_request(eng), TIMEOUT + 20)
        assert not result["alive"], "the driver still waits in the forward's collective"
        assert time.monotonic() - begin < TIMEOUT + 20
        error = result.get("error")
        assert isinstance(error, ParallelGroupError), error
        assert "rank 1 still running (not answering)" in str(error) and "dist_timeout_s" in str(error)
        follower.join(timeout=10)
        assert not follower.is_alive()  # the driver ended it
    finally:
        if follower.is_alive():
            follower.kill()  # a stopped process still takes SIGKILL; the driver's collective then fails at once
        if "thread" in result:
            result["thread"].join(30)
        eng.shutdown()


@pytest.mark.slow
def test_a_one_process_engine_beside_a_live_group_is_refused():
    """Issue 35 item 9: the parallel state is per process. A one-process engine built while a tp=2 engine lives is
    refused with a clear error; one built before it refuses to step (instead of waiting on the tp group's
    all-reduce for good); once the tp engine is shut down a one-process engine runs again."""
    before = engine(DENSE, {})
    assert len(one_request(before)) == 4
    eng = engine(DENSE, {}, tp=2, dist_timeout_s=TIMEOUT)
    try:
        result = in_thread(lambda: one_request(before), TIMEOUT + 20)
        assert not result["alive"], "the one-process engine waits on the tp group's collectives"
        assert isinstance(result.get("error"), RuntimeError) and "live tp=2 x pp=1 group" in str(result["error"])
        with pytest.raises(RuntimeError, match="live tp=2 x pp=1 group.*Shut the other engine down first"):
            engine(DENSE, {})
        assert len(one_request(eng)) == 4  # the tp engine is unharmed
    finally:
        eng.shutdown()
    assert len(one_request(engine(DENSE, {}))) == 4
