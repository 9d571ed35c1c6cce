"""A training run into an output directory that holds checkpoints: continued when it is the same
run, refused when the settings differ or the steps went down, nothing trained when it is finished
(fastcrit.train.resume_check and `fastcrit train`). No model is built: the checkpoints here are
bare directories with the files a resume reads first (trainer_state.json, dcp/, rng_rank0.pt) and their
COMPLETE marker."""

import json

import pytest

from fastcrit.cli import main
from fastcrit.config import dump_yaml, load_config
from fastcrit.train.resume_check import check_resume

CONFIG = "configs/cpu/grpo.yaml"


def _finished_run(tmp_path, step=5, sets=()):
    out = tmp_path / "run"
    sets = [f"trainer.output_dir={out}", f"trainer.total_steps={step}", *sets]
    ckpt = out / "checkpoints" / f"step_{step}"
    (ckpt / "dcp").mkdir(parents=True)
    (ckpt / "trainer_state.json").write_text(json.dumps({"step": step, "world_size": 1}))
    (ckpt / "rng_rank0.pt").write_text("")
    (ckpt / "COMPLETE").write_text("")
    dump_yaml(load_config(CONFIG, sets), str(out / "config.yaml"))
    (out / "summary.json").write_text(json.dumps({"val_reward_end": 0.959}))
    return out, sets


def test_the_same_run_is_continued_or_finished(tmp_path):
    out, sets = _finished_run(tmp_path)
    assert check_resume(load_config(CONFIG, sets)) == ("finished", 5)
    more = [*sets, "trainer.total_steps=9"]
    assert check_resume(load_config(CONFIG, more)) is None  # continues to step 9
    # what a resumed run may change: its speed and logging settings, its evaluation
    free = [*more, "trainer.micro_batch_size=2", "trainer.eval_every=3", "data.val_size=8", "trainer.progress=false"]
    assert check_resume(load_config(CONFIG, free)) is None
    assert check_resume(load_config(CONFIG, [*sets, "trainer.resume=false"])) is None  # starts over


def test_other_settings_or_fewer_steps_are_refused_by_name(tmp_path):
    out, sets = _finished_run(tmp_path)
    with pytest.raises(ValueError, match=r"other settings .*optim\.lr: 0\.0003 -> 1e-05; rollout\.n: 8 -> 4") as e:
        check_resume(load_config(CONFIG, [*sets, "rollout.n=4", "optim.lr=1e-5", "trainer.total_steps=50"]))
    assert "trainer.output_dir to a new directory" in str(e.value)
    with pytest.raises(ValueError, match="trainer.total_steps=3, but .* step 5"):
        check_resume(load_config(CONFIG, [*sets, "trainer.total_steps=3"]))


def test_train_into_a_finished_run_trains_nothing_and_keeps_its_results(tmp_path, capsys):
    # The README's "Using it" line after `make demo` resumed runs/cpu-grpo at step 250, trained
    # nothing, and rewrote its config.yaml and summary.json (val reward "0.688 -> 0.688").
    out, sets = _finished_run(tmp_path)
    before = {p: (out / p).read_text() for p in ("config.yaml", "summary.json")}
    argv = ["train", CONFIG] + [a for s in sets for a in ("--set", s)]
    assert main(argv) == 0
    assert "finished at step 5" in capsys.readouterr().err
    assert main(["train", CONFIG, "--resume", str(out), "--set", "trainer.total_steps=5"]) == 0
    assert main(argv + ["--set", "rollout.n=4"]) == 2
    err = capsys.readouterr().err
    assert "config error" in err and "rollout.n: 8 -> 4" in err
    assert {p: (out / p).read_text() for p in before} == before


def test_a_missing_data_file_stops_before_any_model_loads_naming_its_key(tmp_path, capsys):
    # it was found after the SFT warm start (70 s on the demo's config), naming the file only
    out = tmp_path / "run"
    for argv, key in (
        (["train", CONFIG, "--set", "data.train=nofile.jsonl"], "data.train"),
        (["train", CONFIG, "--set", "data.val=reverse:nosplit"], "data.val"),
        (["train", CONFIG, "--set", "sft.data=/nonexistent/sft.jsonl"], "sft.data"),
        (["sft", "configs/cpu/sft.yaml", "--set", "sft.data=nofile.jsonl"], "sft.data"),
    ):
        assert main([*argv, "--set", f"trainer.output_dir={out}", "--set", f"sft.output_dir={out}/sft"]) == 2
        err = capsys.readouterr().err
        assert f"config error: {key}: " in err, err
        assert not out.exists()  # stopped before the run wrote anything


def test_a_checkpoint_that_cannot_be_continued_is_refused_before_launch(tmp_path, capsys):
    # a COMPLETE checkpoint without its trainer_state.json was reported once the ranks had started,
    # after the SFT warm start; another trainer.nproc than it was saved with, the same
    out, sets = _finished_run(tmp_path)
    ckpt = out / "checkpoints" / "step_5"
    more = [*sets, "trainer.total_steps=9"]
    (out / "config.yaml").rename(out / "saved.yaml")  # without it the settings are not compared
    with pytest.raises(ValueError, match=r"saved with 1 processes, continued with trainer.nproc=2"):
        check_resume(load_config(CONFIG, [*more, "trainer.nproc=2"]))
    (out / "saved.yaml").rename(out / "config.yaml")
    (ckpt / "rng_rank0.pt").unlink()
    with pytest.raises(ValueError, match=r"step_5: has no rng_rank0.pt, which continuing it reads; delete"):
        check_resume(load_config(CONFIG, more))
    (ckpt / "trainer_state.json").unlink()
    argv = ["train", CONFIG] + [a for s in more for a in ("--set", s)]
    assert main(argv) == 2
    assert "trainer_state.json cannot be read" in capsys.readouterr().err
    assert check_resume(load_config(CONFIG, sets)) == ("finished", 5)  # nothing to continue: not read
