"""The static benchmark's KV pool admits its largest batch whole under MTP k = 1..7 (the scheduler's reservation:
tokens up to max_model_len plus the runner's lookahead), a real run at B=4, k=3 times full-batch verify steps, and a
batch size that gets no such step says why on the terminal."""

import pytest

from benchmark import static_inference
from benchmark.model_source import kv_pool_tokens
from benchmark.static_generation import GenRecord, why_no_full_step
from lightllm_mtp.engine.request import Request
from lightllm_mtp.engine.scheduler import Scheduler
from lightllm_mtp.engine.step import kv_lookahead_slots
from lightllm_mtp.sampling_params import SamplingParams

INPUT_LEN, OUTPUT_LEN = 1024, 128


def admitted_at_once(batch_size: int, k: int, pool: int, max_model_len: int) -> int:
    """Requests the engine's scheduler admits in its first step with `pool` KV slots, as the MTP engine builds it."""
    scheduler = Scheduler(max_batch_size=batch_size, token_budget=batch_size * INPUT_LEN, kv_capacity=pool,
                          max_model_len=max_model_len, tokens_per_step=k + 1, lookahead_slots=kv_lookahead_slots(k))  # fmt: skip
    for i in range(batch_size):
        params = SamplingParams(max_new_tokens=OUTPUT_LEN, ignore_eos=True)
        scheduler.add(Request(request_id=i, prompt_ids=[7] * INPUT_LEN, params=params))
    scheduler.schedule()
    return len(scheduler.running)


@pytest.mark.parametrize("k", range(1, 8))
@pytest.mark.parametrize("batch_size", [1, 4, 32])
def test_the_pool_admits_every_request_with_its_lookahead(batch_size, k):
    max_model_len = INPUT_LEN + OUTPUT_LEN + k + static_inference.KV_SLACK  # as static_inference sizes it
    pool = kv_pool_tokens(batch_size, max_model_len, k)
    assert admitted_at_once(batch_size, k, pool, max_model_len) == batch_size
    if batch_size > 1 and kv_lookahead_slots(k) > k + static_inference.KV_SLACK:  # k >= 3: lookahead 3(k+1) > k + 8
        # the pool of one max_model_len per request (before this sizing) leaves the last request waiting
        assert admitted_at_once(batch_size, k, batch_size * max_model_len, max_model_len) < batch_size


def test_a_real_run_at_batch_4_k_3_times_full_batch_verify_steps(tiny_dense_dir, tmp_path, capsys):
    out = tmp_path / "x.json"
    r = static_inference.main(["--model_dir", str(tiny_dense_dir), "--device", "cpu", "--batch_sizes", "4",
                               "--input_len", "8", "--output_len", "16", "--mtp_mode", "eagle_with_att",
                               "--mtp_step", "3", "--bw_repeats", "3", "--out", str(out)])  # fmt: skip
    mtp = r["mtp"]["results"][0]
    assert "note" not in mtp, mtp.get("note")
    assert mtp["spec_step"]["n"] >= 1 and mtp["verify_ms"] > 0  # steps in which all 4 requests verified 3 drafts
    max_model_len = r["settings"]["max_model_len"]
    assert r["mtp"]["kv_pool_tokens"] == kv_pool_tokens(4, max_model_len, 3)
    assert r["mtp"]["kv_pool_tokens"] >= 4 * (8 + 16 + kv_lookahead_slots(3))  # Scheduler.kv_need of each request
    assert "no full-batch" not in capsys.readouterr().out


def test_a_batch_size_without_a_full_step_says_why_on_the_terminal(tiny_dense_dir, tmp_path, capsys):
    """output_len 4 at k=3: after the prompt a request has 3 tokens left, a timed verify step needs 2k+2 = 8."""
    r = static_inference.main(["--model_dir", str(tiny_dense_dir), "--device", "cpu", "--batch_sizes", "2",
                               "--input_len", "4", "--output_len", "4", "--mtp_mode", "eagle_with_att",
                               "--mtp_step", "3", "--bw_repeats", "3", "--out", str(tmp_path / "x.json")])  # fmt: skip
    note = r["mtp"]["results"][0]["note"]
    assert note == ("no full-batch verify step with 3 drafts per request: output_len 4 too short: when the last prompt "
                    "was complete a request had 3 tokens left; a timed verify step needs 8")  # fmt: skip
    printed = capsys.readouterr().out
    assert f"bs=2: {note}" in printed


def test_the_reason_names_the_kv_pool_or_the_token_budget():
    scheduler = Scheduler(max_batch_size=4, token_budget=4096, kv_capacity=140, max_model_len=35, tokens_per_step=4,
                          lookahead_slots=kv_lookahead_slots(3))  # fmt: skip
    rec = GenRecord(batch_size=4, max_running=3)
    assert why_no_full_step(rec, scheduler, 8, 16, 3) == (
        "at most 3 of 4 requests ran at once: the KV pool's 140 token slots hold 3 requests of 36 (prompt + output "
        "+ 12 lookahead slots)")  # fmt: skip
    scheduler = Scheduler(max_batch_size=32, token_budget=64, kv_capacity=10**6, max_model_len=35, tokens_per_step=4,
                          lookahead_slots=kv_lookahead_slots(3))  # fmt: skip
    rec = GenRecord(batch_size=32, max_running=32, tokens_left_after_prefill=15)
    assert why_no_full_step(rec, scheduler, 8, 16, 3) == (
        "the step's token budget (64, --chunked_prefill_size) holds 16 blocks of 4 rows, not 32")
    rec = GenRecord(batch_size=32, max_running=20)  # room for all: the first ones ended before the last was admitted
    assert why_no_full_step(rec, scheduler, 8, 2, 0) == (
        "at most 20 of 32 requests ran at once: the first requests finished before the last was admitted (output_len 2 "
        "too short for the chunked prefill of 32 x 8 tokens)")  # fmt: skip
