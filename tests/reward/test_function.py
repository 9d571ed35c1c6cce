"""A user reward function named by import path: loaded, called per response, and failing loudly
only where the user can fix it (the import), never on one bad response."""

import math

import pytest

from fastcrit.config import ConfigError
from fastcrit.reward import RewardItem, get_reward_manager

MODULE = """
def length(prompt, response, answer, meta):
    return len(response) / 10

def detailed(prompt, response, answer, meta):
    return {"score": 1.0 if response == answer else 0.0, "seen_task": meta.get("task", "")}

def flaky(prompt, response, answer, meta):
    if response == "boom":
        raise RuntimeError("cannot score this")
    if response == "nan":
        return float("nan")
    if response == "text":
        return "high"
    return 0.5
"""


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "my_rewards"


def test_user_function_scores_and_info(user_module):
    out = get_reward_manager(f"{user_module}:length")([RewardItem("p", "abcde", "")])
    assert out[0].score == 0.5 and out[0].info["error"] is False
    out = get_reward_manager(f"{user_module}:detailed")(
        [RewardItem("p", "x", "x", {"task": "t"}), RewardItem("p", "y", "x")]
    )
    assert [r.score for r in out] == [1.0, 0.0] and out[0].info["seen_task"] == "t"


def test_one_bad_response_is_a_zero_with_a_reason(user_module):
    out = get_reward_manager(f"{user_module}:flaky")([RewardItem("p", r, "") for r in ("ok", "boom", "nan", "text")])
    assert [r.score for r in out] == [0.5, 0.0, 0.0, 0.0]
    assert [r.info["error"] for r in out] == [False, True, True, True]
    assert "raised RuntimeError: cannot score this" in out[1].info["reason"]
    assert "returned nan, not a finite number" in out[2].info["reason"]
    assert "returned 'high'" in out[3].info["reason"]
    assert all(math.isfinite(r.score) for r in out)


@pytest.mark.parametrize(
    "name,message",
    [
        ("no_such_module_xyz:f", "cannot import 'no_such_module_xyz'"),
        ("my_rewards:missing", "has no function 'missing'"),
        ("my_rewards:", "is named 'module:function'"),
    ],
)
def test_bad_paths_stop_at_once_naming_them(user_module, name, message):
    with pytest.raises(ConfigError, match=message):
        get_reward_manager(name)
