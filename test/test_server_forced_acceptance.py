"""--mtp_force_acceptance through the real server (CPU, the tiny random checkpoint, --load_format dummy as in a
benchmark at a published shape): announced in the log, /server_info and /metrics; the drafts of random weights, which
real verification almost never accepts, are accepted at the requested mean."""

import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from lightllm_mtp.server.launcher import ServerProcess

FLAGS = ["--device", "cpu", "--max_req_total_len", "256", "--log_level", "warning", "--load_format", "dummy",
         "--mtp_mode", "eagle_with_att", "--mtp_step", "3"]  # fmt: skip


def metrics(server):
    families = text_string_to_metric_families(httpx.get(f"{server.url}/metrics").text)
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families for s in f.samples}


@pytest.fixture(scope="module")
def forced_server(tiny_dense_dir, tmp_path_factory):
    flags = ["--model_dir", str(tiny_dense_dir), *FLAGS, "--mtp_force_acceptance", "mean=2.5"]
    with ServerProcess(flags, tmp_path_factory.mktemp("forced_server") / "server.log") as server:
        yield server
    assert server.proc.returncode == 0, server.log_tail()


def test_the_setting_is_announced_and_applied(forced_server, tiny_dense_dir):
    log = forced_server.log_path.read_text()
    assert "mtp_force_acceptance mean=2.5: drafts are accepted WITHOUT being checked" in log  # the worker's engine
    assert "--mtp_force_acceptance mean=2.5" in log and "outputs are NOT the model's" in log  # the front
    info = httpx.get(f"{forced_server.url}/server_info").json()["mtp_force_acceptance"]
    assert info["setting"] == "mean=2.5" and info["mean_accept_length"] == pytest.approx(2.5)
    assert len(info["rates"]) == 3 and len(set(info["rates"])) == 1
    m = metrics(forced_server)
    assert m[("lightllm_mtp_spec_forced_acceptance", (("setting", "mean=2.5"),))] == 1
    assert m[("lightllm_mtp_spec_forced_accept_length", ())] == pytest.approx(2.5)
    body = {"model": str(tiny_dense_dir), "prompt": [5, 17, 300, 42], "max_tokens": 120, "temperature": 0,
            "ignore_eos": True, "n": 1}  # fmt: skip
    for i in range(4):
        prompt = [5 + i, 17, 300, 42]
        r = httpx.post(f"{forced_server.url}/v1/completions", json={**body, "prompt": prompt}, timeout=120)
        assert r.status_code == 200, r.text
    deadline = time.monotonic() + 15
    while (steps := metrics(forced_server).get(("lightllm_mtp_spec_verify_steps_total", (("worker", "0"),)), 0)) < 100:
        assert time.monotonic() < deadline, steps
        time.sleep(0.2)
    # ~190 verify blocks at mean 2.5 (standard error ~0.08); real verification of random drafts gives ~1.0
    mean = metrics(forced_server)[("lightllm_mtp_spec_mean_accepted_tokens_per_step", ())]
    assert mean == pytest.approx(2.5, abs=0.3)


def test_off_by_default(tiny_dense_dir, tmp_path):
    with ServerProcess(["--model_dir", str(tiny_dense_dir), *FLAGS], tmp_path / "server.log") as server:
        assert httpx.get(f"{server.url}/server_info").json()["mtp_force_acceptance"] is None
        assert metrics(server)[("lightllm_mtp_spec_forced_acceptance", (("setting", "off"),))] == 0
        assert "mtp_force_acceptance" not in server.log_path.read_text()
