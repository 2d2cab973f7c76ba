"""mtp_force_acceptance parses once into ForcedAcceptance inside SpecConfig: per-position rates (padded with zeros to
k) or a mean accept length turned into one constant conditional rate; anything else is a clear error."""

import pytest

from lightllm_mtp.config.engine_args import EngineArgs
from lightllm_mtp.config.forced_acceptance import ForcedAcceptance, constant_rate_for_mean, expected_accept_length


def forced(value, k=3, **kwargs):
    args = EngineArgs("m", mtp_mode="eagle_with_att", mtp_step=k, mtp_force_acceptance=value, **kwargs)
    return args.spec.force_acceptance


def test_per_position_rates_are_kept_and_padded_with_zeros():
    f = forced(" 0.8, 0.6 ,0.4 ")
    assert f == ForcedAcceptance("0.8,0.6,0.4", (0.8, 0.6, 0.4))
    assert f.mean_accept_length == pytest.approx(1 + 0.8 + 0.8 * 0.6 + 0.8 * 0.6 * 0.4)
    assert forced("0.9", k=4).rates == (0.9, 0.0, 0.0, 0.0)  # drafts past the list are never accepted
    assert forced("1,1,1").mean_accept_length == 4.0


@pytest.mark.parametrize("k", [1, 2, 3, 5, 7])
@pytest.mark.parametrize("mean", [1.0, 1.3, 2.2, 2.9, 3.7])
def test_mean_accept_length_gives_one_constant_rate_with_that_mean(k, mean):
    if mean > k + 1:
        with pytest.raises(ValueError, match=rf"must be in \[1, {k + 1}\] for mtp_step {k}"):
            forced(f"mean={mean}", k=k)
        return
    f = forced(f"mean={mean}", k=k)
    assert len(set(f.rates)) == 1 and len(f.rates) == k and 0.0 <= f.rates[0] <= 1.0
    assert f.mean_accept_length == pytest.approx(mean, abs=1e-9)
    assert f.setting == f"mean={mean}"


def test_mean_edges_and_the_rule():
    assert constant_rate_for_mean(1.0, 3) == 0.0 and constant_rate_for_mean(4.0, 3) == 1.0
    a = constant_rate_for_mean(2.2, 3)
    assert 1 + a + a**2 + a**3 == pytest.approx(2.2, abs=1e-12)  # the documented rule, written out
    assert expected_accept_length((0.5, 0.5)) == 1.75


@pytest.mark.parametrize(
    "value, message",
    [
        ("0.8,0.6,0.4,0.2", "4 per-position rates for mtp_step 3"),
        ("0.8,1.2", r"every per-position rate must be in \[0, 1\]"),
        ("-0.1", r"every per-position rate must be in \[0, 1\]"),
        ("mean=0.9", r"must be in \[1, 4\] for mtp_step 3"),
        ("mean=4.5", r"must be in \[1, 4\] for mtp_step 3"),
        ("mean=", "expected comma-separated rates"),
        ("fast", "expected comma-separated rates"),
        ("0.8,,0.4", "expected comma-separated rates"),
        ("nan", "expected comma-separated rates"),
        ("", "expected comma-separated rates"),
        (0.8, "must be a string"),
    ],
)
def test_bad_values_are_rejected_with_the_accepted_forms(value, message):
    with pytest.raises(ValueError, match=message):
        forced(value)


def test_needs_mtp_mode_and_is_off_by_default():
    with pytest.raises(ValueError, match="mtp_force_acceptance is set but mtp_mode is not"):
        EngineArgs("m", mtp_force_acceptance="mean=2")
    assert EngineArgs("m", mtp_mode="eagle_with_att", mtp_step=2).spec.force_acceptance is None
    with pytest.raises(ValueError, match="mtp_step must be an int"):  # mtp_step is checked before the rates
        EngineArgs("m", mtp_mode="eagle_with_att", mtp_step=9, mtp_force_acceptance="0.5")
