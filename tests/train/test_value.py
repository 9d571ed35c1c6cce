"""The value model (PPO critic, reward model): loading with a fresh or a kept head, values at the
right positions, a value update that fits the returns, scores independent of padding, and saved
copies that transformers loads back."""

import pytest
import torch

from fastcrit.config import AlgorithmConfig, OptimConfig, PPOConfig
from fastcrit.models.hf import load_value_model
from fastcrit.rollout.batch import collate
from fastcrit.train.checkpoint import save_hf
from fastcrit.train.dist import launch
from fastcrit.train.value import build_value_actor, compute_values, explained_variance, last_token_scores, update_values
from fastcrit.types import Rollout


def batch(seed=0, B=6):
    g = torch.Generator().manual_seed(seed)
    rs = []
    for i in range(B):
        p = torch.randint(3, 200, (int(torch.randint(2, 6, (1,), generator=g)),), generator=g).tolist()
        o = torch.randint(3, 200, (int(torch.randint(1, 5, (1,), generator=g)),), generator=g).tolist()
        rs.append(Rollout(i // 2, p, o, [0.0] * len(o), "stop"))
    return collate(rs, pad_id=0)


def test_a_causal_lm_gets_a_fresh_head_and_a_saved_one_is_kept(tiny_model_path, tmp_path):
    m = load_value_model(tiny_model_path)
    assert m._fresh_value_head and m.config.architectures == ["Qwen2ForTokenClassification"]
    assert m.score.out_features == 1 and not m.training
    with torch.no_grad():
        m.score.bias.fill_(3.25)
    m.save_pretrained(tmp_path / "vm")
    again = load_value_model(str(tmp_path / "vm"))
    assert not again._fresh_value_head and again.score.bias.item() == 3.25
    from transformers import AutoModelForTokenClassification

    plain = AutoModelForTokenClassification.from_pretrained(tmp_path / "vm", local_files_only=True)
    assert plain.score.bias.item() == 3.25


def _values_and_update(ctx, path, out):
    torch.manual_seed(0)
    critic = build_value_actor(path, dtype="float32", device=ctx.device, world_size=1, optim=OptimConfig(lr=3e-3))
    b = batch()
    v = compute_values(critic, b, micro_batch_size=4)
    # Values are read at the positions that predict each response token: the same as a plain
    # forward's outputs shifted by one.
    full = critic.module(b.input_ids, b.attention_mask, b.position_ids).detach()
    R = b.responses.shape[1]
    torch.testing.assert_close(v, full[:, -R - 1 : -1] * b.response_mask)
    b.values = v
    b.returns = torch.ones_like(v) * b.response_mask
    losses = []
    for _ in range(30):
        b.values = compute_values(critic, b, 4)
        stats = update_values(
            critic,
            b,
            AlgorithmConfig(mini_batches=2),
            PPOConfig(value_clip=10.0),
            micro_batch_size=4,
            grad_clip=1.0,
            generator=torch.Generator().manual_seed(0),
        )
        losses.append(stats["critic/value_loss"])
    after = compute_values(critic, b, 4)
    # Left and right padding give the same last-token score.
    ids, mask = b.input_ids, b.attention_mask
    right_ids = torch.zeros_like(ids)
    right_mask = torch.zeros_like(mask)
    for i in range(len(ids)):
        row = ids[i][mask[i] > 0]
        right_ids[i, : len(row)], right_mask[i, : len(row)] = row, 1
    s_left = last_token_scores(critic, ids, mask, 4)
    s_right = last_token_scores(critic, right_ids, right_mask, 4)
    save_hf(critic, None, out + "/critic", ctx)
    torch.save(
        {"losses": losses, "after": after, "mask": b.response_mask, "stats": stats, "s": (s_left, s_right)},
        out + "/r.pt",
    )


def test_values_fit_their_returns_and_scores_ignore_padding(tiny_model_path, tmp_path):
    launch(_values_and_update, (tiny_model_path, str(tmp_path)), 1, "cpu")
    r = torch.load(tmp_path / "r.pt")
    assert r["losses"][-1] < 0.1 * r["losses"][0]
    assert explained_variance(r["after"], r["mask"], r["mask"]) == 0.0  # constant returns: no variance
    assert ((r["after"] - 1.0).abs() * r["mask"]).max() < 0.3
    assert {"critic/value_loss", "critic/vf_clipfrac", "critic/grad_norm", "critic/lr"} <= set(r["stats"])
    torch.testing.assert_close(r["s"][0], r["s"][1], atol=1e-4, rtol=1e-4)
    from transformers import AutoModelForTokenClassification

    AutoModelForTokenClassification.from_pretrained(tmp_path / "critic", local_files_only=True)


def test_explained_variance():
    m = torch.ones(2, 3)
    ret = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    assert explained_variance(ret, ret, m) == pytest.approx(1.0)
    assert explained_variance(torch.full_like(ret, 3.5), ret, m) == pytest.approx(0.0)
