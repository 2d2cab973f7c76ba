"""End to end: the README's main job and the offline API's error handling."""

import os
import subprocess
import sys

import pytest

from lightllm_mtp import LLM, SamplingParams


def test_main_job_runs_on_the_default_checkpoint(tmp_path):
    from lightllm_mtp.tools.default_checkpoint import trained_checkpoint_dir

    env = dict(os.environ, LIGHTLLM_MTP_CACHE_DIR=str(tmp_path / "cache"))
    cmd = [sys.executable, "-m", "lightllm_mtp", "--max_new_tokens", "8"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("=== prompt:") == 3
    assert out.stdout.count("tokens per verify step, acceptance per draft position:") == 3  # MTP by default
    assert "MTP eagle_with_att k=2:" in out.stdout and "plain decoding:" in out.stdout and "tok/s" in out.stdout
    assert "outputs identical" in out.stdout
    trained = trained_checkpoint_dir("qwen3_5")  # shipped: used as is; absent: a random one is built into the cache
    assert f"model: {trained}" in out.stdout if trained else any((tmp_path / "cache").rglob("config.json"))
    assert any((tmp_path / "cache").rglob("config.json")) == (trained is None)


def test_main_job_without_mtp(tmp_path):
    env = dict(os.environ, LIGHTLLM_MTP_CACHE_DIR=str(tmp_path / "cache"))
    cmd = [sys.executable, "-m", "lightllm_mtp", "--max_new_tokens", "4", "--no_mtp"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "plain decoding:" in out.stdout and "verify step" not in out.stdout


@pytest.fixture(scope="module")
def llm(tiny_dense_dir):
    return LLM(tiny_dense_dir, max_model_len=32, max_batch_size=4)


@pytest.mark.parametrize(
    "prompts, match",
    [
        ([[]], "empty prompt"),
        ([[1] * 32], "max_model_len is 32"),
        ([[1, 10**9]], "out of range"),
        ([[1, -1]], "out of range"),
        ([3.5], "a str, a list of token ids or a dict"),  # a TypeError (not a prompt at all)
    ],
)
def test_bad_prompts_raise_before_any_work(llm, prompts, match):
    with pytest.raises(TypeError if prompts == [3.5] else ValueError, match=match):
        llm.generate([[1, 2, 3]] + prompts, SamplingParams(temperature=0.0, max_new_tokens=2))
    assert not llm.engine.has_unfinished()
    out = llm.generate([[1, 2, 3]], SamplingParams(temperature=0.0, max_new_tokens=2, ignore_eos=True))
    assert len(out[0].token_ids) == 2


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(temperature=-0.1), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_k=-2), "top_k"),
        (dict(max_new_tokens=0), "max_new_tokens"),
        (dict(stop_token_ids=[-3]), "stop_token_ids"),
    ],
)
def test_bad_sampling_params(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


def test_text_prompt_stop_tokens_and_max_model_len(llm):
    greedy = SamplingParams(temperature=0.0, max_new_tokens=6, ignore_eos=True)
    first = llm.generate("def add(a, b):", greedy)[0]
    assert len(first.token_ids) == 6 and isinstance(first.text, str)
    # A stop token ends the request right after it is generated (and is kept in token_ids).
    stop = first.token_ids[2]
    cut = llm.generate("def add(a, b):", SamplingParams(temperature=0.0, max_new_tokens=6, stop_token_ids=[stop]))[0]
    assert cut.finish_reason == "stop" and cut.token_ids == first.token_ids[: first.token_ids.index(stop) + 1]
    # Generation stops at max_model_len.
    long = llm.generate([[1] * 28], SamplingParams(temperature=0.0, max_new_tokens=100, ignore_eos=True))[0]
    assert len(long.token_ids) == 4 and long.finish_reason == "length"


def test_seeded_sampling_is_reproducible(llm):
    params = SamplingParams(temperature=1.0, top_p=0.9, top_k=50, max_new_tokens=8, seed=123, ignore_eos=True)
    a = llm.generate([[1, 2, 3], [4, 5]], params)
    b = llm.generate([[4, 5], [1, 2, 3]], params)
    assert a[0].token_ids == b[1].token_ids and a[1].token_ids == b[0].token_ids
