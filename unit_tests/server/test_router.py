import pytest

from lightllm_mtp.server.router import Router


def test_least_outstanding_with_rotation_on_ties():
    r = Router(3)
    assert [r.pick() for _ in range(6)] == [0, 1, 2, 0, 1, 2]
    r.done(1)
    r.done(1)
    assert r.pick() == 1 and r.pick() == 1  # the emptied replica takes the next two
    assert r.outstanding == [2, 2, 2]
    r.done(2)
    assert r.pick() == 2


def test_done_without_outstanding_is_an_error():
    r = Router(2)
    with pytest.raises(RuntimeError, match="no outstanding request"):
        r.done(0)
