"""Full weights out of FSDP2 shards a bucket at a time: what weight syncs and saves stream.

`gathered_buckets` equals `DTensor.full_tensor()` in any dtype, with one all-gather per bucket
(rows that do not divide by the world included); a save gathers on every rank and rank 0 alone
holds the model on the host, in the model's dtype; the engine's weights after a sync are the
policy's."""

import ctypes
import os

import pytest
import torch
import torch.distributed as dist

from fastcrit.config import OptimConfig
from fastcrit.train.actor import build_actor
from fastcrit.train.dist import launch

# intermediate 129: gate/up rows and down's columns that do not divide by 2 ranks
ODD = "tiny:hidden=64,layers=2,heads=2,kv_heads=1,intermediate=129"


def _gather(ctx, path, out_file):
    from fastcrit.train.policy import full_named_tensors, gathered_buckets

    actor = build_actor(path, dtype="float32", device=ctx.device, world_size=ctx.world_size, optim=OptimConfig(lr=1e-2))
    truth = {n: t.clone() for n, t in full_named_tensors(actor.module)}
    calls = [0]
    name = "all_gather_single" if hasattr(dist, "all_gather_single") else "all_gather_into_tensor"
    real = getattr(dist, name)

    def counting(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)

    setattr(dist, name, counting)
    res = {}
    try:
        for dtype in (None, torch.bfloat16):
            for bucket_bytes in (1, 20_000, 1 << 30):
                calls[0] = 0
                buckets = [[(n, t.clone()) for n, t in b] for b in gathered_buckets(actor.module, dtype, bucket_bytes)]
                res[(str(dtype), bucket_bytes)] = {"buckets": buckets, "calls": calls[0]}
    finally:
        setattr(dist, name, real)
    if ctx.is_main:
        torch.save({"truth": truth, "res": res}, out_file)


def test_buckets_equal_the_full_tensors_with_one_all_gather_each(tmp_path):
    from fastcrit.models.hf import resolve_model_path

    path = resolve_model_path(ODD)
    out = str(tmp_path / "g.pt")
    launch(_gather, (path, out), 2, "cpu")
    got = torch.load(out)
    truth = got["truth"]
    assert truth["model.layers.0.mlp.gate_proj.weight"].shape[0] == 129  # uneven shards really occur
    for (dtype, bucket_bytes), r in got["res"].items():
        names = [n for b in r["buckets"] for n, _ in b]
        assert names == list(truth), (dtype, bucket_bytes)  # every tensor once, in the model's order
        for b in r["buckets"]:
            for name, t in b:
                want = truth[name] if dtype == "None" else truth[name].to(torch.bfloat16)
                assert t.dtype == want.dtype, name
                torch.testing.assert_close(t, want, atol=0, rtol=0)
        assert r["calls"] == len(r["buckets"]), (dtype, bucket_bytes)  # one all-gather per bucket
    assert len(got["res"][("None", 1)]["buckets"]) == len(truth)  # a tensor larger than the bucket: alone
    assert len(got["res"][("None", 1 << 30)]["buckets"]) == 1


def _save(ctx, path, directory, out_file):
    from fastcrit.train.checkpoint import save_hf
    from fastcrit.train.memory import proc_status_kb, reset_rss_peak

    actor = build_actor(path, dtype="float32", device=ctx.device, world_size=ctx.world_size, optim=OptimConfig(lr=1e-2))
    model_bytes = sum(p.numel() for p in actor.module.parameters()) * 4
    # a first save pays the one-time costs (imports, the process group's first buffers), and the
    # heap it freed goes back to the system (glibc keeps freed pages resident otherwise); the
    # second save is measured
    save_hf(actor, None, directory + "_warm", ctx, dtype="bfloat16", bucket_bytes=2 << 20)
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    dist.barrier()
    before = proc_status_kb("VmRSS")["VmRSS"] * 1024
    assert reset_rss_peak()
    save_hf(actor, None, directory, ctx, dtype="bfloat16", bucket_bytes=2 << 20)
    peak = proc_status_kb("VmHWM")["VmHWM"] * 1024
    got = [None] * ctx.world_size
    dist.all_gather_object(got, peak - before)
    if ctx.is_main:
        torch.save({"growth": got, "model_bytes": model_bytes}, out_file)


