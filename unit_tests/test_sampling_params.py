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
