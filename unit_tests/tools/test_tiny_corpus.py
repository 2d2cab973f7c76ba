"""The standard-library corpus: deterministic order, a held-out split by path hash, held-out prompts."""

import zlib

import pytest

from lightllm_mtp.tools.tiny_corpus import HELDOUT_EVERY, heldout_prompts, is_heldout, read_stdlib, split_corpus


@pytest.fixture(scope="module")
def corpus():
    return split_corpus()


def test_split_is_by_path_hash_disjoint_and_sorted(corpus):
    train, heldout = [f.path for f in corpus.train], [f.path for f in corpus.heldout]
    assert not set(train) & set(heldout)
    assert all(is_heldout(p) for p in heldout) and not any(is_heldout(p) for p in train)
    assert all(zlib.crc32(p.encode()) % HELDOUT_EVERY == 0 for p in heldout)
    assert train == sorted(train) and heldout == sorted(heldout)
    assert 0.01 < len(heldout) / (len(train) + len(heldout)) < 0.1
    assert not any(p.startswith("encodings/") or "site-packages" in p for p in train + heldout)
    assert "os.py" in train + heldout and corpus.num_chars[0] > 10 * corpus.num_chars[1] > 0


def test_caps_stop_after_the_file_that_reaches_them():
    files = read_stdlib("*.py", max_chars=50_000)
    sizes = [len(f.text) for f in files]
    assert sum(sizes) >= 50_000 > sum(sizes[:-1]) and all("/" not in f.path for f in files)
    small = split_corpus(max_train_chars=30_000, max_heldout_chars=20_000)
    assert small.num_chars[0] < 30_000 + max(len(f.text) for f in small.train)
    assert small.heldout and small.train


def test_heldout_prompts_start_at_a_line_mid_file(corpus, tiny_dense_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_dense_dir)
    prompts = heldout_prompts(tokenizer, corpus.heldout, 5, 64)
    assert len(prompts) == 5 and all(len(ids) == 64 for _, ids in prompts)
    texts = {f.path: f.text for f in corpus.heldout}
    for path, ids in prompts:
        text = texts[path]
        start = text.find("\n", len(text) // 3) + 1
        assert text[start:].startswith(tokenizer.decode(ids[:8]))
    with pytest.raises(RuntimeError, match="held-out files"):
        heldout_prompts(tokenizer, corpus.heldout[:2], 5, 64)
    # two a file: the second past half of it; two files give four
    pairs = heldout_prompts(tokenizer, corpus.heldout, 4, 64, per_file=2)
    assert [p for p, _ in pairs[:2]] == [prompts[0][0]] * 2 and pairs[0][1] != pairs[1][1]
    text = texts[pairs[1][0]]
    assert text[text.find("\n", len(text) // 2) + 1 :].startswith(tokenizer.decode(pairs[1][1][:8]))
