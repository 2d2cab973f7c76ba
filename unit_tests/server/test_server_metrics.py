"""ServerMetrics: front-side histograms and counters plus worker usage / acceptance read at scrape time; the
output parses with prometheus_client's own parser."""

import pytest
from prometheus_client.parser import text_string_to_metric_families

from lightllm_mtp.config.forced_acceptance import ForcedAcceptance
from lightllm_mtp.server.messages import WorkerStats
from lightllm_mtp.spec_decode.stats import SpecStats
from lightllm_mtp.server.metrics import ServerMetrics, ThroughputMeter


def stats(rank, spec, kv_used=0):
    return WorkerStats(rank=rank, kv_used=kv_used, kv_capacity=100, kv_reserved=0, req_slots_used=1 if kv_used else 0,
                       req_slots_capacity=4, running=0, waiting=0, finished_requests=3, generated_tokens=10,
                       spec=spec)  # fmt: skip


def samples(m):
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(m.render().decode()) for s in f.samples}  # fmt: skip


def test_scrape_parses_and_aggregates_acceptance_over_workers():
    m = ServerMetrics(mtp_step=2)
    first = SpecStats(verify_steps=4, accepted_drafts=3, proposed_at=(4, 2), accepted_at=(2, 1))
    second = SpecStats(verify_steps=6, accepted_drafts=1, proposed_at=(6, 1), accepted_at=(1, 0))
    workers = [stats(0, first, kv_used=25), stats(1, second)]
    m.watch_workers(lambda: workers, lambda: [1, 0])
    m.requests.labels("completions").inc()
    m.on_first_token(0.02)
    m.on_tokens(5)
    m.on_finish("length", 0.3, 0.05, first)
    s = samples(m)
    assert s[("lightllm_mtp_requests_total", (("endpoint", "completions"),))] == 1
    assert s[("lightllm_mtp_requests_finished_total", (("finish_reason", "length"),))] == 1
    assert s[("lightllm_mtp_time_to_first_token_seconds_count", ())] == 1
    assert s[("lightllm_mtp_time_per_output_token_seconds_sum", ())] == pytest.approx(0.05)
    assert s[("lightllm_mtp_generation_tokens_total", ())] == 5
    assert s[("lightllm_mtp_generation_throughput_tokens_per_second", ())] > 0
    assert s[("lightllm_mtp_request_mtp_avg_token_per_step_sum", ())] == pytest.approx(7 / 4)
    assert s[("lightllm_mtp_kv_used_tokens", (("worker", "0"),))] == 25
    assert s[("lightllm_mtp_kv_usage_ratio", (("worker", "0"),))] == 0.25
    assert s[("lightllm_mtp_req_slots_used", (("worker", "1"),))] == 0
    assert s[("lightllm_mtp_outstanding_requests", (("worker", "0"),))] == 1
    assert s[("lightllm_mtp_spec_verify_steps_total", (("worker", "1"),))] == 6
    # all workers: 10 verify steps, 4 accepted drafts -> 1.4 tokens per step; position 1: 3/10, position 2: 1/3
    assert s[("lightllm_mtp_spec_mean_accepted_tokens_per_step", ())] == pytest.approx(1.4)
    assert s[("lightllm_mtp_spec_acceptance_rate", (("position", "1"),))] == pytest.approx(0.3)
    assert s[("lightllm_mtp_spec_acceptance_rate", (("position", "2"),))] == pytest.approx(1 / 3)
    assert s[("lightllm_mtp_spec_accepted_drafts_at_position_total", (("position", "1"), ("worker", "0")))] == 2


def test_without_mtp_there_are_no_spec_metrics():
    m = ServerMetrics(mtp_step=0)
    m.watch_workers(lambda: [stats(0, SpecStats())], lambda: [0])
    names = {name for name, _ in samples(m)}
    assert "lightllm_mtp_kv_used_tokens" in names and not any("spec" in n or "mtp_avg" in n for n in names)


def test_forced_acceptance_is_announced():
    """mtp_force_acceptance (benchmarks: outputs are not the model's): 1 with the setting as its label, and the
    expected accept length; 0 labelled off without it."""
    on = samples(ServerMetrics(mtp_step=3, forced_acceptance=ForcedAcceptance.parse("mean=2.2", 3)))
    assert on[("lightllm_mtp_spec_forced_acceptance", (("setting", "mean=2.2"),))] == 1
    assert on[("lightllm_mtp_spec_forced_accept_length", ())] == pytest.approx(2.2)
    off = samples(ServerMetrics(mtp_step=3))
    assert off[("lightllm_mtp_spec_forced_acceptance", (("setting", "off"),))] == 0
    assert not any(name == "lightllm_mtp_spec_forced_accept_length" for name, _ in off)


def test_spec_counts_add_and_rates():
    a = SpecStats(verify_steps=2, accepted_drafts=1, proposed_at=(2,), accepted_at=(1,))
    total = a + SpecStats(verify_steps=3, accepted_drafts=2, proposed_at=(3, 2), accepted_at=(2, 0))
    assert total == SpecStats(verify_steps=5, accepted_drafts=3, proposed_at=(5, 2), accepted_at=(3, 0))
    assert total.tokens_per_step == pytest.approx(8 / 5) and total.acceptance_per_position == [0.6, 0.0]
    assert SpecStats().tokens_per_step == 0.0


def test_throughput_meter_window(monkeypatch):
    now = [100.0]
    monkeypatch.setattr("lightllm_mtp.server.metrics.time.monotonic", lambda: now[0])
    meter = ThroughputMeter(window_s=10.0)
    meter.add(50)
    now[0] = 105.0
    assert meter.rate() == pytest.approx(10.0)  # 50 tokens over the 5 s since start
    now[0] = 120.0
    assert meter.rate() == 0.0
