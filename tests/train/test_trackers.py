"""trainer.loggers (fastcrit.train.trackers through RunLog): TensorBoard event files and W&B offline runs,
read back from disk, hold what metrics.jsonl holds at the same steps and the summary; every way out
closes them; a missing package stops at start with the key and the pip command.

The readers below parse the files as written (TFRecord frames of tensorboardX's Event protos; W&B's
record log of its Record protos), not through the writers' objects. The W&B tests need the `wandb`
package, which is not in the `test` extra (~30 packages): where it is absent they are skipped, and the
missing-package test runs instead.
"""

from __future__ import annotations

import glob
import json
import math
import os
import re
import signal
import struct
import subprocess
import sys

import pytest

from fastcrit.config import ConfigError
from fastcrit.train.metrics import RunLog
from fastcrit.train.preempt import Stopped
from fastcrit.train.trackers import TrackerSettings
from tests.recipes.recipe_cli import TINY_MODEL

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CPU_CONFIG = os.path.join(ROOT, "configs", "cpu", "grpo.yaml")


def _has(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


needs_wandb = pytest.mark.skipif(not _has("wandb"), reason="wandb is not installed (not in the test extra)")


# ------------------------------------------------------------------------------------------ readers


def tb_events(logdir: str):
    """Every Event of every event file in ``logdir``, file by file in the order they were written."""
    from tensorboardX.proto.event_pb2 import Event

    for path in sorted(glob.glob(os.path.join(logdir, "events.out.tfevents.*"))):  # by name, as TensorBoard
        data = open(path, "rb").read()
        pos = 0
        while pos < len(data):  # TFRecord: u64 length, u32 crc, payload, u32 crc
            (n,) = struct.unpack("<Q", data[pos : pos + 8])
            ev = Event()
            ev.ParseFromString(data[pos + 12 : pos + 12 + n])
            pos += 12 + n + 4
            yield ev


def tb_scalars(logdir: str) -> dict[int, dict[str, float]]:
    """step -> {tag: value}, as TensorBoard shows it: a file that starts with a session START at step
    s (SummaryWriter's purge_step) hides the earlier files' events at steps >= s."""
    from tensorboardX.proto.event_pb2 import SessionLog

    out: dict[int, dict[str, float]] = {}
    for ev in tb_events(logdir):
        if ev.HasField("session_log") and ev.session_log.status == SessionLog.START:
            for s in [s for s in out if s >= ev.step]:
                del out[s]
        for v in ev.summary.value:
            if v.HasField("simple_value"):
                out.setdefault(ev.step, {})[v.tag] = v.simple_value
    return out


def wandb_records(run_root: str) -> list:
    """The Record protos of the one W&B run under ``run_root``/wandb (LevelDB-style log: 7-byte file
    header, 32 KiB blocks of [crc u32, length u16, type u8] chunks; type 1 whole, 2..4 first/middle/last)."""
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = glob.glob(os.path.join(run_root, "wandb", "*run-*", "run-*.wandb"))
    data = open(path, "rb").read()
    assert data[:4] == b":W&B"
    records, pos, buf = [], 7, b""
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:
            pos += left
            continue
        _, n, kind = struct.unpack("<IHB", data[pos : pos + 7])
        buf += data[pos + 7 : pos + 7 + n]
        pos += 7 + n
        if kind in (1, 4):
            r = pb.Record()
            r.ParseFromString(buf)
            records.append(r)
            buf = b""
    return records


def wandb_history(records) -> dict[int, dict[str, float]]:
    out = {}
    for r in records:
        if r.WhichOneof("record_type") == "history":
            items = {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in r.history.item}
            out[r.history.step.num] = {k: v for k, v in items.items() if not k.startswith("_")}
    return out


def wandb_summary(records) -> dict:
    out = {}
    for r in records:
        if r.WhichOneof("record_type") == "summary":
            for i in r.summary.update:
                out[i.key or "/".join(i.nested_key)] = json.loads(i.value_json)
    return out


def wandb_exit_code(records) -> int | None:
    codes = [r.exit.exit_code for r in records if r.WhichOneof("record_type") == "exit"]
    return codes[-1] if codes else None


def jsonl_rows(out: str) -> dict[int, dict]:
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return {r["step"]: r for r in map(json.loads, f)}


def numeric(row: dict) -> dict[str, float]:
    """metrics.jsonl's numeric keys; null (a NaN or an infinity there) as NaN."""
    return {
        k: (math.nan if v is None else float(v))
        for k, v in row.items()
        if k != "step" and (v is None or isinstance(v, (int, float)))
    }


def tb_tags(d: dict[str, float]) -> dict[str, float]:
    """Keys as TensorBoard tags: characters outside [A-Za-z0-9_./-] become _ (val/pass@1 -> val/pass_1)."""
    return {re.sub(r"[^-/\w.]", "_", k): v for k, v in d.items()}


def same(a: dict[str, float], b: dict[str, float], rel: float = 1e-6) -> bool:
    """Same keys, values equal to float32 rounding (TensorBoard stores float32), NaN == NaN."""
    if a.keys() != b.keys():
        return False
    for k in a:
        x, y = a[k], b[k]
        if math.isnan(x) or math.isnan(y):
            if not (math.isnan(x) and math.isnan(y)):
                return False
        elif abs(x - y) > rel * max(1.0, abs(x)):
            return False
    return True


ROWS = [
    {
        "step": 1,
        "reward/mean": 0.25,
        "loss/policy": -1.5,
        "val/reward": 0.5,
        "kl/mean": float("nan"),
        "tokens": 12,
        "note": "not a number",
    },
    {"step": 2, "reward/mean": 0.75, "loss/policy": -1.25, "kl/mean": 0.01, "tokens": 14},
]
SUMMARY = {
    "steps": 2,
    "resumed_from": 0,
    "train_reward_first": 0.25,
    "val_reward_end": None,
    "eval": {"pass@1": 0.5},
    "checkpoint": "runs/x/checkpoints/step_2",
}


def _log(out: str, trackers: TrackerSettings, start: int = 0, rows=ROWS, summary=SUMMARY) -> None:
    with RunLog(out, enabled=True, total=2, start=start, progress=False, trackers=trackers) as log:
        for r in rows:
            log.log(r)
        if summary is not None:
            log.summary(2, summary)


# ------------------------------------------------------------------------------------- TensorBoard


def test_tensorboard_holds_the_metrics_rows_and_the_summary(tmp_path):
    out = str(tmp_path)
    _log(out, TrackerSettings(("tensorboard",)))
    got, rows = tb_scalars(os.path.join(out, "tensorboard")), jsonl_rows(out)
    summary = got.pop(2)  # step 2 holds the last row and the summary
    assert same({k: v for k, v in summary.items() if not k.startswith("summary/")}, numeric(rows[2]))
    assert same(
        {k: v for k, v in summary.items() if k.startswith("summary/")},
        tb_tags(
            {
                "summary/steps": 2,
                "summary/resumed_from": 0,
                "summary/train_reward_first": 0.25,
                "summary/eval/pass@1": 0.5,
            }
        ),
    )
    assert set(got) == {1} and same(got[1], numeric(rows[1]))
    texts = [
        v
        for ev in tb_events(os.path.join(out, "tensorboard"))
        for v in ev.summary.value
        if v.tag.startswith("summary") and v.metadata.plugin_data.plugin_name == "text"
    ]
    assert len(texts) == 1 and b"checkpoints/step_2" in texts[0].tensor.string_val[0]


def test_tensorboard_on_resume_shows_what_metrics_jsonl_keeps(tmp_path):
    """A crash after step 3 with the checkpoint at step 1: the resumed run's rows replace steps 2-3,
    in TensorBoard (purge_step) as in metrics.jsonl (truncated)."""
    out = str(tmp_path)
    first = [{"step": s, "reward/mean": float(s)} for s in (1, 2, 3)]
    _log(out, TrackerSettings(("tensorboard",)), rows=first, summary=None)
    _log(out, TrackerSettings(("tensorboard",)), start=1, summary=None, rows=[{"step": 2, "reward/mean": 20.0}])
    rows = jsonl_rows(out)
    assert sorted(rows) == [1, 2]
    got = tb_scalars(os.path.join(out, "tensorboard"))
    assert got == {s: numeric(r) for s, r in rows.items()}


@pytest.mark.parametrize("exc", [RuntimeError("boom"), Stopped(signal.SIGTERM, 1)], ids=["error", "sigterm"])
def test_tensorboard_is_flushed_and_closed_when_the_run_fails_or_stops(tmp_path, exc):
    out = str(tmp_path)
    with pytest.raises(type(exc)):
        with RunLog(
            out, enabled=True, total=5, start=0, progress=False, trackers=TrackerSettings(("tensorboard",))
        ) as log:
            log.log(ROWS[0])
            raise exc
    # tensorboardX writes every 10 events or 120 s: the row is on disk only because the writer closed
    assert same(tb_scalars(os.path.join(out, "tensorboard"))[1], numeric(jsonl_rows(out)[1]))
    assert log.trackers == []


def test_only_the_writing_rank_opens_trackers(tmp_path):
    with RunLog(
        str(tmp_path),
        enabled=False,
        total=2,
        start=0,
        progress=False,
        trackers=TrackerSettings(("tensorboard", "wandb")),
    ) as log:
        log.log(ROWS[0])
    assert os.listdir(tmp_path) == []


# ------------------------------------------------------------------------------------------- W&B


@needs_wandb
@pytest.mark.parametrize(
    "exc,code",
    [(None, 0), (RuntimeError("boom"), 1), (Stopped(signal.SIGTERM, 1), 143)],
    ids=["end", "error", "sigterm"],
)
def test_wandb_offline_run_holds_the_metrics_rows_summary_and_exit_code(tmp_path, monkeypatch, exc, code):
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = str(tmp_path)
    settings = TrackerSettings(("wandb",), "train", "proj", "myrun", "offline", {"trainer": {"seed": 3}})
    if exc is None:
        _log(out, settings)
    else:
        with pytest.raises(type(exc)):
            with RunLog(out, enabled=True, total=2, start=0, progress=False, trackers=settings) as log:
                for r in ROWS:
                    log.log(r)
                raise exc
    records = wandb_records(out)
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert (run.project, run.display_name, run.job_type) == ("proj", "myrun", "train")
    assert any(i.key == "trainer" and json.loads(i.value_json) == {"seed": 3} for i in run.config.update)
    history, rows = wandb_history(records), jsonl_rows(out)
    assert sorted(history) == [1, 2]
    for s in history:
        assert same(history[s], numeric(rows[s]))
    if exc is None:
        summary = {k: v for k, v in wandb_summary(records).items() if k.startswith("summary/")}
        assert summary == {
            "summary/steps": 2,
            "summary/resumed_from": 0,
            "summary/train_reward_first": 0.25,
            "summary/eval/pass@1": 0.5,
            "summary/checkpoint": "runs/x/checkpoints/step_2",
        }
    assert wandb_exit_code(records) == code


# --------------------------------------------------------------------------------- missing packages

BLOCK = r"""
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):  # as in an environment where {mod} is not installed
    def find_spec(self, name, path=None, target=None):
        if name == {mod!r} or name.startswith({mod!r} + "."):
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, Block())
from fastcrit.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize(
    "logger,module,pip",
    [("tensorboard", "tensorboardX", "pip install 'fastcrit[tensorboard]'"), ("wandb", "wandb", "pip install wandb")],
)
def test_a_logger_without_its_package_stops_at_start_naming_the_key_and_pip(tmp_path, logger, module, pip):
    out = str(tmp_path / "run")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([ROOT, os.path.join(ROOT, "kernels")]))
    p = subprocess.run(
        [
            sys.executable,
            "-c",
            BLOCK.format(mod=module),
            "train",
            CPU_CONFIG,
            "--set",
            f"trainer.loggers=[jsonl,{logger}]",
            "--set",
            f"trainer.output_dir={out}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=ROOT,
    )
    assert p.returncode == 2, p.stderr[-3000:]
    assert f"trainer.loggers names '{logger}', whose package {module} is not installed: {pip}" in p.stderr
    assert not os.path.exists(out)  # nothing started: no model built, no output directory


def test_runlog_refuses_a_logger_without_its_package(tmp_path, monkeypatch):
    """For callers that build a RunLog without the CLI: the same error before anything is written."""
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ConfigError, match=r"trainer.loggers names 'wandb'.*pip install wandb"):
        RunLog(str(tmp_path), enabled=True, total=2, start=0, progress=False, trackers=TrackerSettings(("wandb",)))
    assert not os.path.exists(os.path.join(tmp_path, "metrics.jsonl"))


# --------------------------------------------------------------------------------- a real GRPO run

SETS = [
    *TINY_MODEL,
    "data.prompts_per_step=2",
    "data.val_size=4",
    "rollout.n=4",
    "rollout.max_new_tokens=6",
    "sft.steps=2",
    "sft.batch_size=8",
    "optim.lr=1e-3",
    "algorithm.kl_coef=0.01",
    "trainer.micro_batch_size=4",
    "trainer.progress=false",
    "trainer.compute_threads=1",
    "trainer.total_steps=2",
    "trainer.eval_every=2",
]


def test_grpo_run_logs_the_same_rows_to_every_tracker(tmp_path, monkeypatch):
    """`fastcrit train` with trainer.loggers: each tracker holds metrics.jsonl's rows (train and val/
    keys) at the same steps and summary.json's numbers; the SFT warm start logs to its own."""
    from fastcrit.cli import main

    loggers = ["jsonl", "tensorboard"] + (["wandb"] if _has("wandb") else [])
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = str(tmp_path / "run")
    argv = ["train", CPU_CONFIG]
    for s in SETS + [
        f"trainer.output_dir={out}",
        f"trainer.loggers=[{','.join(loggers)}]",
        "trainer.wandb_mode=offline",
        "trainer.wandb_project=fc-test",
    ]:
        argv += ["--set", s]
    assert main(argv) == 0
    rows = jsonl_rows(out)
    assert sorted(rows) == [1, 2] and "val/reward" in rows[2] and "reward/mean" in rows[1]
    summary = json.load(open(os.path.join(out, "summary.json")))
    expect_summary = {
        f"summary/{k}": float(v) for k, v in summary.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
    }

    tb = tb_scalars(os.path.join(out, "tensorboard"))
    assert sorted(tb) == [1, 2]
    assert same(tb[1], tb_tags(numeric(rows[1])))
    assert same({k: v for k, v in tb[2].items() if not k.startswith("summary/")}, tb_tags(numeric(rows[2])))
    assert same({k: v for k, v in tb[2].items() if k.startswith("summary/")}, tb_tags(expect_summary))
    sft_rows = jsonl_rows(os.path.join(out, "sft"))
    sft_tb = tb_scalars(os.path.join(out, "sft", "tensorboard"))
    assert sorted(sft_tb) == sorted(sft_rows) == [1, 2]
    assert all(same(sft_tb[s], tb_tags(numeric(sft_rows[s]))) for s in sft_rows)

    if "wandb" in loggers:
        records = wandb_records(out)
        (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
        assert (run.project, run.display_name, run.job_type) == ("fc-test", "run", "train")
        history = wandb_history(records)
        assert sorted(history) == [1, 2] and all(same(history[s], numeric(rows[s])) for s in rows)
        got = {k: v for k, v in wandb_summary(records).items() if k.startswith("summary/")}
        assert got.pop("summary/checkpoint") == summary["checkpoint"]
        assert same({k: float(v) for k, v in got.items() if isinstance(v, (int, float))}, expect_summary)
        assert wandb_exit_code(records) == 0
        sft = wandb_records(os.path.join(out, "sft"))
        assert [r.run.display_name for r in sft if r.WhichOneof("record_type") == "run"] == ["run-sft"]
        assert sorted(wandb_history(sft)) == [1, 2]


def test_a_run_stopped_by_sigterm_closes_its_trackers(tmp_path):
    """A scheduler's SIGTERM mid-run: the run saves the step in progress and exits with 143; the
    trackers were closed on the way out (TensorBoard's buffered rows are on disk, W&B's run ends
    with exit code 143), each holding metrics.jsonl's rows."""
    import time

    loggers = ["jsonl", "tensorboard"] + (["wandb"] if _has("wandb") else [])
    out = str(tmp_path / "run")
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        WANDB_SILENT="true",
        PYTHONPATH=os.pathsep.join([ROOT, os.path.join(ROOT, "kernels")]),
    )
    argv = [sys.executable, "-m", "fastcrit.cli", "train", CPU_CONFIG]
    for s in SETS + [
        f"trainer.output_dir={out}",
        f"trainer.loggers=[{','.join(loggers)}]",
        "trainer.wandb_mode=offline",
        "trainer.total_steps=20",
        "sft.steps=0",
    ]:
        argv += ["--set", s]
    with open(tmp_path / "log", "w") as f:
        p = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        path, t0 = os.path.join(out, "metrics.jsonl"), time.monotonic()
        while not (os.path.exists(path) and open(path).read().count("\n") >= 1):
            assert p.poll() is None and time.monotonic() - t0 < 240, open(tmp_path / "log").read()[-3000:]
            time.sleep(0.02)
        os.kill(p.pid, signal.SIGTERM)
        assert p.wait(timeout=240) == 143, open(tmp_path / "log").read()[-3000:]
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    rows = jsonl_rows(out)
    assert 1 <= len(rows) < 20
    tb = tb_scalars(os.path.join(out, "tensorboard"))
    assert sorted(tb) == sorted(rows) and all(same(tb[s], tb_tags(numeric(rows[s]))) for s in rows)
    if "wandb" in loggers:
        records = wandb_records(out)
        history = wandb_history(records)
        assert sorted(history) == sorted(rows) and all(same(history[s], numeric(rows[s])) for s in rows)
        assert wandb_exit_code(records) == 143