def test_a_save_streams_rank_0_alone_holds_the_model_in_its_dtype(tmp_path):
    """The peak resident memory a save adds, measured per rank on a 2-rank CPU run (the second of
    two saves, with the heap the first freed given back): the other rank holds a few buckets of
    full tensors at a time (the whole fp32 model before streaming), rank 0 the model in bf16."""
    from fastcrit.models.hf import resolve_model_path
    from fastcrit.train.memory import reset_rss_peak

    if not reset_rss_peak():
        pytest.skip("this kernel refuses to reset the resident-set peak (/proc/self/clear_refs)")
    path = resolve_model_path("tiny:hidden=512,layers=6,heads=8,kv_heads=2,intermediate=2048")
    out, directory = str(tmp_path / "m.pt"), str(tmp_path / "hf")
    launch(_save, (path, directory, out), 2, "cpu")
    got = torch.load(out)
    fp32 = got["model_bytes"]
    assert fp32 > 60e6  # large enough for resident-set noise not to matter
    rank0, rank1 = got["growth"]
    # rank 1: a few buckets' worth (its piece, the gathered bucket, the full copies) and the heap's
    # fragments: a few tens of MB with 2 MiB buckets, whatever the model's size (without streaming
    # it would hold the whole fp32 model, over 1x)
    assert rank1 < 0.5 * fp32, got
    # rank 0: the model in bf16 (half the fp32 bytes), and safetensors' serialised copy of it
    assert 0.4 * fp32 < rank0 < 1.25 * fp32, got
    from safetensors import safe_open

    with safe_open(os.path.join(directory, "model.safetensors"), "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}
    with open(os.path.join(directory, "config.json")) as f:
        assert '"bfloat16"' in f.read()


def _root_after_forward(ctx, path, out_file):
    from test_actor import make_batch
    from torch.distributed.tensor import DTensor

    from fastcrit.train.actor import compute_logprobs

    actor = build_actor(path, dtype="float32", device=ctx.device, world_size=ctx.world_size, optim=OptimConfig(lr=1e-2))
    ref = build_actor(path, dtype="float32", device=ctx.device, world_size=ctx.world_size)
    embed = lambda a: a.module.lm.get_input_embeddings().weight
    b = make_batch(2)
    with torch.no_grad():  # FSDP2 alone: the root stays gathered after a forward without a backward
        actor.module(b.input_ids, b.attention_mask, b.position_ids, b.responses, b.response_mask)
    kept = not isinstance(embed(actor), DTensor)
    compute_logprobs(actor, b, 1.0, 8)
    compute_logprobs(ref, b, 1.0, 8)
    if ctx.is_main:
        torch.save(
            {
                "kept_by_fsdp": kept,
                "policy_sharded": isinstance(embed(actor), DTensor),
                "reference_sharded": isinstance(embed(ref), DTensor),
            },
            out_file,
        )


def test_forward_only_passes_leave_the_root_sharded(tiny_model_path, tmp_path):
    """The reference's and the policy's scoring passes free their gathered embeddings and lm_head
    (FSDP2 keeps the root gathered after a forward for a backward that never comes)."""
    out = str(tmp_path / "r.pt")
    launch(_root_after_forward, (tiny_model_path, out), 2, "cpu")
    got = torch.load(out)
    assert got == {"kept_by_fsdp": True, "policy_sharded": True, "reference_sharded": True}


def _load(ctx, path, out_file):
    from fastcrit.models.hf import load_model
    from fastcrit.train.memory import proc_status_kb, reset_rss_peak
    from fastcrit.train.policy import full_named_tensors
    from fastcrit.train.value import build_value_actor

    truth = {n: t.clone() for n, t in load_model(path).state_dict().items()}
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    dist.barrier()
    before = proc_status_kb("VmRSS")["VmRSS"] * 1024
    assert reset_rss_peak()
    actor = build_actor(path, dtype="float32", device=ctx.device, world_size=ctx.world_size, optim=OptimConfig(lr=1e-2))
    growth = proc_status_kb("VmHWM")["VmHWM"] * 1024 - before
    ref = build_actor(path, dtype="bfloat16", device=ctx.device, world_size=ctx.world_size)
    critic = build_value_actor(
        path, dtype="float32", device=ctx.device, world_size=ctx.world_size, optim=OptimConfig(lr=1e-2)
    )
    got = {
        "policy": dict(full_named_tensors(actor.module)),
        "reference": dict(full_named_tensors(ref.module)),
        "critic": dict(full_named_tensors(critic.module)),
        "rotary": [b.clone() for b in actor.module.buffers()],
    }
    growths = [None] * ctx.world_size
    dist.all_gather_object(growths, growth)
    if ctx.is_main:
        torch.save(
            {"truth": truth, "got": got, "growth": growths, "model_bytes": sum(t.numel() * 4 for t in truth.values())},
            out_file,
        )
    else:
        torch.save({"got": got}, out_file + ".rank1")


def test_rank_0_alone_reads_the_weights_and_every_rank_gets_them(tmp_path):
    """Two ranks build the policy, the reference and a value critic: the non-zero rank builds them
    weightless and receives its shards from rank 0, whose copy was read from disk. The gathered
    weights are the checkpoint's (the critic's fresh head the same on both ranks), the rotary
    buffers too, and while the policy loaded the other rank's resident memory grew by its shards,
    not by the whole fp32 model as rank 0's did (every rank read it before)."""
    from fastcrit.models.hf import resolve_model_path
    from fastcrit.train.memory import reset_rss_peak

    if not reset_rss_peak():
        pytest.skip("this kernel refuses to reset the resident-set peak (/proc/self/clear_refs)")
    path = resolve_model_path("tiny:hidden=512,layers=6,heads=8,kv_heads=2,intermediate=2048")
    out = str(tmp_path / "load.pt")
    launch(_load, (path, out), 2, "cpu")
    r0, r1 = torch.load(out), torch.load(out + ".rank1")
    for name, t in r0["got"]["policy"].items():
        torch.testing.assert_close(t, r0["truth"][name], atol=0, rtol=0)
        torch.testing.assert_close(r1["got"]["policy"][name], t, atol=0, rtol=0)
    for name, t in r0["got"]["reference"].items():
        torch.testing.assert_close(t, r0["truth"][name].to(torch.bfloat16), atol=0, rtol=0)
    for name, t in r0["got"]["critic"].items():
        torch.testing.assert_close(r1["got"]["critic"][name], t, atol=0, rtol=0)
        if not name.startswith("score"):
            torch.testing.assert_close(t, r0["truth"][name], atol=0, rtol=0)
    for a, b in zip(r0["got"]["rotary"], r1["got"]["rotary"]):
        assert torch.isfinite(b).all()
        torch.testing.assert_close(b, a, atol=0, rtol=0)
    # both ranks end with their fp32 shards (half the model each); rank 0 also held the whole model
    # it read, rank 1 about a tensor at a time more than its shards (before: the whole model too)
    rank0, rank1, model = *r0["growth"], r0["model_bytes"]
    assert rank1 < 0.8 * model and rank0 - rank1 > 0.6 * model, r0["growth"]
