"""Incremental detokenization equals one full decode, however the tokens are chunked; stop strings cut the text
and are never streamed, not even in part; the token ids and completion_tokens end with the token that completes a
stop string, even inside a step of several MTP tokens."""

import random

import pytest
from transformers import AutoTokenizer

from lightllm_mtp.engine.detokenizer import IncrementalDetokenizer

TEXT = "def add(a, b):\n    return a + b  # héllo wörld, ✓ 日本語 — ok\n\nprint(add(1, 2))\n"


@pytest.fixture(scope="module")
def tokenizer(tiny_dense_dir):
    return AutoTokenizer.from_pretrained(str(tiny_dense_dir))


def stream(tokenizer, ids, stop=(), seed=0, prompt=()):
    rng = random.Random(seed)
    detok, pieces, i = IncrementalDetokenizer(tokenizer, list(prompt), stop), [], 0
    while i < len(ids):
        n = rng.randint(1, 3)  # MTP steps bring 1..k+1 tokens
        pieces.append(detok.push(ids[i : i + n], final=i + n >= len(ids)))
        i += n
    return pieces, detok


@pytest.mark.parametrize("seed", range(4))
def test_chunked_pushes_equal_a_full_decode(tokenizer, seed):
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pieces, detok = stream(tokenizer, ids + [eos], seed=seed, prompt=tokenizer.encode("# a prompt\n"))
    assert "".join(pieces) == tokenizer.decode(ids, skip_special_tokens=True) == TEXT
    assert not any("\ufffd" in p for p in pieces)  # multi-byte characters are held until complete
    assert not detok.stopped


@pytest.mark.parametrize("seed", range(3))
def test_stop_strings_cut_before_the_stop(tokenizer, seed):
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    pieces, detok = stream(tokenizer, ids, stop=("print", "return a"), seed=seed)
    assert detok.stopped
    assert "".join(pieces) == TEXT[: TEXT.index("return a")]  # the earliest stop string wins
    assert not any("ret" in p for p in pieces)
    # after the stop nothing more comes out
    assert detok.push(tokenizer.encode(" more", add_special_tokens=False), final=True) == ""


def test_text_that_only_looks_like_a_stop_prefix_is_released(tokenizer):
    detok = IncrementalDetokenizer(tokenizer, [], ("ab!",))
    out = [detok.push(tokenizer.encode(t, add_special_tokens=False), final=False) for t in ["x a", "b", "c"]]
    assert "".join(out) == "x abc" and out[0] == "x " and out[1] == ""  # "ab" held: it may start "ab!"
    assert detok.push([], final=True) == ""


def test_held_back_text_is_the_longest_tail_that_may_begin_a_stop_string(tokenizer):
    """Against every tail length, on random texts and stop strings over a small alphabet (many partial matches)."""
    rng = random.Random(0)
    for _ in range(2000):
        stops = tuple("".join(rng.choice("ab\n") for _ in range(rng.randint(1, 6))) for _ in range(rng.randint(1, 4)))
        detok = IncrementalDetokenizer(tokenizer, [], stops)
        detok.text = "".join(rng.choice("ab\n") for _ in range(rng.randint(0, 12)))
        expected = max((n for n in range(1, len(detok.text) + 1) for s in stops
                        if n < len(s) and s.startswith(detok.text[-n:])), default=0)  # fmt: skip
        assert detok._held_back() == expected, (stops, detok.text)


def test_long_stop_strings_cost_little_per_step(tokenizer):
    """The longest stop strings a request may send (4 x 1024 characters) against a long output: a step's check
    compares only the tails that start like a stop string (every tail length: ~1M character comparisons a step)."""
    import time

    from lightllm_mtp.sampling_params import MAX_STOP_STRING_CHARS

    stops = tuple(c * (MAX_STOP_STRING_CHARS - 1) + "!" for c in "wxyz")
    detok = IncrementalDetokenizer(tokenizer, [], stops)
    detok.text = "ab " * 20_000
    started = time.perf_counter()
    for _ in range(200):
        assert detok._held_back() == 0
    assert (time.perf_counter() - started) / 200 < 2e-4  # every tail length: ~1.7 ms


def test_a_step_that_completes_a_stop_string_keeps_only_its_tokens_up_to_it(tokenizer):
    """An MTP step brings several tokens; the output (token ids, completion_tokens) ends with the token that
    completes the stop string, as when tokens come one at a time."""
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    text_before = [tokenizer.decode(ids[:j]) for j in range(len(ids) + 1)]
    stop_at = next(j for j in range(len(ids) + 1) if "return a" in text_before[j])  # the completing token
    for start in range(max(0, stop_at - 3), stop_at):  # the step holds the completing token and tokens after it
        detok = IncrementalDetokenizer(tokenizer, [], ("return a",))
        first = detok.push(ids[:start], final=False)
        assert detok.used == start
        step = ids[start : stop_at + 3]
        rest = detok.push(step, final=False)
        assert detok.stopped and detok.used == stop_at - start
        assert first + rest == TEXT[: TEXT.index("return a")]
        assert detok.push(ids[stop_at + 3 :], final=True) == "" and detok.used == 0
    without_stop = IncrementalDetokenizer(tokenizer, [])
    without_stop.push(ids[:5], final=False)
    assert without_stop.used == 5


