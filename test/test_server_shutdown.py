"""SIGTERM with requests in flight (issue 19 item 6): new requests get 503 (and /health says 503 "draining"), running
ones finish within the grace period or fail with an OpenAI error body / a stream error event and [DONE]; the server
exits 0 without tracebacks."""

import json
import signal
import threading
import time

import httpx

from lightllm_mtp.server.launcher import ServerProcess

FLAGS = ["--device", "cpu", "--max_req_total_len", "2048", "--running_max_req_size", "8", "--log_level", "info",
         "--shutdown_grace_s", "2"]  # fmt: skip


def test_sigterm_drains_then_fails_what_is_left(trained_dense_dir, tmp_path):
    server = ServerProcess(["--model_dir", str(trained_dense_dir), *FLAGS], tmp_path / "server.log").start()
    results: dict[str, object] = {}
    body = {"prompt": "def f(x):", "max_tokens": 1500, "temperature": 0, "ignore_eos": True}

    def streamed():
        with httpx.stream("POST", f"{server.url}/v1/completions", json={**body, "stream": True}, timeout=60) as r:
            results["stream"] = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]

    def whole():
        r = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
        results["whole"] = (r.status_code, r.json())

    threads = [threading.Thread(target=f) for f in (streamed, whole)]
    for t in threads:
        t.start()
    time.sleep(1.0)  # both running
    server.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    late = httpx.post(f"{server.url}/v1/completions", json={**body, "max_tokens": 2}, timeout=10)
    assert late.status_code == 503 and late.json()["error"]["code"] == "shutting_down"
    health = httpx.get(f"{server.url}/health", timeout=10)  # issue 35 item 7: not "ok" while new requests get 503
    assert health.status_code == 503 and health.json()["status"] == "draining"
    for t in threads:
        t.join(30)
    assert server.proc.wait(30) == 0
    status, whole_body = results["whole"]
    assert status == 500 and "shutting down" in whole_body["error"]["message"]
    events = results["stream"]
    assert events[-1] == "[DONE]" and "shutting down" in json.loads(events[-2])["error"]["message"]
    log = server.log_path.read_text()
    assert "Traceback" not in log and "draining: 2 requests running" in log
