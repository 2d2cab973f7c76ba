"""Issue 35 on the real server (CPU, loopback): connections that hold the server without a request (idle, slowloris,
slow body), a connection limit, a client leaving mid-body, a replica whose worker is stopped (the watchdog), a
request routed to a worker that dies before it starts. One server, --dp 2, short limits."""

import socket
import threading
import time

import httpx
import pytest

from lightllm_mtp.server.launcher import ServerProcess

HEADER_S, BODY_S, STALL_S, WATCHDOG_S, LIMIT = 1.0, 2.0, 1.0, 5.0, 12
FLAGS = ["--device", "cpu", "--max_req_total_len", "256", "--log_level", "info", "--dp", "2",
         "--header_timeout_s", str(HEADER_S), "--body_timeout_s", str(BODY_S), "--worker_stall_s", str(STALL_S),
         "--worker_watchdog_s", str(WATCHDOG_S), "--limit_concurrency", str(LIMIT)]  # fmt: skip
BODY = {"prompt": "def f(x):", "max_tokens": 8, "temperature": 0}


@pytest.fixture(scope="module")
def server(trained_dense_dir, tmp_path_factory):
    with ServerProcess(["--model_dir", str(trained_dense_dir), *FLAGS],
                       tmp_path_factory.mktemp("reliability") / "server.log") as server:  # fmt: skip
        yield server
    assert server.proc.returncode == 0, server.log_tail()


def connect(server) -> socket.socket:
    sock = socket.create_connection((server.host, server.port), timeout=30)
    sock.settimeout(30)
    return sock


def closed_after(sock: socket.socket, feed=None, limit_s: float = 30.0) -> tuple[float, bytes]:
    """Seconds until the server closes `sock` (what it sent meanwhile); feed(): called every 0.25 s until then."""
    began, got = time.monotonic(), b""
    sock.settimeout(0.25)
    while time.monotonic() - began < limit_s:
        try:
            chunk = sock.recv(65536)
        except socket.timeout:
            if feed is not None:
                try:
                    feed()
                except OSError:
                    return time.monotonic() - began, got
            continue
        except ConnectionResetError:
            return time.monotonic() - began, got
        if not chunk:
            return time.monotonic() - began, got
        got += chunk
    return float("inf"), got


def health(server) -> dict:
    return httpx.get(f"{server.url}/health", timeout=10).json()


def wait_health(server, want, timeout_s: float) -> float:
    began = time.monotonic()
    while not want(health(server)):
        assert time.monotonic() - began < timeout_s, health(server)
        time.sleep(0.05)
    return time.monotonic() - began


def test_idle_and_slowloris_connections_are_closed(server):
    """Item 6: a connection that sends nothing, and one that sends a header line every 0.25 s, are closed once
    --header_timeout_s has passed (uvicorn alone keeps both open for good)."""
    idle, slow = connect(server), connect(server)
    slow.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
    results = {}
    feeder = threading.Thread(target=lambda: results.update(slow=closed_after(slow, lambda: slow.sendall(b"X-a: b\r\n"))))
    feeder.start()
    results["idle"] = closed_after(idle)
    feeder.join()
    for name in ("idle", "slow"):
        seconds, sent = results[name]
        assert HEADER_S - 0.2 < seconds < HEADER_S + 3, (name, seconds)
        assert sent == b"", (name, sent)
    kept = connect(server)  # a connection that sends its request in time is served
    kept.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert closed_after(kept)[1].startswith(b"HTTP/1.1 200")


def test_a_body_that_arrives_too_slowly_gets_408_and_the_connection_closes(server):
    sock = connect(server)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 1000\r\n\r\n{\"prompt\": ")  # fmt: skip
    seconds, sent = closed_after(sock, lambda: sock.sendall(b" "))
    assert BODY_S - 0.2 < seconds < BODY_S + 3 and sent.startswith(b"HTTP/1.1 408"), (seconds, sent[:200])
    assert b"request_timeout" in sent


def test_connections_past_the_limit_get_503(server):
    held = []
    try:
        for _ in range(LIMIT - 1):  # kept-alive connections, each after one answered request: with the next one,
            # LIMIT connections are open
            sock = connect(server)
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            assert sock.recv(65536).startswith(b"HTTP/1.1 200")
            held.append(sock)
        assert httpx.get(f"{server.url}/health", timeout=10).status_code == 503  # uvicorn's "concurrency limit"
    finally:
        for sock in held:
            sock.close()
    time.sleep(0.5)
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200


