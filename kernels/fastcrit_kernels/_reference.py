"""Slow, obvious fp64 references: the oracles the fast paths are tested and benchmarked against.

Each function mirrors verl's ``core_algos`` (v0.9) or PACS's ``pacs_core_algos`` line by line, with
Python loops over groups and rows, and computes in float64 with plain autograd, so ``.backward()``
through them gives the reference gradient. They are deliberately not fast: never use them in training.

Shapes: ``B`` sequences, ``T`` response tokens. Masks are 0/1 (bool, int or float).
"""

from __future__ import annotations

from collections import defaultdict

import torch


def _f64(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float64)


def ref_kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str) -> torch.Tensor:
    """verl ``kl_penalty_forward``: per-token KL estimate, same shape as the inputs, float64."""
    lp, ref = _f64(logp), _f64(ref_logp)
    if kind in ("k1", "kl"):
        return lp - ref
    if kind == "abs":
        return (lp - ref).abs()
    if kind in ("k2", "mse"):
        return 0.5 * (lp - ref).square()
    if kind in ("k3", "low_var_kl"):
        d = torch.clamp(ref - lp, min=-20.0, max=20.0)
        return torch.clamp(torch.exp(d) - d - 1, min=-10.0, max=10.0)
    raise ValueError(f"unknown kl kind {kind!r}")


def _group_lists(index) -> dict:
    groups: dict = defaultdict(list)
    for i, g in enumerate(index.tolist() if isinstance(index, torch.Tensor) else list(index)):
        groups[g].append(i)
    return groups


