"""SamplingParams validation: bad values fail at construction, before any request starts."""

import math

import pytest

from lightllm_mtp.sampling_params import MIN_TEMPERATURE, SamplingParams


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(temperature=-0.5), "temperature must be a finite number >= 0"),
        (dict(temperature=math.nan), "temperature must be a finite number"),
        (dict(temperature=math.inf), "temperature must be a finite number"),
        (dict(top_p=0.0), "top_p must be in"),
        (dict(top_p=math.nan), "top_p must be in"),
        (dict(top_k=-2), "top_k must be"),
        (dict(max_new_tokens=0), "max_new_tokens must be"),
        (dict(stop_token_ids=[-1]), "stop_token_ids must be"),
    ],
)
def test_bad_values_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_tiny_positive_temperatures_are_raised_to_the_minimum():
    """logits / 1e-45 overflows float32 and would fail the whole batch in sampling."""
    assert SamplingParams(temperature=1e-45).temperature == MIN_TEMPERATURE
    assert SamplingParams(temperature=0.0).greedy and SamplingParams(temperature=0.5).temperature == 0.5


def test_stop_token_ids_are_a_capped_set():
    """Issue 19 item 8: the engine tests every generated token for membership, so the ids are held as a frozenset,
    and at most MAX_STOP_TOKEN_IDS of them are taken (a 1M-entry list slowed a neighbour's stream by 44%)."""
    from lightllm_mtp.sampling_params import MAX_STOP_TOKEN_IDS

    p = SamplingParams(stop_token_ids=[5, 7, 5])
    assert isinstance(p.stop_token_ids, frozenset) and p.stop_token_ids == {5, 7}
    assert len(SamplingParams(stop_token_ids=range(MAX_STOP_TOKEN_IDS)).stop_token_ids) == MAX_STOP_TOKEN_IDS
    with pytest.raises(ValueError, match=f"at most {MAX_STOP_TOKEN_IDS} stop_token_ids"):
        SamplingParams(stop_token_ids=range(MAX_STOP_TOKEN_IDS + 1))
    with pytest.raises(ValueError, match="stop_token_ids must be"):
        SamplingParams(stop_token_ids=[True])


@pytest.mark.parametrize("salt", ["", 7, "x" * 1025, b"bytes"])
def test_cache_salt_is_a_non_empty_bounded_string(salt):
    assert SamplingParams(cache_salt="tenant-a").cache_salt == "tenant-a" and SamplingParams().cache_salt is None
    with pytest.raises(ValueError, match="cache_salt must be a non-empty string"):
        SamplingParams(cache_salt=salt)
