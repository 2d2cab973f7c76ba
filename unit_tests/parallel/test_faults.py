"""A follower rank that dies or hangs ends the whole group with a clear error within the collective timeout,
instead of hanging the driver; later calls fail the same way at once."""

import os
import signal
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
