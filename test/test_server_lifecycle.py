"""Server process lifecycle (issue 19): model workers never outlive the front, whatever they are doing when it dies."""

import os
import signal
import threading
import time

import httpx
import pytest

from lightllm_mtp.server.launcher import ServerProcess

COMMON = ["--device", "cpu", "--max_req_total_len", "128", "--log_level", "warning"]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (dead, not yet reaped by init) counts as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def wait_gone(pids: list[int], timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


@pytest.mark.parametrize("state", ["idle", "busy"])
def test_workers_exit_when_the_front_is_killed(trained_dense_dir, tmp_path, state):
    flags = ["--model_dir", str(trained_dense_dir), "--dp", "2", "--mtp_mode", "eagle_with_att", "--mtp_step", "2",
             *COMMON]  # fmt: skip
    server = ServerProcess(flags, tmp_path / "server.log").start()
    try:
        pids = httpx.get(f"{server.url}/server_info").json()["worker_pids"]
        assert len(pids) == 2 and all(alive(p) for p in pids)
        if state == "busy":  # streams running on both replicas, their outputs unread once the front is gone

            def stream():
                body = {"prompt": "def f(x):", "max_tokens": 100, "stream": True, "ignore_eos": True}
                try:
                    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=30) as r:
                        for _ in r.iter_lines():
                            pass
                except httpx.HTTPError:
                    pass

            for _ in range(6):
                threading.Thread(target=stream, daemon=True).start()
            time.sleep(1.0)
        os.kill(server.proc.pid, signal.SIGKILL)
        server.proc.wait(10)
        assert wait_gone(pids, timeout_s=10) == [], server.log_tail()
    finally:
        server.stop()
        for p in pids if "pids" in locals() else []:
            if alive(p):
                os.kill(p, signal.SIGKILL)
