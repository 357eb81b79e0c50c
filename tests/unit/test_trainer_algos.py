"""asyncdapo.services.trainer.algos against hand-computed values, edge cases, and an independent reference.

The reference below is written from the formulas (verl core_algos semantics) with plain Python
loops over floats, so it shares no code path with the vectorised implementation.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from asyncdapo.services.trainer.algos import (
    agg_loss,
    entropy_from_logits,
    grpo_advantages,
    log_probs_from_logits,
    low_var_kl,
    policy_loss,
    tis_weights,
)

CLIP = {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 10.0}


# ----------------------------------------------------------------------------- GRPO advantages


def test_grpo_hand_computed_binary_group() -> None:
    adv = grpo_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), ["a"] * 4)
    # mean 0.5, Bessel std sqrt(4 * 0.25 / 3) = 0.57735
    expected = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    assert adv.tolist() == pytest.approx([expected, -expected, -expected, expected], rel=1e-6)


def test_grpo_all_equal_group_gives_zero() -> None:
    adv = grpo_advantages(torch.tensor([0.7, 0.7, 0.7]), [3, 3, 3])
    assert adv.tolist() == [0.0, 0.0, 0.0]


def test_grpo_single_response_group_keeps_raw_score() -> None:
    adv = grpo_advantages(torch.tensor([0.7, 1.0, 0.0]), ["solo", "pair", "pair"])
    assert adv[0].item() == pytest.approx(0.7 / (1.0 + 1e-6))
    s = math.sqrt(0.5)  # std of (1, 0) with Bessel
    assert adv[1:].tolist() == pytest.approx([0.5 / (s + 1e-6), -0.5 / (s + 1e-6)])


def test_grpo_interleaved_groups_and_dr_grpo() -> None:
    scores = torch.tensor([1.0, 5.0, 0.0, 6.0, 0.0, 7.0])
    idx = ["x", "y", "x", "y", "x", "y"]
    dr = grpo_advantages(scores, idx, norm_by_std=False)
    assert dr.tolist() == pytest.approx([2 / 3, -1.0, -1 / 3, 0.0, -1 / 3, 1.0])
    normed = grpo_advantages(scores, idx)
    assert normed[1::2].tolist() == pytest.approx([-1.0, 0.0, 1.0], rel=1e-5)  # y: mean 6, std 1


def test_grpo_rejects_bad_shapes() -> None:
    with pytest.raises(ValueError, match="1-D"):
        grpo_advantages(torch.zeros(2, 2), [0, 1])
    with pytest.raises(ValueError, match="group_index"):
        grpo_advantages(torch.zeros(3), [0, 1])


# ----------------------------------------------------------------------------- policy loss


def _one(adv: float, ratio: float) -> tuple[float, dict[str, float]]:
    old = torch.tensor([[0.0]])
    new = torch.tensor([[math.log(ratio)]])
    loss, m = policy_loss(old, new, torch.tensor([adv]), torch.ones(1, 1), loss_agg_mode="token-mean", **CLIP)
    return loss.item(), {k: v.item() for k, v in m.items()}


@pytest.mark.parametrize(
    ("adv", "ratio", "loss", "clipfrac", "lower"),
    [
        (1.0, 1.5, -1.28, 1.0, 0.0),  # clip-higher caps the gain at 1 + 0.28
        (1.0, 0.5, -0.5, 0.0, 0.0),  # positive advantage, ratio below 1: unclipped
        (-1.0, 0.5, 0.8, 1.0, 0.0),  # negative advantage, ratio below 1 - 0.2: clipped
        (-1.0, 1.2, 1.2, 0.0, 0.0),  # within range
        (-1.0, 20.0, 10.0, 0.0, 1.0),  # dual clip bounds the loss at -A * c
        (0.0, 3.0, 0.0, 0.0, 0.0),
    ],
)
def test_policy_loss_hand_computed(
    adv: float, ratio: float, loss: float, clipfrac: float, lower: float
) -> None:
    got, m = _one(adv, ratio)
    assert got == pytest.approx(loss, abs=1e-5)
    assert m["pg_clipfrac"] == pytest.approx(clipfrac)
    assert m["pg_clipfrac_lower"] == pytest.approx(lower)
    assert m["ppo_kl"] == pytest.approx(-math.log(ratio), abs=1e-6)


def test_policy_loss_ignores_nan_in_padding_and_fully_masked_rows() -> None:
    old = torch.tensor([[0.0, float("nan")], [float("nan"), float("nan")]])
    new = torch.tensor([[math.log(1.1), float("inf")], [0.3, float("nan")]])
    mask = torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    adv = torch.tensor([2.0, -1.0])
    for mode in ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean"):
        loss, m = policy_loss(old, new, adv, mask, loss_agg_mode=mode, **CLIP)
        assert loss.item() == pytest.approx(-2.2, rel=1e-5), mode
        assert all(math.isfinite(v.item()) for v in m.values())


def test_policy_loss_everything_masked_is_zero_not_nan() -> None:
    z = torch.zeros(2, 3)
    for mode in ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean"):
        loss, m = policy_loss(z, z, torch.ones(2), z, loss_agg_mode=mode, **CLIP)
        assert loss.item() == 0.0
        assert m["pg_clipfrac"].item() == 0.0


def test_log_ratio_is_clamped_to_20() -> None:
    old = torch.tensor([[0.0]])
    new = torch.tensor([[50.0]])
    loss, m = policy_loss(old, new, torch.tensor([1.0]), torch.ones(1, 1), loss_agg_mode="token-mean", **CLIP)
    assert m["ppo_kl"].item() == -20.0
    assert loss.item() == pytest.approx(-1.28)


def test_policy_loss_gradient_is_zero_where_clipped() -> None:
    new = torch.tensor([[math.log(1.5), math.log(1.1)]], requires_grad=True)
    loss, _ = policy_loss(
        torch.zeros(1, 2), new, torch.tensor([1.0]), torch.ones(1, 2), loss_agg_mode="token-mean", **CLIP
    )
    loss.backward()
    assert new.grad is not None
    assert new.grad[0, 0].item() == 0.0  # clipped token: no gradient
    assert new.grad[0, 1].item() == pytest.approx(-1.1 / 2)  # d(-A*exp(x))/dx / 2 tokens


def test_clip_ratio_c_must_exceed_one() -> None:
    with pytest.raises(ValueError, match="clip_ratio_c"):
        policy_loss(
            torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1), torch.ones(1, 1),
            clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=1.0, loss_agg_mode="token-mean",
        )  # fmt: skip


# ----------------------------------------------------------------------------- agg_loss


def test_agg_loss_hand_computed_modes() -> None:
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0], [9.0, 9.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    assert agg_loss(loss, mask, "token-mean").item() == pytest.approx(10 / 4)
    assert agg_loss(loss, mask, "seq-mean-token-sum").item() == pytest.approx((6 + 4) / 2)
    assert agg_loss(loss, mask, "seq-mean-token-mean").item() == pytest.approx((2 + 4) / 2)
    # Dr. GRPO: row sums over the constant horizon, averaged over the 2 unmasked rows
    assert agg_loss(loss, mask, "seq-mean-token-sum-norm", horizon=8).item() == pytest.approx(
        (6 / 8 + 4 / 8) / 2
    )
    with pytest.raises(ValueError):
        agg_loss(loss, mask, "token-sum")
    with pytest.raises(ValueError, match="horizon"):
        agg_loss(loss, mask, "seq-mean-token-sum-norm")  # the constant must be given, never the width


def test_seq_mean_token_sum_norm_does_not_depend_on_the_padded_width() -> None:
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    wider = torch.nn.functional.pad(loss, (0, 5), value=7.0)  # a batch with a longer response elsewhere
    wider_mask = torch.nn.functional.pad(mask, (0, 5))
    got = agg_loss(loss, mask, "seq-mean-token-sum-norm", horizon=16)
    assert agg_loss(wider, wider_mask, "seq-mean-token-sum-norm", horizon=16).item() == pytest.approx(
        got.item()
    )
    assert got.item() == pytest.approx((6 + 4) / 16 / 2)


def test_agg_loss_micro_batches_with_global_normalisers_sum_to_whole() -> None:
    g = torch.Generator().manual_seed(0)
    loss = torch.randn(6, 5, generator=g)
    mask = (torch.rand(6, 5, generator=g) > 0.3).float()
    mask[2] = 0
    n_tok, n_seq = mask.sum(), (mask.sum(-1) > 0).sum()
    for mode in ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        whole = agg_loss(loss, mask, mode, horizon=7)
        parts = sum(
            agg_loss(loss[i : i + 2], mask[i : i + 2], mode, num_tokens=n_tok, num_seqs=n_seq, horizon=7)
            for i in range(0, 6, 2)
        )
        assert parts.item() == pytest.approx(whole.item(), rel=1e-5), mode
        # two data-parallel replicas, gradients averaged: each scales by dp_size
        reps = [
            agg_loss(loss[r::2], mask[r::2], mode, num_tokens=n_tok, num_seqs=n_seq, dp_size=2, horizon=7)
            for r in range(2)
        ]
        assert ((reps[0] + reps[1]) / 2).item() == pytest.approx(whole.item(), rel=1e-5), mode


# ----------------------------------------------------------------------------- TIS, KL, entropy


def test_tis_weights_are_truncated_and_detached() -> None:
    old = torch.tensor([[0.0, 0.0, -1.0]], requires_grad=True)
    behaviour = torch.tensor([[0.0, -2.0, 0.0]])
    w = tis_weights(old, behaviour, cap=2.0)
    assert w.tolist()[0] == pytest.approx([1.0, 2.0, math.exp(-1.0)])
    assert not w.requires_grad
    with pytest.raises(ValueError, match="cap"):
        tis_weights(old, behaviour, cap=0.0)


def test_tis_weight_scales_per_token_loss() -> None:
    old = torch.zeros(1, 2)
    new = torch.zeros(1, 2)
    w = torch.tensor([[0.5, 2.0]])
    loss, _ = policy_loss(
        old, new, torch.tensor([1.0]), torch.ones(1, 2), loss_agg_mode="token-mean", tis_weight=w, **CLIP
    )
    assert loss.item() == pytest.approx(-(0.5 + 2.0) / 2)


def test_low_var_kl_zero_at_equal_and_positive_otherwise() -> None:
    a = torch.tensor([-1.0, -2.0])
    assert low_var_kl(a, a).tolist() == [0.0, 0.0]
    assert (low_var_kl(a, a - 0.5) > 0).all()
    assert low_var_kl(torch.tensor([0.0]), torch.tensor([1.0])).item() == pytest.approx(math.e - 2)


def test_entropy_and_log_probs_match_definitions() -> None:
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [10.0, 0.0, 0.0, 0.0]]])
    ent = entropy_from_logits(logits)
    assert ent[0, 0].item() == pytest.approx(math.log(4))
    p = torch.softmax(logits[0, 1], -1)
    assert ent[0, 1].item() == pytest.approx(-(p * p.log()).sum().item(), abs=1e-5)
    lp = log_probs_from_logits(logits, torch.tensor([[2, 0]]))
    expected = [math.log(0.25), torch.log_softmax(logits[0, 1], -1)[0].item()]
    assert lp.tolist()[0] == pytest.approx(expected, abs=1e-6)  # lse cancellation: ~1e-7 in fp32


# ----------------------------------------------------------------------------- reference cross-check


def _ref_grpo(scores: list[float], index: list[int], eps: float, norm: bool) -> list[float]:
    groups: dict[int, list[float]] = {}
    for s, i in zip(scores, index, strict=True):
        groups.setdefault(i, []).append(s)
    stats = {}
    for i, vals in groups.items():
        if len(vals) == 1:
            stats[i] = (0.0, 1.0)
        else:
            mu = sum(vals) / len(vals)
            var = sum((v - mu) ** 2 for v in vals) / (len(vals) - 1)
            stats[i] = (mu, math.sqrt(var))
    out = []
    for s, i in zip(scores, index, strict=True):
        mu, sd = stats[i]
        out.append((s - mu) / (sd + eps) if norm else s - mu)
    return out


def _ref_token_loss(old: float, new: float, a: float, w: float) -> tuple[float, bool, bool]:
    lr = max(-20.0, min(20.0, new - old))
    ratio = math.exp(lr)
    l1 = -a * ratio
    l2 = -a * max(1 - CLIP["clip_ratio_low"], min(1 + CLIP["clip_ratio_high"], ratio))
    clipped = l2 > l1
    loss = max(l1, l2)
    lower = False
    if a < 0:
        l3 = -a * CLIP["clip_ratio_c"]
        lower = loss > l3
        loss = min(loss, l3)
    return loss * w, clipped, lower


def _ref_policy_loss(old, new, adv, mask, weights, mode, horizon):  # type: ignore[no-untyped-def]
    rows, tok_sum, tok_n, clip_n, lower_n, kl_sum = [], 0.0, 0, 0, 0, 0.0
    for r in range(len(old)):
        row_losses = []
        for t in range(len(old[r])):
            if not mask[r][t]:
                continue
            loss, c, lo = _ref_token_loss(old[r][t], new[r][t], adv[r], weights[r][t])
            row_losses.append(loss)
            clip_n += c
            lower_n += lo
            kl_sum += -max(-20.0, min(20.0, new[r][t] - old[r][t]))
        tok_sum += sum(row_losses)
        tok_n += len(row_losses)
        if row_losses:
            rows.append(row_losses)
    if mode == "token-mean":
        agg = tok_sum / tok_n if tok_n else 0.0
    elif mode == "seq-mean-token-sum":
        agg = sum(sum(r) for r in rows) / len(rows) if rows else 0.0
    elif mode == "seq-mean-token-sum-norm":
        agg = sum(sum(r) / horizon for r in rows) / len(rows) if rows else 0.0
    else:
        agg = sum(sum(r) / len(r) for r in rows) / len(rows) if rows else 0.0
    n = max(tok_n, 1)
    return agg, clip_n / n, lower_n / n, kl_sum / n


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(
    "mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
)
def test_cross_check_against_reference_on_random_inputs(seed: int, mode: str) -> None:
    rnd = random.Random(seed)
    bs, length = rnd.randint(1, 9), rnd.randint(1, 12)
    n_groups = rnd.randint(1, bs)
    index = [rnd.randrange(n_groups) for _ in range(bs)]
    scores = [rnd.choice([0.0, 1.0, rnd.uniform(-1, 1)]) for _ in range(bs)]
    for norm in (True, False):
        got = grpo_advantages(torch.tensor(scores, dtype=torch.float64), index, norm_by_std=norm)
        assert got.tolist() == pytest.approx(_ref_grpo(scores, index, 1e-6, norm), rel=1e-9, abs=1e-9)

    adv = _ref_grpo(scores, index, 1e-6, True)
    adv = [a * rnd.uniform(0.5, 3.0) for a in adv]  # large |A| to exercise the dual clip
    old = [[rnd.uniform(-5, 0) for _ in range(length)] for _ in range(bs)]
    new = [[o + rnd.gauss(0, 0.6) * rnd.choice([1, 1, 8]) for o in row] for row in old]
    lengths = [rnd.randint(0, length) for _ in range(bs)]
    mask = [[1 if t < n else 0 for t in range(length)] for n in lengths]
    weights = [[min(math.exp(rnd.gauss(0, 0.5)), 2.0) for _ in range(length)] for _ in range(bs)]

    t = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
    horizon = length + rnd.randint(0, 20)  # data.max_response_length: at least the padded width
    loss, m = policy_loss(
        t(old), t(new), t(adv), t(mask), loss_agg_mode=mode, tis_weight=t(weights), horizon=horizon, **CLIP
    )
    ref_loss, ref_clip, ref_lower, ref_kl = _ref_policy_loss(old, new, adv, mask, weights, mode, horizon)
    assert loss.item() == pytest.approx(ref_loss, rel=1e-6, abs=1e-9)
    assert m["pg_clipfrac"].item() == pytest.approx(ref_clip, abs=1e-6)
    assert m["pg_clipfrac_lower"].item() == pytest.approx(ref_lower, abs=1e-6)
    assert m["ppo_kl"].item() == pytest.approx(ref_kl, rel=1e-6, abs=1e-8)
