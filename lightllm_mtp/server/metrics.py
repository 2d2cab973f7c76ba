"""Prometheus metrics of the server (`/metrics`), on a registry of their own, all prefixed `lightllm_mtp_`.

Front-side (updated as outputs arrive): request counts, TTFT / TPOT / duration histograms, token counters,
generation throughput over a sliding window, per-request MTP tokens per step. Worker-side (read from each
worker's latest `WorkerStats` at scrape time): KV and request-slot usage, queue lengths, MTP acceptance
(mean accepted tokens per verify step, acceptance rate per draft position), per replica and overall. With MTP, the
forced-acceptance setting of benchmarks (`--mtp_force_acceptance`: drafts accepted unchecked) is a labelled gauge.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from lightllm_mtp.config.forced_acceptance import ForcedAcceptance
from lightllm_mtp.server.messages import WorkerStats
from lightllm_mtp.spec_decode.stats import SpecStats

PREFIX = "lightllm_mtp"
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)


class ThroughputMeter:
    """Tokens per second over the last `window_s` seconds."""

    def __init__(self, window_s: float = 10.0):
        self.window_s = window_s
        self.started = time.monotonic()
        self._events: deque[tuple[float, int]] = deque()
        self._lock = threading.Lock()

    def add(self, n: int) -> None:
        with self._lock:
            self._events.append((time.monotonic(), n))

    def rate(self) -> float:
        now = time.monotonic()
        with self._lock:
            while self._events and self._events[0][0] < now - self.window_s:
                self._events.popleft()
            total = sum(n for _, n in self._events)
        return total / max(min(self.window_s, now - self.started), 1e-3)


class ServerMetrics:
    def __init__(self, mtp_step: int, forced_acceptance: ForcedAcceptance | None = None):
        self.registry = r = CollectorRegistry()
        p = PREFIX
        self.requests = Counter(f"{p}_requests", "Generation requests accepted, by endpoint", ["endpoint"], registry=r)
        self.finished = Counter(f"{p}_requests_finished", "Requests ended, by finish reason", ["finish_reason"],
                                registry=r)
        self.rejected = Counter(f"{p}_requests_rejected", "Requests answered with an error, by HTTP status",
                                ["status"], registry=r)
        self.body_disconnects = Counter(f"{p}_request_body_disconnects", "Clients that closed the connection while "
                                        "their request body was being read (not errors)", registry=r)
        self.prompt_tokens = Counter(f"{p}_prompt_tokens", "Prompt tokens of accepted requests", registry=r)
        self.generation_tokens = Counter(f"{p}_generation_tokens", "Tokens generated", registry=r)
        self.ttft = Histogram(f"{p}_time_to_first_token_seconds", "Arrival to first generated token",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.tpot = Histogram(f"{p}_time_per_output_token_seconds",
                              "Per request: (last token time - first token time) / (tokens - 1)",
                              buckets=TPOT_BUCKETS, registry=r)
        self.duration = Histogram(f"{p}_request_duration_seconds", "Arrival to last token", buckets=LATENCY_BUCKETS,
                                  registry=r)
        self.meter = ThroughputMeter()
        Gauge(f"{p}_generation_throughput_tokens_per_second", "Tokens generated per second over the last 10 s",
              registry=r).set_function(self.meter.rate)
        self.mtp_step = mtp_step
        if mtp_step:  # LightLLM's lightllm_request_mtp_avg_token_per_step: one observation per ended request
            self.request_tokens_per_step = Histogram(
                f"{p}_request_mtp_avg_token_per_step", "Per request: tokens emitted per verify step (accepted + 1)",
                buckets=tuple(1.0 + i / 10 for i in range(10 * mtp_step + 1)), registry=r)
            # benchmarking's mtp_force_acceptance: 1 with the setting as a label when drafts are accepted unchecked
            forced = Gauge(f"{p}_spec_forced_acceptance", "1: drafts are accepted without checking at this setting "
                           "(mtp_force_acceptance, benchmarks only: outputs are not the model's); 0: off",
                           ["setting"], registry=r)  # fmt: skip
            forced.labels(forced_acceptance.setting if forced_acceptance else "off").set(1 if forced_acceptance else 0)
            if forced_acceptance is not None:
                Gauge(f"{p}_spec_forced_accept_length", "Expected tokens per verify step (accepted drafts + 1) of the "
                      "forced acceptance", registry=r).set(forced_acceptance.mean_accept_length)  # fmt: skip

    def watch_workers(self, stats: Callable[[], list[WorkerStats]], outstanding: Callable[[], list[int]]) -> None:
        self._collector = WorkerCollector(stats, outstanding, self.mtp_step)
        self.registry.register(self._collector)

    def on_first_token(self, ttft_s: float) -> None:
        self.ttft.observe(ttft_s)

    def on_tokens(self, n: int) -> None:
        self.generation_tokens.inc(n)
        self.meter.add(n)

    def on_finish(self, reason: str, duration_s: float, tpot_s: float | None, spec: SpecStats | None) -> None:
        self.finished.labels(reason).inc()
        self.duration.observe(duration_s)
        if tpot_s is not None:
            self.tpot.observe(tpot_s)
        if self.mtp_step and spec is not None and spec.verify_steps:
            self.request_tokens_per_step.observe(spec.tokens_per_step)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class WorkerCollector:
    """Gauges and counters read from the workers' latest stats at scrape time."""

    def __init__(self, stats: Callable[[], list[WorkerStats]], outstanding: Callable[[], list[int]], mtp_step: int):
        self.stats = stats
        self.outstanding = outstanding
        self.mtp_step = mtp_step

    def collect(self):
        stats = self.stats()
        p = PREFIX

        def gauge(name: str, doc: str, value: Callable[[WorkerStats], float]) -> GaugeMetricFamily:
            g = GaugeMetricFamily(f"{p}_{name}", doc, labels=["worker"])
            for s in stats:
                g.add_metric([str(s.rank)], value(s))
            return g

        yield gauge("kv_used_tokens", "KV pool token slots held by requests", lambda s: s.kv_used)
        yield gauge("kv_capacity_tokens", "KV pool token slots", lambda s: s.kv_capacity)
        yield gauge("kv_usage_ratio", "kv_used_tokens / kv_capacity_tokens", lambda s: s.kv_used / s.kv_capacity)
        yield gauge("kv_cached_tokens", "KV slots owned by the prefix cache", lambda s: s.kv_cached)
        yield gauge("prefix_cache_hit_rate", "Prompt tokens served from the prefix cache / prompt tokens, since start",
                    lambda s: s.cache_cached_tokens / s.cache_prompt_tokens if s.cache_prompt_tokens else 0.0)
        yield gauge("prefix_cache_cached_tokens", "Prompt tokens served from the prefix cache, since start",
                    lambda s: s.cache_cached_tokens)
        yield gauge("prefix_cache_hits", "Requests that resumed from a cached prefix, since start",
                    lambda s: s.cache_hits)
        yield gauge("prefix_cache_snapshots", "GDN state snapshot slots in use", lambda s: s.cache_snapshots)
        yield gauge("prefix_cache_snapshot_capacity", "GDN state snapshot slots", lambda s: s.cache_snapshot_capacity)
        yield gauge("prefix_cache_host_snapshots", "Snapshots offloaded to the pinned host tier",
                    lambda s: s.cache_host_snapshots)
        yield gauge("prefix_cache_host_fetches", "Offloaded snapshots fetched back for a hit, since start",
                    lambda s: s.cache_host_fetches)
        yield gauge("kv_reserved_tokens", "KV slots reserved for running requests", lambda s: s.kv_reserved)
        yield gauge("req_slots_used", "Request (and linear-state) slots held", lambda s: s.req_slots_used)
        yield gauge("req_slots_capacity", "Request slots", lambda s: s.req_slots_capacity)
        yield gauge("running_requests", "Requests admitted by the worker's scheduler", lambda s: s.running)
        yield gauge("waiting_requests", "Requests queued in the worker's scheduler", lambda s: s.waiting)
        out = GaugeMetricFamily(f"{p}_outstanding_requests", "Requests routed to the worker, not ended",
                                labels=["worker"])
        for rank, n in enumerate(self.outstanding()):
            out.add_metric([str(rank)], n)
        yield out
        done = CounterMetricFamily(f"{p}_worker_finished_requests", "Requests the worker ended", labels=["worker"])
        for s in stats:
            done.add_metric([str(s.rank)], s.finished_requests)
        yield done
        if not self.mtp_step:
            return
        yield from self._spec(stats)

    def _spec(self, stats: list[WorkerStats]):
        p = PREFIX
        steps = CounterMetricFamily(f"{p}_spec_verify_steps", "MTP verify steps", labels=["worker"])
        accepted = CounterMetricFamily(f"{p}_spec_accepted_drafts", "Draft tokens accepted", labels=["worker"])
        labels = ["worker", "position"]
        proposed_at = CounterMetricFamily(f"{p}_spec_proposed_drafts_at_position", "Drafts verified", labels=labels)
        accepted_at = CounterMetricFamily(f"{p}_spec_accepted_drafts_at_position", "Drafts accepted", labels=labels)
        at_k = CounterMetricFamily(f"{p}_spec_verify_steps_at_k", "Verify steps by the drafts their blocks were "
                                   "opened for (the chosen k under --mtp_adaptive)", labels=["worker", "k"])
        total = SpecStats()
        for s in stats:
            w = str(s.rank)
            steps.add_metric([w], s.spec.verify_steps)
            accepted.add_metric([w], s.spec.accepted_drafts)
            for j in range(self.mtp_step):
                proposed_at.add_metric([w, str(j + 1)], _at(s.spec.proposed_at, j))
                accepted_at.add_metric([w, str(j + 1)], _at(s.spec.accepted_at, j))
            for k in range(self.mtp_step + 1):
                at_k.add_metric([w, str(k)], _at(s.spec.steps_at_k, k))
            total = total + s.spec
        yield from (steps, accepted, proposed_at, accepted_at, at_k)
        yield GaugeMetricFamily(f"{p}_spec_mean_accepted_tokens_per_step",
                                "Tokens emitted per verify step (accepted drafts + 1), all workers",
                                value=total.tokens_per_step)
        rate = GaugeMetricFamily(f"{p}_spec_acceptance_rate",
                                 "Accepted / verified drafts at each draft position, all workers", labels=["position"])
        rates = total.acceptance_per_position
        for j in range(self.mtp_step):
            rate.add_metric([str(j + 1)], rates[j] if j < len(rates) else 0.0)
        yield rate


def _at(values: tuple[int, ...], j: int) -> int:
    return values[j] if j < len(values) else 0
