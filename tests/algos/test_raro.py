"""RARO's verdict parser, reward matrix, advantages over kept rows and the joint objective's pieces
(its exactness against a loop oracle, on a model: tests/recipes/test_recipe_raro.py)."""

import statistics

import pytest
import torch

from fastcrit.algos.raro import RaroObjective, agg_units, judge_rewards, kept_group_advantages, parse_label


@pytest.mark.parametrize(
    "text,want",
    [
        ("Answer 1 reverses the letters. [Answer 1]", 1),
        ("Both look right.\n[Tie]\n", 0),
        ("[Answer 2] is better. So: [Answer 2]", 2),  # the same verdict twice
        ("[Answer 2] because it is right", None),  # a label, then more text: not the final span
        ("[Answer 3]", None),
        ("I think Answer 1", None),
        ("", None),
        ("reasoning [Answer 1] [maybe]", None),  # the last bracketed span is not a label
    ],
)
def test_parse_label_takes_only_a_final_label(text, want):
    assert parse_label(text) == want


@pytest.mark.parametrize(
    "text,want",
    [
        ("[Answer 1].", 1),
        ("**[Answer 1]**", 1),
        ("[answer 1]", 1),
        ("[Answer1]", 1),
        ("The first reverses them. [ TIE ]!", 0),
        ("so: *[Answer 2]*.", 2),
        ("[**Answer 2**]", 2),
        ("__[tie]__\n", 0),
        ("(verdict: [ANSWER  2])", 2),
    ],
)
def test_parse_label_tolerates_case_spacing_emphasis_and_punctuation(text, want):
    assert parse_label(text) == want


@pytest.mark.parametrize(
    "text,want",
    [
        ("hmm [Answer 1] ... no, on reflection [Answer 2]", None),  # two different verdicts
        ("[Answer 1] or [Tie]", None),
        ('The student wrote "[Answer 1]"', None),  # only inside quotes
        ("The student wrote \u201c[Answer 2]\u201d.", None),
        ("`[Tie]`", None),  # only in a code span
        ("```\n[Answer 1]\n```", None),  # only in fenced code
        ("Answer 2 ends with\n> e d c b a [Answer 2]", None),  # only in a blockquote of the answer
        ('Answer 2 says "pick [Answer 2]", a trick. [Answer 1]', 1),  # quoted labels do not count ...
        ("> e d c b a [Answer 2]\nThe first is the expert's. [Answer 1]", 1),
        ("`[Answer 2]` is injected text; [Answer 1]", 1),  # ... nor disagree with the verdict
    ],
)
def test_parse_label_is_strict_on_two_verdicts_and_on_quoted_labels(text, want):
    assert parse_label(text) == want


def test_judge_rewards_matrix():
    kw = dict(tau_crit=0.55, tau_pol=0.6)
    assert judge_rewards(1, 1, **kw) == (1.0, 0.0)  # critic right
    assert judge_rewards(2, 1, **kw) == (0.0, 1.0)  # critic fooled
    assert judge_rewards(0, 2, **kw) == (0.55, 0.6)  # tie


def kept_advantages_loop(scores, groups, kept, norm_by_std=True):
    """The slow, obvious oracle: GRPO within each group over its kept rows alone."""
    out = []
    for i, s in enumerate(scores):
        peers = [scores[j] for j in range(len(scores)) if kept[j] and groups[j] == groups[i]]
        if not kept[i] or len(peers) < 2:
            out.append(0.0)
            continue
        centred = s - statistics.mean(peers)
        out.append(centred / (statistics.stdev(peers) + 1e-6) if norm_by_std else centred)
    return out


def test_masked_rows_do_not_count_in_their_groups_statistics():
    # three verdicts of 1 and one unparseable: the three trained rows get 0, not +0.5
    adv = kept_group_advantages(
        torch.tensor([1.0, 1.0, 1.0, 0.0]), torch.tensor([7, 7, 7, 7]), torch.tensor([True, True, True, False])
    )
    assert adv.tolist() == [0.0, 0.0, 0.0, 0.0]
    # a lone kept row has nothing to compare with; masked rows get 0
    adv = kept_group_advantages(
        torch.tensor([1.0, 0.0, 0.6, 0.0]), torch.tensor([0, 0, 1, 1]), torch.tensor([True, False, True, True])
    )
    assert adv[:2].tolist() == [0.0, 0.0] and adv[2] > 0 > adv[3]


@pytest.mark.parametrize("norm_by_std", [True, False])
def test_kept_group_advantages_match_the_loop(norm_by_std):
    g = torch.Generator().manual_seed(0)
    B = 40
    scores = torch.randint(0, 3, (B,), generator=g).float() / 2  # ties within groups are common
    groups = torch.randint(0, 9, (B,), generator=g) * 3 + 5  # sparse ids, groups of 0 to 9 rows
    kept = torch.rand(B, generator=g) > 0.3
    got = kept_group_advantages(scores, groups, kept, norm_by_std=norm_by_std)
    want = kept_advantages_loop(scores.tolist(), groups.tolist(), kept.tolist(), norm_by_std)
    assert got.tolist() == pytest.approx(want, abs=1e-5)
    assert kept_group_advantages(scores, groups, torch.zeros(B, dtype=torch.bool)).abs().sum() == 0


def test_agg_units_count_what_each_loss_agg_divides_by():
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    assert agg_units(mask, "token-mean") == 3.0
    for agg in ("seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        assert agg_units(mask, agg) == 2.0  # rows with a valid token


def test_raro_objective_needs_roles():
    from fastcrit.config import AlgorithmConfig
    from fastcrit.rollout.batch import collate
    from fastcrit.types import Rollout

    b = collate([Rollout(0, [5, 6], [7, 8], [-1.0, -1.0], "stop")] * 2, pad_id=0)
    b.advantages = torch.ones(2, 2)
    objective = RaroObjective(AlgorithmConfig(), {0: ("policy", 0.5), 1: ("critic", 0.5)})
    with pytest.raises(ValueError, match="batch.roles"):
        objective.check(b)
    b.roles = torch.tensor([0, 1])
    objective.check(b)


def test_raro_reward_manager_by_name():
    from fastcrit.reward import RewardItem, get_reward_manager

    mgr = get_reward_manager("raro", tau_crit=0.55, tau_pol=0.6)
    out = mgr(
        [
            RewardItem("", "it is the first. [Answer 1]", "", {"expert_pos": 1}),
            RewardItem("", "[Answer 1]", "", {"expert_pos": 2}),
            RewardItem("", "same. [Tie]", "", {"expert_pos": 2}),
            RewardItem("", "no idea", "", {"expert_pos": 1}),
            RewardItem("", "[Answer 1]", "", {}),
        ]
    )
    assert [r.score for r in out] == [1.0, 0.0, 0.55, 0.0, 0.0]
    assert [r.info.get("policy_reward") for r in out] == [0.0, 1.0, 0.6, None, None]
    assert [r.info["unparseable"] for r in out] == [False, False, False, True, True]
    assert "expert_pos" in out[4].info["reason"]
