"""RARO's pure pieces: the critic's verdict, the reward matrix, the advantages over kept rows, and
the joint objective lambda_pol * (policy loss) + lambda_crit * (critic loss) of each optimizer step.

The critic sees a question and two answers (one the expert's, one the policy's, in random order),
reasons, and ends with exactly one label: ``[Answer 1]``, ``[Answer 2]`` or ``[Tie]`` (``parse_label``
says what else it accepts).
"""

from __future__ import annotations

import dataclasses
import re

import torch

from fastcrit.algos.losses import PPOObjective, policy_objective, tis_weights
from fastcrit_kernels import group_advantages

TIE = 0
# A label: brackets around "Answer 1", "Answer 2" or "Tie", in any case, with any spacing and
# markdown emphasis inside ("[answer1]", "[ **Tie** ]"). Emphasis is "(?:[*_]+\s*)?" after the
# spaces, not "[*_]*\s*": two space runs side by side split a long run of spaces every way, so
# "[" and 100 kB of spaces (a critic's output) took minutes.
_LABEL = re.compile(r"\[\s*(?:[*_]+\s*)?(?:answer\s*([12])|(tie))\s*(?:[*_]+\s*)?\]", re.IGNORECASE)
# What may follow the final label: spaces, emphasis, closing parentheses, sentence punctuation.
_TAIL = re.compile(r"[\s*_.!,;:)]*")
# Quoted text, masked in this order (each pattern sees the text with the earlier ones masked, so a
# quote mark inside a code span pairs with nothing): fenced code blocks, code spans, blockquote
# lines, double-quoted strings (straight or curly). Single quotes are left alone: apostrophes.
_QUOTED = (
    re.compile(r"^[ \t]*(```|~~~).*?(^[ \t]*\1|\Z)", re.MULTILINE | re.DOTALL),
    re.compile(r"`[^`\n]*`"),
    re.compile(r"^[ \t]*>.*$", re.MULTILINE),
    re.compile(r"\"[^\"]*\"|\u201c[^\u201d]*\u201d"),
)


def _unquoted(text: str) -> str:
    """``text`` with every quoted character replaced by NUL (same length, newlines kept)."""
    for pat in _QUOTED:
        text = pat.sub(lambda m: re.sub(r"[^\n]", "\0", m.group()), text)
    return text


def parse_label(text: str) -> int | None:
    """1 or 2 (the answer the critic names as the expert's), 0 for a tie, None when unparseable.

    Labels inside quoted text (double quotes, code spans, fenced code, blockquote lines) do not
    count: a critic quoting an answer that carries a label is not giving a verdict. The last label
    outside them must end the text, up to spaces, emphasis and punctuation, and every label outside
    them must say the same: "... [Answer 2]" -> 2; "**[answer2]**." -> 2; "[Answer 2] because ..."
    -> None; "[Answer 1] ... no, [Answer 2]" -> None (two verdicts); '... wrote "[Answer 1]"' -> None.
    """
    seen = _unquoted(text)
    found = list(_LABEL.finditer(seen))
    if not found or _TAIL.fullmatch(seen, found[-1].end()) is None:
        return None
    values = {TIE if m.group(2) else int(m.group(1)) for m in found}
    return values.pop() if len(values) == 1 else None


def judge_rewards(label: int, expert_pos: int, *, tau_crit: float, tau_pol: float) -> tuple[float, float]:
    """(critic reward, policy reward) of one parsed verdict: the critic names the expert's answer
    -> (1, 0); it names the policy's -> (0, 1); a tie -> (tau_crit, tau_pol)."""
    if label == TIE:
        return tau_crit, tau_pol
    return (1.0, 0.0) if label == expert_pos else (0.0, 1.0)


def kept_group_advantages(
    scores: torch.Tensor, group_ids: torch.Tensor, kept: torch.Tensor, *, norm_by_std: bool = True
) -> torch.Tensor:
    """[B] GRPO advantages over each group's kept rows only: (s - mean) / (std + 1e-6), or s - mean
    without ``norm_by_std``, the mean and the unbiased std taken over the kept rows of the group.
    A masked row (``kept`` False: an unparseable verdict, an unjudged or over-length answer) gets 0
    and does not move its group's statistics, so being parseable earns nothing by itself. A group
    with fewer than 2 kept rows gets 0, like a constant group: nothing to compare with (verl's GRPO
    would give a lone row its raw score). scores: [B] float; group_ids: [B] long; kept: [B] bool.
    """
    out = torch.zeros(scores.shape[0], dtype=torch.float32)
    rows = torch.nonzero(kept).flatten()
    if len(rows) == 0:
        return out
    g = group_ids[rows]
    _, inv, counts = torch.unique(g, return_inverse=True, return_counts=True)
    adv = group_advantages(scores[rows].float(), g, "grpo", norm_by_std=norm_by_std)
    out[rows] = torch.where(counts[inv] >= 2, adv.float(), torch.zeros_like(adv, dtype=torch.float32))
    return out


def agg_units(mask: torch.Tensor, agg: str) -> float:
    """What a PPO ``loss_agg`` divides a batch's summed loss by: its valid tokens (token-mean), or
    its rows with a valid token (the seq-mean modes; seq-mean-token-sum-norm then also divides by a
    constant). ``mask``: [B, R]."""
    return float(mask.sum()) if agg == "token-mean" else float((mask.sum(-1) > 0).sum())


