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


def test_the_bound_is_the_longest_token_in_bytes(tokenizer):
    """Byte-level BPE spells one byte per character ('Ġ', 2 UTF-8 bytes as spelled, is one space): the bound is the
    longest token's text in bytes, and that text is one token (the bound is tight)."""
    enc = PromptEncoder(tokenizer, max_model_len=128)
    texts = [tokenizer.decode([i]) for i in range(len(tokenizer))]
    longest = max(texts, key=lambda t: len(t.encode("utf-8")))
    assert enc.max_token_bytes == len(longest.encode("utf-8")) == 53
    assert len(tokenizer.encode(longest, add_special_tokens=False)) == 1
    spaces = " " * 39  # 'Ġ' x 39: 78 bytes as the vocabulary spells it, 39 of text
    assert len(tokenizer.encode(spaces, add_special_tokens=False)) == 1 and enc.min_tokens(spaces) == 1


def _byte_level_bpe():
    from tokenizers import Tokenizer, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE({c: i for i, c in enumerate(alphabet)}, []))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    return tok


def _whitespace_dropping():
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"a": 0, "b": 1, "[UNK]": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return tok, "a" + " " * 100_000 + "b"


def _normalizer_removes_spaces():
    from tokenizers import normalizers

    tok = _byte_level_bpe()
    tok.normalizer = normalizers.Replace(" ", "")
    return tok, "a" + " " * 100_000 + "b"


def _added_token_swallows_whitespace():
    from tokenizers import AddedToken

    tok = _byte_level_bpe()
    tok.add_tokens([AddedToken("<x>", rstrip=True)])
    return tok, "<x>" + " " * 100_000


@pytest.mark.parametrize("build", [_whitespace_dropping, _normalizer_removes_spaces, _added_token_swallows_whitespace])
def test_text_that_fits_is_never_rejected_early(build):
    """100,000 bytes that are one or two tokens: a bytes-per-token bound must not hold against them (none is used
    where the tokenizer drops text; after the normalizer where it shortens it)."""
    from transformers import PreTrainedTokenizerFast

    backend, text = build()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend)
    ids = asyncio.run(PromptEncoder(tok, max_model_len=128).encode(text))
    assert ids == tok.encode(text, add_special_tokens=False) and len(ids) <= 2


def test_chat_text_that_cannot_fit_is_rejected_without_tokenizing(tokenizer):
    """Content parts count as much as plain content: the whole templated prompt is checked before it is encoded."""
    from lightllm_mtp.server.chat_protocol import ChatCompletionRequest

    calls = []

    class Counting:
        def __getattr__(self, name):
            return getattr(tokenizer, name)

        def encode(self, *args, **kwargs):
            calls.append(1)
            return tokenizer.encode(*args, **kwargs)

    enc = PromptEncoder(Counting(), max_model_len=128)
    parts = [{"type": "text", "text": "x" * 500_000}, {"type": "text", "text": "y" * 500_000}]
    for content in ("x" * 1_000_000, parts):
        req = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": content}]})
        with pytest.raises(ApiError) as e:
            asyncio.run(enc.encode_chat(req))
        assert e.value.status == 400 and e.value.code == "context_length_exceeded" and e.value.param == "messages"
    assert not calls
    ok = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}]})
    assert asyncio.run(enc.encode_chat(ok)) and calls


def test_large_bodies_are_parsed_off_the_event_loop(tokenizer, monkeypatch):
    """8 MiB of JSON token ids is ~0.5 s of parsing: bodies over INLINE_PARSE_BYTES are parsed in the pool."""
    from lightllm_mtp.server import request_input
    from lightllm_mtp.server.protocol import CompletionRequest, parse_body

    threads = []

    def recording_parse_body(model, raw):
        threads.append(threading.current_thread().name)
        return parse_body(model, raw)

    monkeypatch.setattr(request_input, "parse_body", recording_parse_body)
    enc = PromptEncoder(tokenizer, max_model_len=128)
    small = b'{"prompt": [1, 2, 3]}'
    large = b'{"prompt": [' + b",".join([b"1"] * request_input.INLINE_PARSE_BYTES) + b"]}"
    assert asyncio.run(enc.parse(CompletionRequest, small)).prompt == [1, 2, 3]
    assert len(asyncio.run(enc.parse(CompletionRequest, large)).prompt) == request_input.INLINE_PARSE_BYTES
    assert threads[0] == threading.main_thread().name and threads[1].startswith("tokenize")


class RecordingNormalizer:
    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def normalize_str(self, text):
        self.calls.append(len(text))
        return self.inner.normalize_str(text)


def test_a_long_text_is_normalized_in_pieces_and_only_as_far_as_it_matters(tokenizer):
    """Issue 35 item 3: 8 MB of text that cannot fit. The normalizer holds the GIL (one call on the whole text stalled
    the event loop for a second): it sees pieces of at most NORMALIZE_PIECE_CHARS, and only until they prove the text
    too long."""
    from lightllm_mtp.server import request_input

    enc = PromptEncoder(tokenizer, max_model_len=128)
    enc.normalizer = recording = RecordingNormalizer(enc.normalizer)
    with pytest.raises(ApiError) as e:
        asyncio.run(enc.encode("x " * 4_000_000))
    assert e.value.code == "context_length_exceeded" and "has at least" in e.value.message
    assert recording.calls and max(recording.calls) <= request_input.NORMALIZE_PIECE_CHARS
    assert sum(recording.calls) <= request_input.NORMALIZE_PIECE_CHARS  # 128 tokens x 53 bytes: one piece


@pytest.mark.parametrize("form", ["NFC", "NFKC"])
def test_the_piecewise_normalized_bound_never_exceeds_the_whole_texts(tokenizer, monkeypatch, form):
    """Cuts every few characters through combining sequences and Hangul jamo (composed across the cut only when the
    text is normalized whole): the pieces' sum less the slack per cut stays a lower bound."""
    import unicodedata

    from tokenizers import normalizers

    from lightllm_mtp.server import request_input

    monkeypatch.setattr(request_input, "NORMALIZE_PIECE_CHARS", 3)
    enc = PromptEncoder(tokenizer, max_model_len=128)
    enc.normalizer = getattr(normalizers, form)()
    rng = random.Random(0)
    alphabet = ["e", "\u0301", "\u0323", "\u1100", "\u1161", "\u11a8", "\u03b1", "\u0313", "\u0345", "ﬁ", " ", "中"]
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40)))
        whole = len(unicodedata.normalize(form, text).encode("utf-8"))
        assert enc._normalized_bytes(text, enough=10**9) <= whole
