import pytest

from fastcrit.reward import RewardItem, get_reward_manager, known_reward_managers
from fastcrit.reward.rule import reverse_reward


@pytest.mark.parametrize(
    "response,answer,expected",
    [
        ("e d c b a", "e d c b a", 1.0),
        ("  e d c b a \n", "e d c b a", 1.0),
        ("e d c b x", "e d c b a", 0.8),
        ("a b c d e", "e d c b a", 0.2),  # only the middle letter is in place
        ("e d c b a a a a a a", "e d c b a", 0.5),  # extra tokens cost credit
        ("e d", "e d c b a", 0.4),
        ("", "e d c b a", 0.0),
        ("edcba", "e d c b a", 0.0),
    ],
)
def test_reverse_reward(response, answer, expected):
    assert reverse_reward(response, answer) == pytest.approx(expected)


def test_managers_by_name():
    assert {"reverse", "exact_match"} <= set(known_reward_managers())
    out = get_reward_manager("reverse")([RewardItem("p", "b a", "b a"), RewardItem("p", "a b", "b a")])
    assert [r.score for r in out] == [1.0, 0.0] and out[0].info["exact"] is True
    with pytest.raises(ValueError, match="reward.name: unknown reward manager 'nope'"):
        get_reward_manager("nope")


def test_rule_uses_each_rows_own_rule():
    items = [
        RewardItem("p", "e d c b x", "e d c b a", {"task": "reverse"}),
        RewardItem("p", " 42 ", "42", {}),
        RewardItem("p", "41", "42", {}),
    ]
    out = get_reward_manager("rule")(items)
    assert [r.score for r in out] == pytest.approx([0.8, 1.0, 0.0])
    assert [r.info["exact"] for r in out] == [False, True, False]
