"""Checkpoint directories without a model: what counts as complete, what a start removes, pruning by
trainer.keep_last, `--resume RUN_DIR` and its errors, and a metrics line cut short by a kill.
(Real saves and a run killed at random moments: tests/recipes/test_recipe_kill.py.)"""

import json
import os

import pytest

from fastcrit.cli import main
from fastcrit.config import ConfigError, load_config
from fastcrit.train.checkpoint import (
    complete_checkpoints,
    latest_checkpoint,
    prune_checkpoints,
    remove_partial_checkpoints,
    resume_output_dir,
)
from fastcrit.train.metrics import RunLog


def fake(out, name, complete=True):
    """A checkpoint directory with a file in it (and the COMPLETE marker when ``complete``)."""
    path = os.path.join(out, "checkpoints", name)
    os.makedirs(os.path.join(path, "dcp"))
    open(os.path.join(path, "dcp", "__0_0.distcp"), "w").close()
    if complete:
        open(os.path.join(path, "COMPLETE"), "w").close()
    return path


def names(out):
    return sorted(os.listdir(os.path.join(out, "checkpoints")))


def test_only_complete_step_directories_count(tmp_path):
    out = str(tmp_path)
    assert latest_checkpoint(out) is None and complete_checkpoints(out) == []
    fake(out, "step_2")
    fake(out, "step_10")
    fake(out, "step_11", complete=False)  # a save of the older kind, killed before its marker
    fake(out, ".tmp_step_12")  # a save killed before its rename (marker or not)
    assert [s for s, _ in complete_checkpoints(out)] == [2, 10]  # by number, not by name
    assert latest_checkpoint(out) == os.path.join(out, "checkpoints", "step_10")


def test_a_start_removes_what_killed_saves_left(tmp_path):
    out = str(tmp_path)
    fake(out, "step_1")
    fake(out, "step_2", complete=False)
    fake(out, ".tmp_step_3", complete=False)
    fake(out, ".tmp_old_step_0")  # a prune or a replacement killed mid-delete
    open(os.path.join(out, "checkpoints", "notes.txt"), "w").close()  # not ours: left alone
    removed = remove_partial_checkpoints(out)
    root = os.path.join(out, "checkpoints")
    assert sorted(removed) == sorted(os.path.join(root, n) for n in (".tmp_old_step_0", ".tmp_step_3", "step_2"))
    assert names(out) == ["notes.txt", "step_1"]
    assert remove_partial_checkpoints(out) == []
    assert remove_partial_checkpoints(str(tmp_path / "no-run-yet")) == []


@pytest.mark.parametrize(
    "keep_last, kept", [(2, [4, 5, 9]), (1, [5, 9]), (3, [3, 4, 5, 9]), (0, [1, 3, 4, 5, 9]), (None, [1, 3, 4, 5, 9])]
)
def test_pruning_keeps_the_newest_and_never_the_one_just_written(tmp_path, keep_last, kept):
    out = str(tmp_path)
    for s in (1, 3, 4, 5, 9):
        fake(out, f"step_{s}")
    fake(out, "step_2", complete=False)  # not a checkpoint: not counted (a start removes it)
    # step 5 was just written; step_9 is a later step left by an earlier run (trainer.resume=false)
    removed = prune_checkpoints(out, keep_last, 5)
    assert [s for s, _ in complete_checkpoints(out)] == kept
    assert sorted(removed) == sorted(
        os.path.join(out, "checkpoints", f"step_{s}") for s in (1, 3, 4, 5, 9) if s not in kept
    )
    assert not any(n.startswith(".tmp_") for n in names(out))


def test_keep_last_is_validated():
    assert load_config(None).trainer.keep_last == 2
    assert load_config(None, ["trainer.keep_last=null"]).trainer.keep_last is None
    assert load_config(None, ["trainer.keep_last=0"]).trainer.keep_last == 0
    with pytest.raises(ConfigError, match="trainer.keep_last: must be >= 0"):
        load_config(None, ["trainer.keep_last=-1"])
    with pytest.raises(ConfigError, match="trainer.keep_last"):
        load_config(None, ["trainer.keep_last=two"])