def ref_group_advantages(
    scores: torch.Tensor, index, estimator: str, norm_by_std: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """Sequence-level advantages [B] by a loop over groups (verl's loop versions).

    grpo: (s - mean) / (std + eps), unbiased std; a group of one has mean 0, std 1.
    rloo: n / (n - 1) * (s - mean) for n > 1; a group of one keeps its raw score.
    naive: the raw score (PACS ``compute_naive_advantage``).
    Differentiable wrt ``scores``. Where a group's std is exactly 0 the std is treated as a constant
    (autograd through ``torch.std`` would give NaN there; the true limit of the gradient term is 0).
    """
    s = _f64(scores)
    out = [None] * s.shape[0]
    for members in _group_lists(index).values():
        vals = torch.stack([s[i] for i in members])
        n = len(members)
        if estimator == "naive":
            adv = vals
        elif estimator == "rloo":
            adv = vals if n == 1 else (vals - vals.mean()) * (n / (n - 1))
        elif estimator == "grpo":
            if n == 1:
                mean, std = torch.zeros((), dtype=s.dtype), torch.ones((), dtype=s.dtype)
            else:
                mean = vals.mean()
                var = ((vals - mean) ** 2).sum() / (n - 1)
                std = var.sqrt() if var.item() > 0 else var.detach()
            adv = (vals - mean) / (std + eps) if norm_by_std else vals - mean
        else:
            raise ValueError(f"unknown estimator {estimator!r}")
        for k, i in enumerate(members):
            out[i] = adv[k]
    return torch.stack(out)


def ref_agg_loss(loss_mat: torch.Tensor, mask: torch.Tensor, agg: str, agg_scale=None) -> torch.Tensor:
    """verl ``agg_loss`` (single process), by a loop over rows; fully masked rows are excluded from
    the sequence means. An all-masked batch gives 0 (verl would give NaN for token-mean)."""
    lm, m = _f64(loss_mat), _f64(mask)
    B, T = lm.shape
    zero = lm.sum() * 0.0
    if agg == "token-mean":
        total = m.sum()
        return (lm * m).sum() / total if float(total) > 0 else zero
    seq_vals = []
    for b in range(B):
        cnt = m[b].sum()
        if float(cnt) <= 0:
            continue
        tok_sum = (lm[b] * m[b]).sum()
        if agg == "seq-mean-token-mean":
            seq_vals.append(tok_sum / (cnt + 1e-8))
        elif agg in ("seq-mean-token-sum", "seq-mean-token-sum-norm"):
            seq_vals.append(tok_sum)
        else:
            raise ValueError(f"unknown agg {agg!r}")
    if not seq_vals:
        return zero
    loss = torch.stack(seq_vals).mean()
    if agg == "seq-mean-token-sum-norm":
        loss = loss / (T if agg_scale is None else agg_scale)
    return loss


def _masked_mean(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    total = m.sum()
    return (x * m).sum() / total if float(total) > 0 else (x * m).sum() * 0.0


def ref_ppo_policy_loss(
    logp,
    old_logp,
    advantages,
    mask,
    clip_low=0.2,
    clip_high=0.2,
    clip_c=None,
    agg="token-mean",
    agg_scale=None,
):
    """verl ``compute_policy_loss_vanilla`` in float64 -> (loss, stats)."""
    lp, old, m = _f64(logp), _f64(old_logp), _f64(mask)
    adv = _f64(advantages)
    if adv.dim() == 1:
        adv = adv[:, None].expand_as(lp)
    neg_kl = torch.clamp(lp - old, min=-20.0, max=20.0)
    ratio = torch.exp(neg_kl)
    approx_kl = _masked_mean(-neg_kl, m)
    l1 = -adv * ratio
    l2 = -adv * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    lc = torch.maximum(l1, l2)
    clipfrac = _masked_mean(torch.gt(l2, l1).to(lp.dtype), m)
    if clip_c is not None:
        l3 = -adv * clip_c
        lower = torch.gt(lc, l3) & (adv < 0)
        clipfrac_lower = _masked_mean(lower.to(lp.dtype), m)
        lc = torch.where(adv < 0, torch.minimum(l3, lc), lc)
    else:
        clipfrac_lower = torch.zeros((), dtype=torch.float64)
    loss = ref_agg_loss(lc, m, agg, agg_scale)
    return loss, {
        "clipfrac": clipfrac.detach(),
        "clipfrac_lower": clipfrac_lower.detach(),
        "approx_kl": approx_kl.detach(),
    }


def ref_value_loss(values, old_values, returns, mask, clip=0.5, agg="token-mean", agg_scale=None):
    """verl ``compute_value_loss`` in float64 -> (loss, stats)."""
    v, vo, R, m = _f64(values), _f64(old_values), _f64(returns), _f64(mask)
    vc = torch.clamp(v, vo - clip, vo + clip)
    l1 = (v - R) ** 2
    l2 = (vc - R) ** 2
    loss = 0.5 * ref_agg_loss(torch.maximum(l1, l2), m, agg, agg_scale)
    return loss, {"clipfrac": _masked_mean(torch.gt(l2, l1).to(v.dtype), m).detach()}


def ref_pacs_weights(scores, index, weight_mode):
    """PACS ``compute_weight`` generalised to groups by id: float64 [B]."""
    y = [float(v) for v in _f64(scores).tolist()]
    w = [1.0] * len(y)
    if weight_mode is None:
        return torch.tensor(w, dtype=torch.float64)
    if weight_mode == "question":
        for members in _group_lists(index).values():
            labels = [y[i] for i in members]
            n_pos = sum(1 for v in labels if v == 1.0)
            n_neg = len(labels) - n_pos
            if n_pos and n_neg:
                for i in members:
                    w[i] = len(labels) / (2.0 * (n_pos if y[i] == 1.0 else n_neg))
    elif weight_mode == "only_positive":
        w = [1.0 if v == 1.0 else 0.0 for v in y]
    elif weight_mode == "only_negative":
        w = [1.0 if v == 0.0 else 0.0 for v in y]
    else:
        raise ValueError(f"unknown weight_mode {weight_mode!r}")
    return torch.tensor(w, dtype=torch.float64)


def ref_pacs_loss(
    logp,
    old_logp,
    scores,
    mask,
    index,
    beta=1.0,
    reward_method="1",
    estimator="rloo",
    weight_mode=None,
    norm_by_std=True,
    eps=1e-6,
):
    """PACS loss in float64 -> (loss, stats). Rows with no valid token get reward 0."""
    lp, old, m = _f64(logp), _f64(old_logp), _f64(mask)
    B = lp.shape[0]
    rewards = []
    for b in range(B):
        if reward_method == "1":
            rewards.append(beta * ((lp[b] - old[b]) * m[b]).sum())
        elif reward_method == "2":
            length = m[b].sum()
            if float(length) > 0:
                rewards.append(beta * (lp[b] * m[b]).sum() / length)
            else:
                rewards.append((lp[b] * m[b]).sum() * 0.0)
        else:
            raise ValueError(f"unknown reward_method {reward_method!r}")
    r = torch.stack(rewards)
    adv = ref_group_advantages(r, index, estimator, norm_by_std=norm_by_std, eps=eps)
    y = _f64(scores)
    w = ref_pacs_weights(scores, index, weight_mode)
    # torch's BCE-with-logits, as PACS uses it (its backward is sigmoid(a) - y everywhere, also at a = 0)
    per = torch.nn.functional.binary_cross_entropy_with_logits(adv, y, reduction="none")
    loss = (w * per).sum() / B
    stats = {
        "reward_mean": r.mean().detach(),
        "advantage_mean": adv.mean().detach(),
        "accuracy": ((adv > 0).to(torch.float64) == y).to(torch.float64).mean(),
    }
    return loss, stats


# Log-probs from hidden states x lm_head with the full logits: the oracle of fused_logprobs and
# the "naive" baseline of the benchmarks (any dtype; fp64 by default).
def logprobs_reference(
    hidden, weight, labels, *, temperature=1.0, bias=None, return_entropy=False, ignore_index=-100, dtype=torch.float64
):
    """Full ``[..., V]`` logits in ``dtype`` -> log_softmax -> gather. Differentiable by autograd."""
    logits = hidden.to(dtype) @ weight.to(dtype).t()
    if bias is not None:
        logits = logits + bias.to(dtype)
    logp_all = torch.log_softmax(logits / temperature, dim=-1)
    valid = labels != ignore_index
    safe = torch.where(valid, labels, torch.zeros_like(labels)).long()
    lp = logp_all.gather(-1, safe.unsqueeze(-1)).squeeze(-1)
    lp = torch.where(valid, lp, torch.zeros_like(lp))
    if not return_entropy:
        return lp
    p = logp_all.exp()
    # 0 log 0 = 0 (torch.special.entr's convention): a logit of -inf adds nothing, not NaN
    ent = -(p * logp_all.masked_fill(p == 0, 0.0)).sum(-1)
    return lp, torch.where(valid, ent, torch.zeros_like(ent))
