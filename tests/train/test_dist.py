"""fastcrit.train.dist.launch: the environment it is given reaches every rank before the process
group starts (one process, two spawned, and the torchrun path), a value already set is kept, and the
caller's environment is left as it was."""

import json
import os

import pytest

from fastcrit.train.dist import DistError, launch

NCCL = ("NCCL_CUMEM_ENABLE", "NCCL_NVLS_ENABLE")


def _record_env(ctx, out_dir):
    with open(os.path.join(out_dir, f"rank{ctx.rank}.json"), "w") as f:
        json.dump({k: os.environ.get(k) for k in (*NCCL, "GLOO_SOCKET_IFNAME")}, f)


def _read(out_dir, rank):
    with open(os.path.join(out_dir, f"rank{rank}.json")) as f:
        return json.load(f)


@pytest.fixture
def clean_env():
    """Without the variables under test; the whole environment restored afterwards (launch's
    torchrun path leaves what it set, as a torchrun worker process would)."""
    saved = dict(os.environ)
    for k in (*NCCL, "GLOO_SOCKET_IFNAME"):
        os.environ.pop(k, None)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.mark.parametrize("nproc", [1, 2])
def test_the_environment_is_set_before_the_group_starts(tmp_path, clean_env, nproc):
    # gloo reads GLOO_SOCKET_IFNAME when the group is created: an interface that does not exist
    # fails the join, so the variable was there before it.
    with pytest.raises(DistError, match="fastcrit-none0"):
        launch(_record_env, (str(tmp_path),), nproc, "cpu", 30, env={"GLOO_SOCKET_IFNAME": "fastcrit-none0"})
    env = {"GLOO_SOCKET_IFNAME": "lo", "NCCL_CUMEM_ENABLE": "0", "NCCL_NVLS_ENABLE": "0"}
    launch(_record_env, (str(tmp_path),), nproc, "cpu", 30, env=env)
    for rank in range(nproc):
        assert _read(str(tmp_path), rank) == env
    assert all(k not in os.environ for k in env)  # the caller's environment as it was


def test_a_value_already_set_is_kept(tmp_path, clean_env):
    os.environ.update(GLOO_SOCKET_IFNAME="lo", NCCL_NVLS_ENABLE="1")
    launch(
        _record_env,
        (str(tmp_path),),
        1,
        "cpu",
        30,
        env={"GLOO_SOCKET_IFNAME": "fastcrit-none0", "NCCL_NVLS_ENABLE": "0", "NCCL_CUMEM_ENABLE": "0"},
    )
    assert _read(str(tmp_path), 0) == {"GLOO_SOCKET_IFNAME": "lo", "NCCL_NVLS_ENABLE": "1", "NCCL_CUMEM_ENABLE": "0"}


def test_under_torchrun_the_rank_gets_it_before_joining(tmp_path, clean_env):
    # The torchrun path of launch: this process is rank 0 of a world of 1 that torchrun started.
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(
        TORCHELASTIC_RUN_ID="test",
        RANK="0",
        LOCAL_RANK="0",
        WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    with pytest.raises(DistError, match="fastcrit-none0"):
        launch(_record_env, (str(tmp_path),), 1, "cpu", 30, env={"GLOO_SOCKET_IFNAME": "fastcrit-none0"})
    del os.environ["GLOO_SOCKET_IFNAME"]
    launch(_record_env, (str(tmp_path),), 1, "cpu", 30, env={"NCCL_CUMEM_ENABLE": "0", "NCCL_NVLS_ENABLE": "0"})
    assert _read(str(tmp_path), 0)["NCCL_CUMEM_ENABLE"] == "0"


def _record_threads(ctx, cfg):
    import torch

    with open(f"{cfg.trainer.output_dir}/threads-{ctx.rank}", "w") as f:
        f.write(str(torch.get_num_threads()))


def test_compute_threads_reach_spawned_ranks(tmp_path):
    """trainer.compute_threads is set in every rank: a spawned rank is a fresh process, where the
    launching process's torch.set_num_threads does not reach."""
    import torch

    from fastcrit.cli import _rank_entry
    from fastcrit.config import load_config
    from fastcrit.train.dist import launch

    want = 1 if torch.get_num_threads() != 1 else 2
    cfg = load_config(None, [f"trainer.compute_threads={want}", f"trainer.output_dir={tmp_path}", "trainer.nproc=2"])
    launch(_rank_entry, (cfg, _record_threads), 2, "cpu")
    assert [(tmp_path / f"threads-{r}").read_text() for r in range(2)] == [str(want)] * 2
