"""CTRL stage 1 across ranks: two gloo ranks (in a child process, as `fastcrit train` starts them)
write the same files as `fastcrit ctrl-synth` in one process, and so do chunks of another size; a
two-rank run killed with SIGKILL in
the middle of the stage (each rank with one chunk written and the next one half written) resumes,
with two ranks or with one, doing only the chunks that were not finished, and ends with the files
of the uninterrupted run."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from recipe_cli import run_cli

from fastcrit.data.problems import Problem
from fastcrit.data.tasks import task_path

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CPU_CONFIG = os.path.join(ROOT, "configs", "cpu", "ctrl.yaml")
TRAIN, VAL, K, CHUNK = 8, 4, 2, 2  # 4 training chunks and 2 held-out ones, 3 per rank of two
CHUNKS = [f"train_{i:05d}" for i in range(TRAIN // CHUNK)] + [f"val_{i:05d}" for i in range(VAL // CHUNK)]
FILES = ("solutions_train.jsonl", "solutions_val.jsonl", "critic_sft.jsonl", "synth_summary.json", "COMPLETE")

# Stage 1 on trainer.nproc ranks, the entry `fastcrit ctrl-synth` runs on one.
CHILD = r"""
import sys
from fastcrit.cli import _synth_entry
from fastcrit.config import load_config
from fastcrit.train.dist import launch
cfg = load_config(sys.argv[1], sys.argv[2:])
launch(_synth_entry, (cfg,), cfg.trainer.nproc, cfg.trainer.device, cfg.trainer.dist_timeout_s)
"""

# Loaded by every process of the child (the spawned ranks too) through PYTHONPATH. With
# SYNTH_PAUSE_AFTER=n, a rank's chunk write after its n-th leaves half of the chunk's rows in a
# temporary file (as a kill in the middle of writing would), marks the rank paused and waits there
# to be killed.
SITECUSTOMIZE = r"""
import os
if os.environ.get("SYNTH_PAUSE_AFTER"):
    import json, time
    from fastcrit.train import shards
    real, written = shards.ChunkFiles.write, []
    def write(self, chunk, rows):
        if len(written) == int(os.environ["SYNTH_PAUSE_AFTER"]):
            with open(os.path.join(self.directory, f".{chunk.name}.jsonl.killed.tmp"), "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in rows[:len(rows) // 2])
            open(os.path.join(os.environ["SYNTH_PAUSE_DIR"], "rank" + os.environ["RANK"]), "w").close()
            time.sleep(600)
        real(self, chunk, rows)
        written.append(chunk.name)
    shards.ChunkFiles.write = write
"""


def write_problems(path, split: str, n: int) -> str:
    with open(task_path("minicode", split)) as f:
        rows = [Problem.from_dict(json.loads(line)).to_dict() for _, line in zip(range(n), f)]
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return str(path)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """Problems, the tiny coder, the hook directory, and the one-process reference run."""
    d = tmp_path_factory.mktemp("synth")
    from fastcrit.models.hf import resolve_model_path

    model = resolve_model_path("tiny:hidden=64,layers=2,heads=2,kv_heads=1,intermediate=128")
    sets = [
        f"model.path={model}",
        f"proxy.model.path={model}",
        f"data.train={write_problems(d / 'train.jsonl', 'train', TRAIN)}",
        f"data.val={write_problems(d / 'val.jsonl', 'test', VAL)}",
        f"data.val_size={VAL}",
        f"ctrl.solutions_per_problem={K}",
        f"ctrl.synth_chunk={CHUNK}",
        "ctrl.solution_temperature=1.0",
        "proxy.rollout.max_new_tokens=8",
        "trainer.seed=1",
        "trainer.compute_threads=1",
        "trainer.progress=false",
        "sandbox.workers=1",
    ]
    hooks = d / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(SITECUSTOMIZE)
    ref = str(d / "ref")
    assert run_cli("ctrl-synth", CPU_CONFIG, sets, f"trainer.output_dir={ref}") == 0
    return {"sets": sets, "hooks": str(hooks), "ref": os.path.join(ref, "synth")}


def start(setup, out: str, log: str, nproc: int, **env) -> subprocess.Popen:
    argv = [
        sys.executable,
        "-c",
        CHILD,
        CPU_CONFIG,
        *setup["sets"],
        f"trainer.output_dir={out}",
        f"trainer.nproc={nproc}",
    ]
    child_env = dict(os.environ, OMP_NUM_THREADS="1", **env)  # the ranks compute as the reference does
    child_env["PYTHONPATH"] = os.pathsep.join(
        [setup["hooks"], ROOT, os.path.join(ROOT, "kernels"), child_env.get("PYTHONPATH", "")]
    )
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"):
        child_env.pop(k, None)
    with open(log, "w") as f:  # a session of its own: the kill reaches the ranks it spawns
        return subprocess.Popen(
            argv, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=child_env, start_new_session=True
        )


def finish(proc: subprocess.Popen, log: str) -> str:
    try:
        rc = proc.wait(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    text = open(log).read()
    assert rc == 0, text
    return text


def chunks_done(log_text: str) -> dict[str, list[int]]:
    """Chunk name -> the ranks that reported doing it (each rank prints one line per chunk; the
    ranks share the log, so a line may follow another rank's unfinished progress bar)."""
    out: dict[str, list[int]] = {}
    for rank, name in re.findall(r"ctrl-synth: rank (\d+): (\w+_\d{5}) ", log_text):
        out.setdefault(name, []).append(int(rank))
    return out


def assert_same_files(ref: str, synth: str) -> None:
    for name in FILES:
        with open(os.path.join(ref, name), "rb") as a, open(os.path.join(synth, name), "rb") as b:
            assert a.read() == b.read(), name
    assert sorted(os.listdir(synth)) == sorted(FILES)  # the chunks went once every rank had seen COMPLETE


def test_synth_on_two_ranks_writes_the_files_of_one_process(setup, tmp_path):
    out = str(tmp_path / "two")
    text = finish(start(setup, out, str(tmp_path / "two.log"), 2), str(tmp_path / "two.log"))
    done = chunks_done(text)
    # Dealt round robin: each rank did its own three chunks, once.
    assert done == {name: [i % 2] for i, name in enumerate(CHUNKS)}, text
    assert_same_files(setup["ref"], os.path.join(out, "synth"))
    with open(os.path.join(setup["ref"], "solutions_train.jsonl")) as f:
        sols = [json.loads(line)["solution"] for line in f]
    assert len(sols) == TRAIN * K and len(set(sols)) > TRAIN  # sampled: the files compare real draws


def test_synth_samples_do_not_depend_on_the_chunks_that_draw_them(setup, tmp_path):
    """Solution j of a split draws from the split's seed + j in any chunk: one chunk per split (one
    generate call, as a single process drew them before stage 1 was cut into chunks) writes the
    same files as chunks of two problems."""
    out = str(tmp_path / "whole")
    assert (
        run_cli("ctrl-synth", CPU_CONFIG, setup["sets"], f"trainer.output_dir={out}", f"ctrl.synth_chunk={TRAIN}") == 0
    )
    assert_same_files(setup["ref"], os.path.join(out, "synth"))


@pytest.mark.parametrize("rerun_ranks", [2, 1])
def test_killed_synth_resumes_without_redoing_finished_chunks(setup, tmp_path, capsys, rerun_ranks):
    out = str(tmp_path / "killed")
    parts = os.path.join(out, "synth", "parts")
    paused, log = tmp_path / "paused", str(tmp_path / "killed.log")
    paused.mkdir()
    proc = start(setup, out, log, 2, SYNTH_PAUSE_AFTER="1", SYNTH_PAUSE_DIR=str(paused))
    t0 = time.monotonic()
    while sorted(os.listdir(paused)) != ["rank0", "rank1"]:
        if proc.poll() is not None or time.monotonic() - t0 > 240:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"the run did not pause (rc {proc.poll()}):\n{open(log).read()}")
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL
    finished = sorted(n[: -len(".jsonl")] for n in os.listdir(parts) if n.endswith(".jsonl") and n[0] != ".")
    assert finished == [CHUNKS[0], CHUNKS[1]]  # each rank's first chunk
    assert len([n for n in os.listdir(parts) if n.endswith(".killed.tmp")]) == 2  # and half of its second
    assert not os.path.exists(os.path.join(out, "synth", "COMPLETE"))
    before = os.listdir(parts)

    capsys.readouterr()
    # Other settings than the chunks were made with: refused, naming the setting; nothing touched.
    assert (
        run_cli(
            "ctrl-synth", CPU_CONFIG, setup["sets"], f"trainer.output_dir={out}", f"ctrl.solutions_per_problem={K + 1}"
        )
        == 2
    )
    err = capsys.readouterr().err
    assert f"splits.train.solutions_per_problem: {K} there, {K + 1} now" in err and "Restore the settings" in err
    assert sorted(os.listdir(parts)) == sorted(before)

    if rerun_ranks == 1:  # `fastcrit ctrl-synth` in this process: a world of one
        assert run_cli("ctrl-synth", CPU_CONFIG, setup["sets"], f"trainer.output_dir={out}") == 0
        text = capsys.readouterr().out
    else:
        text = finish(start(setup, out, str(tmp_path / "rerun.log"), 2), str(tmp_path / "rerun.log"))
    assert f"resuming, {len(finished)} already written" in text, text
    done = chunks_done(text)
    assert sorted(done) == sorted(set(CHUNKS) - set(finished)), text  # the rest, and only the rest
    assert all(len(ranks) == 1 for ranks in done.values()), text  # each once
    assert_same_files(setup["ref"], os.path.join(out, "synth"))


def test_rank_sandbox_shares_the_node_among_its_ranks():
    from fastcrit.recipes.ctrl.synthesis import rank_sandbox
    from fastcrit.sandbox.types import SandboxConfig

    node = SandboxConfig(workers=16, max_concurrency=256, remote_concurrency=32)
    one = rank_sandbox(node, 8)
    assert (one.workers, one.max_concurrency, one.remote_concurrency) == (2, 32, 4)
    assert one.timeout_s == node.timeout_s and one.memory_mb == node.memory_mb
    few = rank_sandbox(SandboxConfig(workers=3, max_concurrency=5, remote_concurrency=1), 8)
    assert (few.workers, few.max_concurrency, few.remote_concurrency) == (1, 1, 1)  # at least one each
    every_cpu = rank_sandbox(SandboxConfig(workers=0), 2)  # 0 = every CPU of the node, shared out
    assert every_cpu.workers == max(1, (os.cpu_count() or 1) // 2)


def test_synth_counts_its_chunks_on_a_progress_bar(setup, tmp_path, monkeypatch, capsys):
    bars = []

    class RecordingBar:
        def __init__(self, **kw):
            self.kw, self.n, self.closed = kw, 0, False
            bars.append(self)

        def update(self, n):
            self.n += n

        def write(self, text, file=None):
            print(text, file=file)

        def close(self):
            self.closed = True

    monkeypatch.setattr("fastcrit.recipes.ctrl.synthesis.tqdm", RecordingBar)
    out = str(tmp_path / "bar")
    sets = [s for s in setup["sets"] if not s.startswith("trainer.progress=")]
    assert run_cli("ctrl-synth", CPU_CONFIG, sets, f"trainer.output_dir={out}") == 0  # progress: the default
    (bar,) = bars
    assert bar.kw["total"] == bar.n == len(CHUNKS) and bar.closed
    assert bar.kw["file"] is sys.stderr and bar.kw["disable"] is None  # none when stderr is no terminal
    assert sorted(chunks_done(capsys.readouterr().out)) == CHUNKS  # each chunk's line, above the bar
    assert_same_files(setup["ref"], os.path.join(out, "synth"))
