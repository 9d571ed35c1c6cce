"""RARO's pure pieces: the critic's verdict, the reward matrix, and the weights that make one joint
update equal lambda_pol * (policy loss) + lambda_crit * (critic loss).

The critic sees a question and two answers (one the expert's, one the policy's, in random order),
reasons, and ends with exactly one label: ``[Answer 1]``, ``[Answer 2]`` or ``[Tie]`` (``parse_label``
says what else it accepts).
"""
from __future__ import annotations

import re

import torch

from fastcrit_kernels import group_advantages

TIE = 0
# A label: brackets around "Answer 1", "Answer 2" or "Tie", in any case, with any spacing and
# markdown emphasis inside ("[answer1]", "[ **Tie** ]").
_LABEL = re.compile(r"\[\s*[*_]*\s*(?:answer\s*([12])|(tie))\s*[*_]*\s*\]", re.IGNORECASE)
# What may follow the final label: spaces, emphasis, closing parentheses, sentence punctuation.
_TAIL = re.compile(r"[\s*_.!,;:)]*")
# Quoted text, masked in this order (each pattern sees the text with the earlier ones masked, so a
# quote mark inside a code span pairs with nothing): fenced code blocks, code spans, blockquote
# lines, double-quoted strings (straight or curly). Single quotes are left alone: apostrophes.
_QUOTED = (re.compile(r"^[ \t]*(```|~~~).*?(^[ \t]*\1|\Z)", re.MULTILINE | re.DOTALL),
           re.compile(r"`[^`\n]*`"),
           re.compile(r"^[ \t]*>.*$", re.MULTILINE),
           re.compile(r"\"[^\"]*\"|\u201c[^\u201d]*\u201d"))


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


def kept_group_advantages(scores: torch.Tensor, group_ids: torch.Tensor, kept: torch.Tensor, *,
                          norm_by_std: bool = True) -> torch.Tensor:
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