def test_reward_model_stage_logs_its_rows_and_summary(tmp_path):
    """`fastcrit rm`: <output_dir>/rm/tensorboard holds rm/metrics.jsonl's rows and rm/summary.json's
    numbers."""
    from fastcrit.cli import main

    out = str(tmp_path / "run")
    argv = ["rm", os.path.join(ROOT, "configs", "cpu", "ppo.yaml")]
    for s in SETS[:6] + [
        "data.prompts_per_step=2",
        "sft.steps=0",
        "rm.steps=3",
        "rm.batch_size=8",
        "rm.val_fraction=0.01",
        "trainer.progress=false",
        "trainer.compute_threads=1",
        f"trainer.output_dir={out}",
        "trainer.loggers=[tensorboard]",
    ]:
        argv += ["--set", s]
    assert main(argv) == 0
    rm = os.path.join(out, "rm")
    rows, tb = jsonl_rows(rm), tb_scalars(os.path.join(rm, "tensorboard"))
    summary = json.load(open(os.path.join(rm, "summary.json")))
    assert sorted(tb) == sorted(rows) == [1, 2, 3]
    assert same(tb[1], tb_tags(numeric(rows[1]))) and same(tb[2], tb_tags(numeric(rows[2])))
    assert same({k: v for k, v in tb[3].items() if not k.startswith("summary/")}, tb_tags(numeric(rows[3])))
    assert same(
        {k: v for k, v in tb[3].items() if k.startswith("summary/")},
        tb_tags(
            {
                f"summary/{k}": float(v)
                for k, v in summary.items()
                if isinstance(v, (int, float)) and not isinstance(v, bool)
            }
        ),
    )
