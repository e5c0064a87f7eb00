"""Sampling never draws from NaN or infinite probabilities: extreme temperatures and top_p
values are either refused with a QkvError or give a valid distribution (issue 26)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qkv.errors import QkvError
from qkv.inference.sampling import check_sampling, choose_next, filter_logits, next_token_probs

EXTREME_TEMPERATURES = [5e-324, 1e-300, 1e-45, 1e-38, 1e-20, 1e-4, 1.0, 1e20, 1e38, 1e300, 1.7e308]
EXTREME_TOP_P = [5e-324, 1e-300, 1e-46, 1e-45, 1e-8, 0.5, 0.999999999, 1.0]
NON_FINITE = [math.nan, math.inf, -math.inf]

FAST = settings(
    max_examples=150,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)


@st.composite
def logit_rows(draw):
    """``(B, V)`` float32 logits: random finite values (up to float32's range), some ``-inf``
    (masked tokens), or all equal; every row has at least one finite entry."""
    b, v = draw(st.integers(1, 3)), draw(st.integers(1, 12))
    finite = st.floats(allow_nan=False, allow_infinity=False, width=32)  # all of float32
    kind = draw(st.sampled_from(["random", "small", "equal", "masked"]))
    rows = []
    for _ in range(b):
        if kind == "equal":
            rows.append([draw(finite)] * v)
            continue
        values = st.floats(-20, 20, width=32) if kind == "small" else finite
        row = draw(st.lists(values, min_size=v, max_size=v))
        if kind == "masked":
            keep = draw(st.integers(0, v - 1))
            row = [x if i == keep or draw(st.booleans()) else -math.inf for i, x in enumerate(row)]
        rows.append(row)
    return torch.tensor(rows, dtype=torch.float32)


temperatures = st.one_of(
    st.sampled_from(EXTREME_TEMPERATURES + NON_FINITE + [0.0, -1.0]),
    st.floats(min_value=0.0, exclude_min=True, allow_nan=False, allow_infinity=False),
)
top_ps = st.one_of(
    st.none(), st.sampled_from(EXTREME_TOP_P + [math.nan, 0.0, 1.5]), st.floats(0.0, 1.0, exclude_min=True)
)
top_ks = st.one_of(st.none(), st.integers(-1, 15), st.just(2**70))


@FAST
@given(logits=logit_rows(), temperature=temperatures, top_k=top_ks, top_p=top_ps, seed=st.integers(0, 2**32))
def test_sampling_gives_a_finite_distribution_or_a_clean_refusal(logits, temperature, top_k, top_p, seed):
    try:
        probs = next_token_probs(logits, temperature, top_k, top_p)
    except QkvError as exc:
        assert "\n" not in str(exc)
        assert (
            not (0 < temperature < math.inf)
            or (top_k is not None and top_k < 1)
            or (top_p is not None and not 0 < top_p <= 1)
        )
        return
    assert probs.dtype == torch.float32 and probs.shape == logits.shape
    assert torch.isfinite(probs).all() and (probs >= 0).all()
    torch.testing.assert_close(probs.sum(-1), torch.ones(len(logits)), rtol=0, atol=1e-5)
    assert (probs[~torch.isfinite(logits)] == 0).all(), "a masked token has probability > 0"
    ids = choose_next(logits, True, temperature, top_k, top_p, torch.Generator().manual_seed(seed))
    assert ids.shape == (len(logits),)
    chosen = logits.gather(-1, ids[:, None])
    assert torch.isfinite(chosen).all(), "sampled a token whose logit is -inf"
    assert (probs.gather(-1, ids[:, None]) > 0).all()


@pytest.mark.parametrize("temperature", [5e-324, 1e-300, 1e-45, 1e-20])
@pytest.mark.parametrize("top_p", [None, 5e-324, 1e-46])
def test_tiny_temperature_or_top_p_is_greedy(temperature, top_p):
    """A temperature or top_p too small for float32 is greedy-equivalent (the issue's
    ``--temperature 1e-300`` / ``--top-p 5e-324``), never NaN."""
    logits = torch.tensor([[1.0, 3.0, -2.0, float("-inf")], [50.0, -50.0, 49.9, 0.0]])
    probs = next_token_probs(logits, temperature, None, top_p)
    torch.testing.assert_close(probs, torch.tensor([[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]))
    assert choose_next(logits, True, temperature, None, top_p).tolist() == [1, 0]
    probs = next_token_probs(logits, 1.0, None, 5e-324)
    assert (probs > 0).sum(-1).tolist() == [1, 1]


def test_ties_share_the_mass_at_a_tiny_temperature_and_a_huge_one_is_uniform():
    logits = torch.tensor([[2.0, 2.0, 1.0, float("-inf")]])
    torch.testing.assert_close(next_token_probs(logits, 1e-300), torch.tensor([[0.5, 0.5, 0.0, 0.0]]))
    torch.testing.assert_close(next_token_probs(logits, 1e300), torch.tensor([[1 / 3, 1 / 3, 1 / 3, 0.0]]))
    # a moderate temperature keeps filter_logits' contract: exactly logits / temperature
    torch.testing.assert_close(filter_logits(logits, temperature=0.5), logits / 0.5)


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        (dict(temperature=math.nan), "temperature"),
        (dict(temperature=math.inf), "temperature"),
        (dict(temperature=-math.inf), "temperature"),
        (dict(top_p=math.nan), "top_p"),
        (dict(top_p=math.inf), "top_p"),
        (dict(top_p=-0.0), "top_p"),
    ],
)
def test_non_finite_settings_are_refused(kwargs, needle):
    with pytest.raises(QkvError, match=needle):
        check_sampling(**kwargs)
    with pytest.raises(QkvError, match=needle):
        next_token_probs(torch.zeros(1, 3), **kwargs)


@pytest.fixture(scope="module")
def generator(tiny_runs):
    from qkv.inference.lm import TextGenerator

    return TextGenerator.from_run(tiny_runs["lm"])


@pytest.mark.parametrize(
    "temperature, top_p", [(1e-300, None), (5e-324, None), (1.0, 5e-324), (1e300, None), (1e-300, 5e-324)]
)
def test_top_probs_and_generate_with_extreme_settings(generator, temperature, top_p):
    """``qkv generate --top-probs`` (TextGenerator.next_token_probs) and sampling itself."""
    top = generator.next_token_probs("ROMEO", 5, temperature, top_p)
    probs = [p for _, p in top]
    assert all(math.isfinite(p) and 0 <= p <= 1 for p in probs) and probs == sorted(probs, reverse=True)
    if temperature < 1e-30 or top_p is not None:
        assert probs[0] == pytest.approx(1.0)
    text = generator.generate(["ROMEO"], 5, temperature=temperature, top_p=top_p, seed=0)[0]
    assert isinstance(text, str)
    for bad in (math.nan, math.inf):
        with pytest.raises(QkvError, match="temperature"):
            generator.next_token_probs("ROMEO", 5, bad)
        with pytest.raises(QkvError, match="temperature"):
            generator.generate(["ROMEO"], 2, temperature=bad)


@pytest.mark.parametrize("seed", [2**64, 2**70, -(2**63) - 1, -(2**70)])
def test_a_seed_outside_torch_range_is_refused(generator, seed):
    with pytest.raises(QkvError, match="seed must be an integer"):
        generator.generate(["ROMEO"], 2, seed=seed)
    for ok in (0, -(2**63), 2**64 - 1):
        generator.generate(["ROMEO"], 1, seed=ok)
