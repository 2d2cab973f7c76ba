"""Chunked prefill of a 64k-token prompt keeps the host's work per chunk flat: scheduling, page-table writes, the
prefix cache's keys, tree insertion and locks touch each chunk's own positions, not the whole prompt so far.

The model's forwards are replaced by stand-ins returning zeros of the right shapes, so that what is timed is the host
work alone (on CPU the forwards would be the device work, which does grow with the context). Two checks: a
deterministic one (the prefix-cache keys made while the prompt is read number about twice its length: the
admission's match, then each position once as its chunk enters the tree, where keying the whole prefix at every chunk
made ~T^2 / (2 x chunk)) and a timing one, with CPU time of this thread, medians and a wide margin against a noisy
shared machine."""

import statistics
import time

import pytest
import torch

import lightllm_mtp.engine.prefix_cache as prefix_cache_module
from lightllm_mtp import LLM, SamplingParams
from lightllm_mtp.common.basemodel.forward_batch import ModelOutput

PROMPT_LEN = 65536
CHUNK = 2048
MODES = {"plain": {}, "eagle": dict(mtp_mode="eagle_with_att", mtp_step=2)}


def stand_in(vocab: int, hidden: int, all_rows: bool = False):
    def forward(batch, *unused):
        n = batch.b_logits_index.shape[0]
        rows = batch.input_ids.shape[0] if all_rows or batch.keep_all_hidden else n
        return ModelOutput(logits=torch.zeros(n, vocab), hidden=torch.zeros(rows, hidden))

    return forward


def prefill_steps(model_dir, mode, monkeypatch) -> tuple[list[float], int]:
    """CPU seconds of each engine step while the prompt is read, and the prefix-cache keys made meanwhile."""
    llm = LLM(model_dir, max_model_len=PROMPT_LEN + 64, max_total_token_num=PROMPT_LEN + 256, max_batch_size=1,
              chunked_prefill_size=CHUNK, rope_scaling={"rope_type": "yarn", "factor": 32,
                                                        "original_max_position_embeddings": 4096},
              **MODES[mode])  # fmt: skip
    engine = llm.engine
    cfg = engine.model_config
    engine.model_runner.forward = stand_in(cfg.vocab_size, cfg.hidden_size)
    proposer = getattr(engine.runner, "proposer", None)
    for module in getattr(proposer, "modules", []):  # the draft passes return h' of every row
        module.forward = stand_in(cfg.vocab_size, cfg.hidden_size, all_rows=True)
    made = []
    key_elements = prefix_cache_module.key_elements
    monkeypatch.setattr(prefix_cache_module, "key_elements", lambda tokens, n, *a: made.append(n) or key_elements(
        tokens, n, *a))  # fmt: skip
    prompt = [(37 * i + 11) % 1500 + 3 for i in range(PROMPT_LEN)]
    req = engine.add_request(prompt, SamplingParams(temperature=0.0, max_new_tokens=1, ignore_eos=True))
    times = []
    while req.in_prefill:
        start = time.thread_time()
        engine.step()
        times.append(time.thread_time() - start)
    keys = sum(made)
    while engine.has_unfinished():
        engine.step()
    return times, keys


@pytest.mark.parametrize("mode", list(MODES))
def test_host_work_per_prompt_chunk_does_not_grow_with_position(tiny_dense_dir, mode, monkeypatch):
    times, keys = prefill_steps(tiny_dense_dir, mode, monkeypatch)
    assert len(times) >= 10  # chunks of 2048 (two per step when the next one is queued before reading this one)
    # the admission's match keys the prompt once, then its chunks each position once (~T^2 / (2 x chunk) = 1M before)
    assert keys <= 2 * PROMPT_LEN + 2 * CHUNK
    third = len(times) // 3
    early, late = statistics.median(times[1 : 1 + third]), statistics.median(times[-third - 1 : -1])
    assert late < 2.0 * early + 0.003, f"host seconds per step grew from {early:.4f} to {late:.4f}: {times}"
