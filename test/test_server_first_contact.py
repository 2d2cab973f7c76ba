"""First contact: the server answers as the offline API does (stop strings), and is as fast per token as the main job
on the same CPU (the thread default is the engine's, for every entry point)."""

import json
import os
import re
import subprocess
import sys
import threading
import time

import httpx
import pytest

from lightllm_mtp import LLM, SamplingParams
from lightllm_mtp.__main__ import DEFAULT_PROMPTS
from lightllm_mtp.server.launcher import ServerProcess

TOKENS = 96  # per prompt: long enough that a request's HTTP round trip is not what is measured
FLAGS = ["--device", "cpu", "--max_model_len", "256", "--max_batch_size", "4", "--log_level", "warning"]


def _env_without_thread_pins() -> dict[str, str]:
    """The user's environment: no OMP_NUM_THREADS (the test session pins one thread for itself)."""
    return {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}


@pytest.mark.parametrize("mtp", [[], ["--mtp_mode", "eagle_with_att", "--mtp_step", "2"]], ids=["plain", "mtp"])
def test_offline_stop_strings_equal_the_servers(trained_dense_dir, tmp_path, mtp):
    kwargs = dict(mtp_mode="eagle_with_att", mtp_step=2) if mtp else {}
    llm = LLM(trained_dense_dir, max_model_len=256, max_batch_size=4, **kwargs)
    full = llm.generate(DEFAULT_PROMPTS, SamplingParams(temperature=0.0, max_tokens=32))
    cases = []
    for prompt, out in zip(DEFAULT_PROMPTS, full):
        for stops in ([out.text[10:13]], [out.text[20:22], out.text[5:7]], ["\n"], ["never seen"]):
            cases.append((prompt, [s for s in stops if s]))
    with ServerProcess(["--model_dir", str(trained_dense_dir), *FLAGS, *mtp], tmp_path / "server.log").start() as srv:
        for prompt, stops in cases:
            params = SamplingParams(temperature=0.0, max_tokens=32, stop=stops)
            offline = llm.generate(prompt, params)[0]
            body = {"model": str(trained_dense_dir), "prompt": prompt, "max_tokens": 32, "temperature": 0.0,
                    "stop": stops}  # fmt: skip
            choice = httpx.post(f"{srv.url}/v1/completions", json=body, timeout=60).json()["choices"][0]
            assert (offline.text, offline.finish_reason) == (choice["text"], choice["finish_reason"]), (prompt, stops)
            streamed, reason = "", None
            with httpx.stream("POST", f"{srv.url}/v1/completions", json={**body, "stream": True}, timeout=60) as r:
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        c = json.loads(line[6:])["choices"][0]
                        streamed += c["text"]
                        reason = c.get("finish_reason") or reason
            assert (streamed, reason) == (offline.text, offline.finish_reason), (prompt, stops)


def _main_job_per_token(model_dir, env) -> tuple[int, float]:
    job = subprocess.run([sys.executable, "-m", "lightllm_mtp", "--model_dir", str(model_dir), "--no_mtp",
                          "--max_tokens", str(TOKENS), "--max_model_len", "256"], env=env, capture_output=True, text=True,
                         timeout=300)  # fmt: skip
    assert job.returncode == 0, job.stderr[-2000:]
    tokens, seconds = re.search(r"plain decoding: (\d+) tokens in ([\d.]+) s", job.stdout).groups()
    return int(tokens), float(seconds) / int(tokens)


def test_server_per_token_time_is_the_main_jobs(trained_dense_dir, tmp_path):
    """Both with the thread count a user gets by default; the same three prompts, batched, TOKENS tokens each. The best of
    a few runs on each side, so that other work on a shared machine does not decide the ratio."""
    env = _env_without_thread_pins()
    runs = [_main_job_per_token(trained_dense_dir, env) for _ in range(2)]
    tokens, job_per_token = runs[0][0], min(t for _, t in runs)
    srv = ServerProcess(["--model_dir", str(trained_dense_dir), *FLAGS], tmp_path / "server.log", env=env).start()
    try:
        def batch() -> tuple[int, float]:
            counts = []

            def one(prompt):
                body = {"model": str(trained_dense_dir), "prompt": prompt, "max_tokens": TOKENS, "temperature": 0.0}
                counts.append(httpx.post(f"{srv.url}/v1/completions", json=body, timeout=120).json()["usage"][
                    "completion_tokens"])

            threads = [threading.Thread(target=one, args=(p,)) for p in DEFAULT_PROMPTS]
            start = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            return sum(counts), time.perf_counter() - start

        batch()  # warm-up, as the main job warms up
        timed = [batch() for _ in range(3)]
    finally:
        srv.stop()
    served = timed[0][0]
    server_per_token = min(elapsed / n for n, elapsed in timed)
    ratio = server_per_token / job_per_token
    print(f"per token: server {server_per_token * 1e3:.2f} ms, main job {job_per_token * 1e3:.2f} ms, ratio {ratio:.2f}")
    assert served == tokens
    assert ratio < 1.5
