"""The replay buffer: FIFO keeps the newest, reservoir a uniform sample; its state round-trips."""

import collections

import pytest

from fastcrit.data.replay import ReplayBuffer


def test_fifo_keeps_the_newest():
    b = ReplayBuffer(3, "fifo")
    for i in range(7):
        b.push(i)
    assert sorted(b.items) == [4, 5, 6] and len(b) == 3 and b.seen == 7


def test_reservoir_is_uniform_over_everything_pushed():
    counts = collections.Counter()
    for seed in range(2000):
        b = ReplayBuffer(5, "reservoir", seed=seed)
        for i in range(50):
            b.push(i)
        counts.update(b.items)
    # each of the 50 items should be kept with probability 5/50: 200 of 2000 runs
    assert min(counts.values()) > 140 and max(counts.values()) < 260
    assert counts[0] > 140  # the first items are not forgotten, as FIFO would


def test_state_round_trips_exactly():
    a = ReplayBuffer(4, "reservoir", seed=1)
    for i in range(10):
        a.push(("q", i))
    b = ReplayBuffer(4, "reservoir", seed=99)
    b.load_state_dict(a.state_dict())
    for i in range(10, 20):
        a.push(("q", i))
        b.push(("q", i))
    assert a.items == b.items and a.sample(3) == b.sample(3)
    with pytest.raises(ValueError, match="resume with the same settings"):
        ReplayBuffer(8, "reservoir").load_state_dict(a.state_dict())


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="capacity"):
        ReplayBuffer(0)
    with pytest.raises(ValueError, match="mode"):
        ReplayBuffer(4, "lifo")
