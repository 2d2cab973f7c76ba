"""Prompt text: a sound lower bound on its token count rejects what cannot fit before tokenizing, and tokenizing
runs in a worker thread, off the event loop."""

import asyncio
import random
import threading

import pytest
from transformers import AutoTokenizer

from lightllm_mtp.server.protocol import ApiError
from lightllm_mtp.server.request_input import PromptEncoder


@pytest.fixture(scope="module")
def tokenizer(trained_dense_dir):
    return AutoTokenizer.from_pretrained(str(trained_dense_dir))


def test_the_lower_bound_never_exceeds_the_real_token_count(tokenizer):
    enc = PromptEncoder(tokenizer, max_model_len=128)
    rng = random.Random(0)
    alphabet = [" ", "\n", "a", "Z", "0", "_", "é", "中", "😀", "<|im_end|>", "def ", "    ", "\t\t"]
    for _ in range(300):
        text = "".join(rng.choice(alphabet) * rng.randint(1, 40) for _ in range(rng.randint(1, 30)))
        assert enc.min_tokens(text) <= len(tokenizer.encode(text, add_special_tokens=False))


def test_text_that_cannot_fit_is_rejected_without_tokenizing(tokenizer):
    calls = []

    class Counting:
        def __getattr__(self, name):
            return getattr(tokenizer, name)

        def encode(self, *args, **kwargs):
            calls.append(1)
            return tokenizer.encode(*args, **kwargs)

    enc = PromptEncoder(Counting(), max_model_len=128)
    with pytest.raises(ApiError) as e:
        asyncio.run(enc.encode("x" * 1_000_000))
    assert e.value.status == 400 and e.value.code == "context_length_exceeded" and not calls


def test_tokenizing_happens_in_a_worker_thread(tokenizer):
    threads = []

    class Recording:
        def __getattr__(self, name):
            return getattr(tokenizer, name)

        def encode(self, *args, **kwargs):
            threads.append(threading.current_thread().name)
            return tokenizer.encode(*args, **kwargs)

    ids = asyncio.run(PromptEncoder(Recording(), max_model_len=128).encode("def add(a, b):"))
    assert ids == tokenizer.encode("def add(a, b):", add_special_tokens=False)
    assert threads and threads[0].startswith("tokenize") and threads[0] != threading.main_thread().name