def test_resume_takes_a_run_directory_or_its_newest_checkpoint(tmp_path):
    out = str(tmp_path / "run")
    fake(out, "step_2")
    newest = fake(out, "step_4")
    fake(out, "step_6", complete=False)
    assert resume_output_dir(out) == out
    assert resume_output_dir(newest + "/") == out
    with pytest.raises(ValueError, match="newest checkpoint is .*step_4"):
        resume_output_dir(os.path.join(out, "checkpoints", "step_2"))
    with pytest.raises(ValueError, match="step_6: not a complete checkpoint"):
        resume_output_dir(os.path.join(out, "checkpoints", "step_6"))


def test_resume_with_a_bad_path_is_a_clear_error(tmp_path, capsys):
    config = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "cpu", "grpo.yaml")
    missing = str(tmp_path / "nope")
    empty = str(tmp_path / "empty")
    fake(empty, "step_3", complete=False)
    for bad, why in (
        (missing, "no such directory"),
        (empty, f"no complete checkpoint in {os.path.join(empty, 'checkpoints')}"),
    ):
        assert main(["train", config, "--resume", bad]) == 2
        err = capsys.readouterr().err
        assert f"--resume {bad}: {why}" in err, err
    assert os.listdir(empty) == ["checkpoints"]  # nothing was started in it


def test_a_metrics_line_cut_by_a_kill_is_dropped_on_resume(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rows = [json.dumps({"step": s, "loss": 0.5}) + "\n" for s in (1, 2, 3)]
    path.write_text("".join(rows) + '{"step": 4, "lo')  # killed mid-write
    RunLog(str(tmp_path), enabled=True, total=5, start=2, progress=False)
    assert path.read_text() == "".join(rows[:2])
    path.write_text(rows[0] + rows[1].rstrip("\n"))  # whole, but cut before its newline
    RunLog(str(tmp_path), enabled=True, total=5, start=2, progress=False).log({"step": 3})
    assert [json.loads(ln)["step"] for ln in path.read_text().splitlines()] == [1, 2, 3]


def _save_one(ctx, path, out, mask):
    from fastcrit.config import OptimConfig
    from fastcrit.models.hf import load_tokenizer
    from fastcrit.train.actor import build_actor
    from fastcrit.train.checkpoint import save_checkpoint

    actor = build_actor(path, dtype="float32", device=ctx.device, world_size=ctx.world_size, optim=OptimConfig(lr=1e-2))
    old = os.umask(mask)
    try:
        save_checkpoint(
            actor, load_tokenizer(path), ctx, out, 1, {"model_path": path}, extra_files={"recipe_state.pt": {"x": 1}}
        )
    finally:
        os.umask(old)


@pytest.mark.parametrize("mask", [0o022, 0o002])
def test_every_file_of_a_checkpoint_gets_a_normal_files_mode(tiny_model_path, tmp_path, mask):
    """Readable by the user's group as any file the user writes: 0o666 less the umask (safetensors
    >= 0.8.1 writes its file 0600), and directories 0o777 less the umask."""
    from fastcrit.train.dist import launch

    out = str(tmp_path / "run")
    launch(_save_one, (tiny_model_path, out, mask), 1, "cpu")
    step = os.path.join(out, "checkpoints", "step_1")
    files = []
    for dirpath, dirs, names in os.walk(step):
        for d in dirs:
            assert oct(os.stat(os.path.join(dirpath, d)).st_mode & 0o777) == oct(0o777 & ~mask), d
        files += [os.path.join(dirpath, n) for n in names]
    assert {
        "model.safetensors",
        "config.json",
        "tokenizer_config.json",
        "trainer_state.json",
        "recipe_state.pt",
        "COMPLETE",
    } <= {os.path.basename(f) for f in files}
    assert any("/dcp/" in f for f in files)
    for f in files:
        assert oct(os.stat(f).st_mode & 0o777) == oct(0o666 & ~mask), f