class RaroObjective:
    """RARO's joint loss, per optimizer step: lambda_pol * L_pol + lambda_crit * L_crit + kl_coef * KL
    - entropy_coef * H, where L_role is the clipped PPO loss (``algorithm.*``) aggregated by
    ``algorithm.loss_agg`` over that role's rows of the mini-batch of all ranks together, and the KL
    and entropy terms are aggregated over both roles' rows together (one model, one reference).

    Exact for every ``loss_agg``: each aggregation is a sum over units (tokens, or sequences) divided
    by their count, and the clipped loss is linear in a positive scale of the advantage, so scaling a
    role's advantages by lambda_role * U / U_role (U: units of the mini-batch of all ranks, U_role:
    the role's) turns the scaffold's aggregate over all U units into the weighted sum of the roles'
    own aggregates. The counts are taken per mini-batch (``begin_mini_batch``: one all-reduce), so
    each optimizer step, and N ranks, get the weights one process gets for that step's rows; a role
    without units in a mini-batch adds nothing to that step.

    Stats beside the joint ones: ``raro/<role>/loss`` (L_role, without lambda) and ``.../kl`` (with a
    reference), each aggregated over the role's own units, and ``.../clipfrac``, the share of the
    role's tokens clipped; each the mean over optimizer steps (a step without the role counts 0).
    ``batch.roles``: [B] role ids; ``lambdas``: role id -> (name, lambda).
    """

    whole_groups = False

    def __init__(self, algo, lambdas: dict[int, tuple[str, float]], agg_scale: float | None = None):
        self.algo, self.lambdas, self.agg = algo, lambdas, algo.loss_agg
        self.ppo = PPOObjective(algo, agg_scale)
        self.entropy = self.ppo.entropy
        self.units: dict[int, float] = {}  # role -> its units in the current mini-batch, all ranks
        self.tokens: dict[int, float] = {}  # role -> its valid tokens there

    def check(self, batch) -> None:
        self.ppo.check(batch)
        if batch.roles is None or batch.roles.shape != (len(batch),):
            raise ValueError("update_policy: RaroObjective needs batch.roles, one role id per row")

    def begin_mini_batch(self, mini, total) -> None:
        masks = [mini.response_mask[mini.roles == r] for r in self.lambdas]
        counts = total([agg_units(m, self.agg) for m in masks] + [float(m.sum()) for m in masks])
        self.units = dict(zip(self.lambdas, counts[: len(masks)]))
        self.tokens = dict(zip(self.lambdas, counts[len(masks) :]))

    def __call__(self, logp, entropy, mb):
        all_units = sum(self.units.values())
        factor = torch.zeros(len(mb), dtype=torch.float32)
        for r, (_, lam) in self.lambdas.items():
            if self.units[r] > 0:
                factor[mb.roles == r] = lam * all_units / self.units[r]
        adv = mb.advantages * (factor[:, None] if mb.advantages.dim() == 2 else factor)
        loss, out = self.ppo(logp, entropy, dataclasses.replace(mb, advantages=adv))
        mb_units = agg_units(mb.response_mask, self.agg)
        keys = ("loss", "clipfrac") + (("kl",) if self.algo.kl_coef != 0.0 and mb.ref_logprobs is not None else ())
        for r, (name, _) in self.lambdas.items():
            rows = torch.nonzero(mb.roles == r).flatten()
            role_units = agg_units(mb.response_mask[rows], self.agg)
            got = dict.fromkeys(keys, 0.0)  # every rank reports the same keys (one all-reduce)
            if role_units > 0:
                # The scaffold weighs a micro-batch's stats by its share of all units (mb / U); a
                # role's loss terms are rescaled to weigh by its share of the role's units, and
                # its clip fraction (a share of tokens) by its share of the role's tokens.
                to_role = all_units / mb_units
                by_units = to_role * role_units / self.units[r]
                by_tokens = to_role * float(mb.response_mask[rows].sum()) / self.tokens[r]
                got = {
                    k: v * (by_tokens if k == "clipfrac" else by_units)
                    for k, v in self._role_stats(logp, mb, rows).items()
                }
            out.update({f"raro/{name}/{k}": v for k, v in got.items()})
        return loss, out

    def _role_stats(self, logp, mb, rows) -> dict[str, float]:
        """L_role (PPO loss on the role's own advantages), clip fraction, KL, over ``rows``."""
        a, d = self.algo, logp.device
        rows = rows.to(d)
        old, mask = mb.old_logprobs.to(d)[rows], mb.response_mask.to(d)[rows]
        ref = None if mb.ref_logprobs is None else mb.ref_logprobs.to(d)[rows]
        w = None if a.tis_cap is None else tis_weights(old, mb.rollout_logprobs.to(d)[rows], mask, a.tis_cap)[0]
        with torch.no_grad():
            _, s = policy_objective(
                logp[rows],
                old,
                mb.advantages.to(d)[rows],
                mask,
                clip_low=a.clip_low,
                clip_high=a.clip_high,
                clip_c=a.clip_c,
                agg=a.loss_agg,
                agg_scale=self.ppo.agg_scale,
                ref_logp=ref,
                kl_coef=a.kl_coef,
                kl_kind=a.kl_kind,
                token_weights=w,
            )
        out = {"loss": s["loss/policy"], "clipfrac": s["actor/clipfrac"]}
        if "kl/mean" in s:
            out["kl"] = s["kl/mean"]
        return out
