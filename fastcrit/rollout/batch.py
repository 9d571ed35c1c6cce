"""Rollouts (lists of token ids) -> a padded RolloutBatch in verl's layout."""

from __future__ import annotations

import torch

from fastcrit.types import Rollout, RolloutBatch


def collate(rollouts: list[Rollout], pad_id: int, group_offset: int = 0) -> RolloutBatch:
    """Left-pad prompts, right-pad responses. ``group_ids = prompt_index + group_offset``. The
    engine's log-probs fill both ``rollout_logprobs`` and ``old_logprobs`` (which the trainer may
    replace by its own recomputation).

    A response with no tokens (the engine stopped at once) keeps one padded slot with mask 0, so
    shapes stay valid; its loss contribution is zero by the mask.
    """
    if not rollouts:
        raise ValueError("collate: no rollouts")
    B = len(rollouts)
    P = max(len(r.prompt_ids) for r in rollouts)
    R = max(1, max(len(r.output_ids) for r in rollouts))
    prompts = torch.full((B, P), pad_id, dtype=torch.long)
    responses = torch.full((B, R), pad_id, dtype=torch.long)
    attn = torch.zeros((B, P + R), dtype=torch.long)
    rmask = torch.zeros((B, R), dtype=torch.float32)
    old = torch.zeros((B, R), dtype=torch.float32)
    for i, r in enumerate(rollouts):
        p, o = len(r.prompt_ids), len(r.output_ids)
        if len(r.logprobs) != o:
            raise ValueError(f"rollout {i}: {o} output ids but {len(r.logprobs)} logprobs")
        prompts[i, P - p :] = torch.tensor(r.prompt_ids, dtype=torch.long)
        attn[i, P - p : P] = 1
        if o:
            responses[i, :o] = torch.tensor(r.output_ids, dtype=torch.long)
            attn[i, P : P + o] = 1
            rmask[i, :o] = 1.0
            old[i, :o] = torch.tensor(r.logprobs, dtype=torch.float32)
    group_ids = torch.tensor([r.prompt_index + group_offset for r in rollouts], dtype=torch.long)
    return RolloutBatch(
        prompts=prompts,
        responses=responses,
        attention_mask=attn,
        response_mask=rmask,
        old_logprobs=old,
        group_ids=group_ids,
        rollout_logprobs=old.clone(),
    )
