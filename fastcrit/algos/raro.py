"""RARO's pure pieces: the critic's verdict, the reward matrix, and the weights that make one joint
update equal lambda_pol * (policy loss) + lambda_crit * (critic loss).

The critic sees a question and two answers (one the expert's, one the policy's, in random order),
reasons, and ends with exactly one label: ``[Answer 1]``, ``[Answer 2]`` or ``[Tie]``.
"""
from __future__ import annotations

import re

import torch

LABELS = {"[Answer 1]": 1, "[Answer 2]": 2, "[Tie]": 0}
TIE = 0
_BRACKETED = re.compile(r"\[[^\[\]\n]*\]")


def parse_label(text: str) -> int | None:
    """1 or 2 (the answer the critic names as the expert's), 0 for a tie, None when unparseable.

    Only the final bracketed span counts, and it must end the text (trailing whitespace aside) and
    be one of the three labels exactly: "... [Answer 2]" -> 2; "[Answer 2] because ..." -> None;
    "[answer 2]" -> None; "... [Answer 1] or [Tie]" -> 0 (the last one decides).
    """
    stripped = text.rstrip()
    spans = list(_BRACKETED.finditer(stripped))
    if not spans or spans[-1].end() != len(stripped):
        return None
    return LABELS.get(spans[-1].group())


def judge_rewards(label: int, expert_pos: int, *, tau_crit: float, tau_pol: float) -> tuple[float, float]:
    """(critic reward, policy reward) of one parsed verdict: the critic names the expert's answer
    -> (1, 0); it names the policy's -> (0, 1); a tie -> (tau_crit, tau_pol)."""
    if label == TIE:
        return tau_crit, tau_pol
    return (1.0, 0.0) if label == expert_pos else (0.0, 1.0)


def role_weights(roles: torch.Tensor, mask: torch.Tensor, lambdas: dict[int, float]) -> torch.Tensor:
    """[B] per-sample factors for the advantages of a batch mixing roles, so that the batch's
    token-mean PPO loss equals sum_r lambdas[r] * (token-mean loss over role r's tokens).

    Exact because the clipped PPO loss is linear in a positive scale of the advantage: with N
    valid tokens in all and N_r in role r, the factor is lambdas[r] * N / N_r (0 for a role without
    tokens). ``roles``: [B] role id per sample; ``mask``: [B, R] valid tokens.
    """
    tokens = mask.float().sum(-1)
    total = tokens.sum()
    out = torch.zeros(len(roles), dtype=torch.float32)
    for role, lam in lambdas.items():
        sel = roles == role
        n = tokens[sel].sum()
        if n > 0:
            out[sel] = lam * total / n
    return out
