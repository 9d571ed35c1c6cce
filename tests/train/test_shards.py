"""Work dealt over ranks through files: chunks and their dealing, whole-or-nothing chunk files, the
plan a restart must match, and waiting that gives up only when nothing moves."""

import itertools
import json
import os
import time

import pytest

from fastcrit.train.shards import Chunk, ChunkFiles, ShardError, cut, dealt, missing_message, wait_for, write_atomically


def test_cut_covers_every_item_once_in_chunks_of_the_size_given():
    chunks = cut([("train", 7), ("empty", 0), ("val", 3)], 3)
    assert [(c.name, c.start, c.stop) for c in chunks] == [
        ("train_00000", 0, 3),
        ("train_00001", 3, 6),
        ("train_00002", 6, 7),
        ("val_00000", 0, 3),
    ]
    assert [len(c) for c in chunks] == [3, 3, 1, 3]
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="per_chunk"):
            cut([("train", 4)], bad)


@pytest.mark.parametrize("world", [1, 2, 3, 8])
def test_dealing_gives_every_chunk_to_one_rank_and_shares_differ_by_at_most_one(world):
    chunks = cut([("train", 50), ("val", 7)], 4)
    shares = [dealt(chunks, r, world) for r in range(world)]
    assert sorted(itertools.chain(*shares), key=chunks.index) == chunks
    assert max(map(len, shares)) - min(map(len, shares)) <= 1
    with pytest.raises(ValueError, match="rank 2 is not in a world of 2"):
        dealt(chunks, 2, 2)


def test_chunk_file_is_whole_or_absent_and_a_damaged_one_is_refused(tmp_path):
    files = ChunkFiles(str(tmp_path / "parts"))
    a, b = Chunk("train", 0, 0, 2), Chunk("train", 1, 2, 4)
    assert files.count() == 0 and files.missing([a, b]) == [a, b]  # no directory yet
    rows = [{"solution": "x", "n": 1}, {"critique": {"messages": []}}]
    files.write(a, rows)
    assert files.done(a) and files.read(a) == rows and files.missing([a, b]) == [b]
    assert os.listdir(files.directory) == ["train_00000.jsonl"]  # the temporary file was renamed
    # What a kill in the middle of a write leaves: a temporary file, which counts for nothing.
    with open(os.path.join(files.directory, ".train_00001.jsonl.host.123.tmp"), "w") as f:
        f.write(json.dumps(rows[0]) + "\n")
    assert not files.done(b) and files.count() == 1
    files.write(b, [])
    assert files.read(b) == [] and files.count() == 2
    with open(files.path(a)) as f:  # a file cut short (copied half, say) has no footer
        head = f.readline()
    with open(files.path(a), "w") as f:
        f.write(head)
    with pytest.raises(ShardError, match=r"train_00000\.jsonl: its last line should be .*delete it"):
        files.read(a)
    with open(files.path(a), "w") as f:
        f.write("{not json\n")
    with pytest.raises(ShardError, match="not a chunk file"):
        files.read(a)


def test_plan_is_written_once_and_a_different_one_names_what_differs(tmp_path):
    files = ChunkFiles(str(tmp_path / "parts"))
    plan = {"chunk_problems": 4, "splits": {"train": {"seed": 1, "problems": 10}}}
    files.settle_plan(plan)
    files.settle_plan(json.loads(json.dumps(plan)))  # the same plan again: fine
    other = {"chunk_problems": 4, "splits": {"train": {"seed": 2, "problems": 10}, "val": {"problems": 3}}}
    with pytest.raises(
        ShardError,
        match=r"splits\.train\.seed: 1 there, 2 now; splits\.val: None there, "
        r"\{'problems': 3\} now\)\. Restore the settings",
    ):
        files.settle_plan(other)
    with open(os.path.join(files.directory, "plan.json")) as f:
        assert json.load(f) == plan  # left as it was


def test_write_atomically_replaces_whole(tmp_path):
    path = str(tmp_path / "out.jsonl")
    write_atomically(path, ["a\n", "b\n"])
    write_atomically(path, (line for line in ["c\n"]))
    assert open(path).read() == "c\n" and os.listdir(tmp_path) == ["out.jsonl"]


def test_wait_gives_up_only_when_nothing_moves(tmp_path):
    ticks = itertools.count()
    t0 = time.monotonic()  # progress on every look: waits past wait_s until ready
    wait_for(lambda: time.monotonic() - t0 > 0.5, lambda: next(ticks), wait_s=0.2, failure=lambda: "never", poll_s=0.02)
    t0 = time.monotonic()
    with pytest.raises(ShardError, match="^chunk 7 missing$"):
        wait_for(lambda: False, lambda: 3, wait_s=0.2, failure=lambda: "chunk 7 missing", poll_s=0.02)
    assert 0.2 < time.monotonic() - t0 < 5
    with pytest.raises(ValueError, match="wait_s"):
        wait_for(lambda: True, lambda: 0, wait_s=0, failure=lambda: "")


def test_missing_message_names_the_chunks_and_their_ranks(tmp_path):
    files = ChunkFiles(str(tmp_path / "parts"))
    chunks = cut([("train", 10)], 2)  # 5 chunks over 2 ranks: 0, 2, 4 on rank 0; 1, 3 on rank 1
    for c in chunks[:2] + chunks[4:]:
        files.write(c, [])
    msg = missing_message(files, chunks, 2, 60, "trainer.stage_wait_s")
    assert "no chunk appeared for 60 s (trainer.stage_wait_s)" in msg
    assert "2 are missing (train_00002, train_00003), dealt to rank(s) 0, 1 of 2" in msg
    assert "share trainer.output_dir" in msg