def test_the_front_counts_and_returns_only_the_tokens_up_to_a_stop_string(tokenizer):
    """EngineClient._advance: a worker step of several tokens that completes a stop string yields the ids up to the
    completing token, and completion_tokens counts those (the worker is told to abort; its last delta ends the
    stream)."""
    from types import SimpleNamespace

    from lightllm_mtp.server.engine_client import EngineClient, RequestStream
    from lightllm_mtp.server.messages import TokenDelta

    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    stop_at = next(j for j in range(len(ids) + 1) if "return a" in tokenizer.decode(ids[:j]))
    sent, done = [], []
    client = object.__new__(EngineClient)
    client.metrics = SimpleNamespace(on_first_token=lambda s: None, on_tokens=lambda n: None,
                                     on_finish=lambda *a: done.append(a))  # fmt: skip
    client.pool = SimpleNamespace(send=lambda rank, msg: sent.append(msg))
    client.router = SimpleNamespace(done=lambda rank: None)
    stream = RequestStream(7, 0, [], None, IncrementalDetokenizer(tokenizer, [], ("return a",)))
    client._streams = {7: stream}
    first = client._advance(stream, TokenDelta(7, ids[: stop_at - 1]), 0.0)
    step = client._advance(stream, TokenDelta(7, ids[stop_at - 1 : stop_at + 2]), 0.0)  # completes it at its first
    assert first.token_ids + step.token_ids == ids[:stop_at] and step.num_output_tokens == stop_at
    assert first.text + step.text == TEXT[: TEXT.index("return a")] and sent  # the worker is told to stop
    last = client._advance(stream, TokenDelta(7, ids[stop_at + 2 : stop_at + 4], "length"), 0.0)
    assert last.token_ids == [] and last.finish_reason == "stop" and last.num_output_tokens == stop_at and done


def test_an_empty_final_push_releases_held_text(tokenizer):
    """An answer that ends inside a multi-byte character (its bytes held back, waiting for the rest): the last,
    empty push releases what there is, with stop strings set or not."""
    ids = tokenizer.encode("ok ✓ 日本", add_special_tokens=False)
    cut = next(j for j in range(1, len(ids)) if tokenizer.decode(ids[:j]).endswith("\ufffd"))
    for stop in ((), ("zz",)):
        detok = IncrementalDetokenizer(tokenizer, [], stop)
        out = "".join(detok.push([t], final=False) for t in ids[:cut])
        assert out + detok.push([], final=True) == tokenizer.decode(ids[:cut])


def stop_with_min_tokens(tokenizer, ids, stops, min_tokens):
    """The oracle, by full decodes: the first prefix of the output whose text holds a stop string ending past the
    text of its first min_tokens tokens cuts there (the earliest such stop string of that prefix)."""
    protected = len(tokenizer.decode(ids[:min_tokens]))
    for k in range(min_tokens + 1, len(ids) + 1):
        text = tokenizer.decode(ids[:k])
        found = ((text.find(s, max(0, protected - len(s) + 1)), s) for s in stops)
        hits = [(i, len(s)) for i, s in found if i >= 0]
        if hits:
            return text[: min(hits)[0]], k
    return tokenizer.decode(ids), len(ids)


def test_min_tokens_holds_back_stop_strings(tokenizer):
    """vLLM's rule: a stop string inside the first min_tokens tokens' text does not end the request; one that ends
    after it does (also one that starts inside it). Against full decodes, pushed in MTP-like steps of 1..3 tokens."""
    rng = random.Random(0)
    ids = tokenizer.encode("ab a\nb ba ab\n" * 4, add_special_tokens=False)
    cut_later = 0
    for trial in range(300):
        stops = tuple("".join(rng.choice("ab \n") for _ in range(rng.randint(1, 4))).strip() or "a"
                      for _ in range(rng.randint(1, 3)))  # fmt: skip
        min_tokens = rng.randint(0, len(ids))
        detok = IncrementalDetokenizer(tokenizer, [], stops, min_tokens=min_tokens)
        out, kept, at = "", 0, 0
        while at < len(ids) and not detok.stopped:
            n = rng.randint(1, 3)
            out += detok.push(ids[at : at + n], final=at + n >= len(ids))
            kept, at = kept + detok.used, at + n
        expected, expected_kept = stop_with_min_tokens(tokenizer, ids, stops, min_tokens)
        assert (out, kept) == (expected, expected_kept), (stops, min_tokens)
        cut_later += len(expected) > len(stop_with_min_tokens(tokenizer, ids, stops, 0)[0])
    assert cut_later > 50  # min_tokens moved the cut in many trials
