import pytest
import torch

from fastcrit.rollout.batch import collate
from fastcrit.types import Rollout


def test_collate_pads_prompts_left_and_responses_right():
    rs = [
        Rollout(0, [5, 6, 7], [8, 9], [-0.5, -0.25], "stop"),
        Rollout(0, [5, 6, 7], [10], [-1.0], "length"),
        Rollout(1, [4], [], [], "stop"),
    ]
    b = collate(rs, pad_id=0, group_offset=10)
    assert b.prompts.tolist() == [[5, 6, 7], [5, 6, 7], [0, 0, 4]]
    assert b.responses.tolist() == [[8, 9], [10, 0], [0, 0]]
    assert b.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0], [0, 0, 1, 0, 0]]
    assert b.response_mask.tolist() == [[1, 1], [1, 0], [0, 0]]
    assert b.old_logprobs.tolist() == [[-0.5, -0.25], [-1.0, 0.0], [0.0, 0.0]]
    assert b.group_ids.tolist() == [10, 10, 11]
    assert b.position_ids.tolist() == [[0, 1, 2, 3, 4], [0, 1, 2, 3, 3], [0, 0, 0, 0, 0]]
    sub = b.select(torch.tensor([2, 0]))
    assert sub.group_ids.tolist() == [11, 10] and sub.responses.shape == (2, 2)


def test_collate_rejects_inconsistent_rollouts():
    with pytest.raises(ValueError, match="rollout 0: 2 output ids but 1 logprobs"):
        collate([Rollout(0, [1], [2, 3], [-1.0], "stop")], pad_id=0)
    with pytest.raises(ValueError, match="no rollouts"):
        collate([], pad_id=0)