def metric(server, name: str) -> float:
    total = 0.0
    for line in httpx.get(f"{server.url}/metrics", timeout=10).text.splitlines():
        if line.startswith(name):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_a_client_leaving_mid_body_is_counted_quietly(server):
    """Item 4: no 500 in /metrics, no traceback in the log: one more request_body_disconnects."""
    before = metric(server, "lightllm_mtp_request_body_disconnects_total")
    sock = connect(server)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"prompt\": \"a")
    time.sleep(0.3)
    sock.close()
    deadline = time.monotonic() + 10
    while metric(server, "lightllm_mtp_request_body_disconnects_total") == before:
        assert time.monotonic() < deadline, "the disconnect was not counted"
        time.sleep(0.1)
    assert metric(server, 'lightllm_mtp_requests_rejected_total{status="500"}') == 0
    assert "Traceback" not in server.log_path.read_text() and "ClientDisconnect" not in server.log_path.read_text()


def test_head_health(server):
    assert httpx.head(f"{server.url}/health", timeout=10).status_code == 200


def completions(server, n: int, body=BODY) -> list[httpx.Response]:
    out = [None] * n

    def post(i):
        out[i] = httpx.post(f"{server.url}/v1/completions", json=body, timeout=120)

    threads = [threading.Thread(target=post, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    return out, threads


def test_requests_sent_to_a_worker_that_dies_before_starting_them_are_served_by_the_other(server):
    """Item 7: replica 0's worker is stopped, requests are routed to it (before it counts as stalled), then it is
    killed: the requests it never started are served by replica 1."""
    import os
    import signal

    pid = httpx.get(f"{server.url}/server_info").json()["worker_pids"][0]
    expected = httpx.post(f"{server.url}/v1/completions", json=BODY, timeout=60).json()["choices"][0]["text"]
    os.kill(pid, signal.SIGSTOP)
    out, threads = completions(server, 4)  # two of them to replica 0
    time.sleep(0.3)
    os.kill(pid, signal.SIGKILL)
    for t in threads:
        t.join(120)
    assert [r.status_code for r in out] == [200] * 4, [r.text for r in out]
    assert all(r.json()["choices"][0]["text"] == expected for r in out)
    wait_health(server, lambda h: h["status"] == "ok", 120)


def test_a_stopped_worker_is_reported_stalled_then_ended_by_the_watchdog(server):
    """Items 1 and 2: replica 0's worker stops (SIGSTOP) with a request running: /health names it "stalled" after
    --worker_stall_s and new requests go to replica 1; after --worker_watchdog_s it is killed and restarted, and its
    request fails with the watchdog's error (it had produced tokens) or is served by replica 1."""
    import os
    import signal

    pid = httpx.get(f"{server.url}/server_info").json()["worker_pids"][0]
    long = {**BODY, "max_tokens": 200, "ignore_eos": True}
    out, threads = completions(server, 2, long)  # one on each replica
    time.sleep(0.5)
    os.kill(pid, signal.SIGSTOP)
    began = time.monotonic()
    stalled = wait_health(server, lambda h: h["replicas"][0] == "stalled", 10)
    assert STALL_S - 0.5 < stalled < STALL_S + 3
    assert httpx.post(f"{server.url}/v1/completions", json=BODY, timeout=30).status_code == 200  # replica 1 serves
    wait_health(server, lambda h: h["replicas"][0] in ("dead", "restarting"), WATCHDOG_S + 5)
    assert WATCHDOG_S - 1 < time.monotonic() - began < WATCHDOG_S + 5
    for t in threads:
        t.join(120)
    codes = sorted(r.status_code for r in out)
    assert codes in ([200, 200], [200, 500]), [r.text for r in out]
    if codes == [200, 500]:
        assert "stopped answering" in next(r for r in out if r.status_code == 500).json()["error"]["message"]
    wait_health(server, lambda h: h["status"] == "ok", 120)
    assert httpx.get(f"{server.url}/server_info").json()["worker_pids"][0] != pid
