"""The `model` reward reads each row's last valid token, by its attention mask: for a token- and a
sequence-classification head, with pad == EOS or no pad id in the model's config, rows padded on
the left or on the right, against a slow oracle that scores every row alone, without padding."""

import pytest
import torch

from fastcrit.reward import RewardItem
from fastcrit.reward.model import ModelReward, rm_ids

HEADS = {"token": "AutoModelForTokenClassification", "sequence": "AutoModelForSequenceClassification"}


@pytest.fixture(scope="module")
def reward_dirs(tiny_model_path, tmp_path_factory):
    """{(head, pad): directory} of one-label reward models on the tiny backbone, with a random head
    (so that each token scores differently) and the config's pad_token_id set to EOS or None."""
    import transformers

    from fastcrit.models.hf import load_tokenizer

    out = {}
    for head, cls in HEADS.items():
        for pad in ("eos", "none"):
            torch.manual_seed(1)
            model = getattr(transformers, cls).from_pretrained(tiny_model_path, num_labels=1, local_files_only=True)
            with torch.no_grad():
                model.score.weight.normal_(0.0, 1.0)
            tok = load_tokenizer(tiny_model_path)
            if pad == "eos":
                tok.pad_token = tok.eos_token
            model.config.pad_token_id = tok.eos_token_id if pad == "eos" else None
            path = tmp_path_factory.mktemp(f"rm_{head}_{pad}")
            model.save_pretrained(path)
            tok.save_pretrained(path)
            out[head, pad] = str(path)
    return out


def oracle(rm: ModelReward, row: list[int]) -> float:
    """One row alone, unpadded: the head applied to the hidden state of its final token."""
    ids = torch.tensor([row])
    with torch.no_grad():
        hidden = getattr(rm.model, rm.model.base_model_prefix)(input_ids=ids).last_hidden_state
        return float(rm.model.score(hidden[:, -1])[0, 0])


def padded(rows: list[list[int]], pad_id: int, side: str) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        at = slice(width - len(r), width) if side == "left" else slice(0, len(r))
        ids[i, at], mask[i, at] = torch.tensor(r), 1
    return ids, mask


ITEMS = [
    RewardItem("abc", "cba", "cba", {}),
    RewardItem("hello there", "ereht", "", {}),
    RewardItem("x", "a much longer answer than the others", "", {}),
]


@pytest.mark.parametrize("head", list(HEADS))
@pytest.mark.parametrize("pad", ["eos", "none"])
@pytest.mark.parametrize("side", ["left", "right"])
def test_scores_read_the_last_valid_token_of_every_row(reward_dirs, head, pad, side):
    rm = ModelReward(reward_dirs[head, pad], batch_size=8)
    assert rm.tok.pad_token_id == rm.tok.eos_token_id or pad == "none"
    rows = [rm_ids(rm.tok, it.prompt, it.response) for it in ITEMS]
    assert len({len(r) for r in rows}) == 3 and all(r[-1] == rm.tok.eos_token_id for r in rows)
    want = torch.tensor([oracle(rm, r) for r in rows])
    # the neighbouring token scores differently: reading it would be caught
    assert all(abs(oracle(rm, r[:-1]) - w) > 1e-3 for r, w in zip(rows, want.tolist()))
    if side == "left":  # what the reward manager itself sends (its own left padding, one batch)
        torch.testing.assert_close(rm.scores(ITEMS), want, atol=1e-5, rtol=1e-5)
        assert [r.score for r in rm(ITEMS)] == pytest.approx(want.tolist(), abs=1e-5)
    torch.testing.assert_close(rm.score_ids(*padded(rows, rm.tok.pad_token_id, side)), want, atol=1e-5, rtol=1e-5)


def test_the_oracle_is_the_token_head_of_transformers_on_one_unpadded_row(reward_dirs):
    rm = ModelReward(reward_dirs["token", "none"])
    row = rm_ids(rm.tok, "abc", "cba")
    with torch.no_grad():
        plain = float(rm.model(input_ids=torch.tensor([row])).logits[0, -1, 0])
    assert oracle(rm, row) == pytest.approx(plain, abs=1e-6)
