"""SGLangEngine: its pure pieces on CPU (request building, stop ids, finish reasons, success flags,
buckets, memory share, the weight ledger), and the engine itself against the native engine on a
CUDA GPU with sglang (skipped elsewhere). Nothing here stands in for SGLang: the CPU tests call the
functions the engine calls on SGLang's inputs and outputs, in the shapes SGLang 0.5.23 uses."""

from types import SimpleNamespace

import pytest
import torch

from fastcrit.rollout.sglang import (
    WeightLedger,
    buckets,
    check_success,
    engine_tensor,
    finish_reason,
    request_params,
    sglang_mem_fraction,
    to_rollout,
)
from fastcrit.types import SamplingParams


def test_module_imports_without_sglang():
    import sys

    import fastcrit.rollout.sglang as mod

    assert hasattr(mod, "SGLangEngine")
    if not torch.cuda.is_available():  # sglang is imported only when an engine is built
        assert "sglang" not in sys.modules


# ---------------------------------------------------------------------------------------- requests


def test_request_params_send_the_eos_set_and_the_params_stops():
    p = SamplingParams(n=3, max_new_tokens=7, temperature=0.0, top_p=0.9, top_k=5, stop_token_ids=[11, 2])
    got = request_params(p, 6, stop_ids=[2, 9], deterministic=False)
    assert got == {
        "n": 1,
        "max_new_tokens": 7,
        "temperature": 0.0,
        "top_p": 0.9,
        "top_k": 5,
        "stop_token_ids": [2, 9, 11],
    }


def test_request_params_send_stop_strings_and_penalties_only_when_set():
    p = SamplingParams(stop=["\n\n", "Question:"], frequency_penalty=0.5, repetition_penalty=1.1)
    got = request_params(p, 2, stop_ids=[1], deterministic=False)
    assert got["stop"] == ["\n\n", "Question:"] and got["frequency_penalty"] == 0.5
    assert got["repetition_penalty"] == 1.1 and "presence_penalty" not in got
    assert "stop" not in request_params(SamplingParams(), 2, stop_ids=[1], deterministic=False)
    for p in (SamplingParams(top_logprobs=2), SamplingParams(logit_bias={3: 1.0})):
        with pytest.raises(ValueError, match="not forwarded to SGLang"):
            request_params(p, 1, stop_ids=[1], deterministic=False)


def test_a_seed_is_sent_only_to_a_deterministic_engine():
    p = SamplingParams(n=2, max_new_tokens=4, seed=100)
    shared = request_params(p, 4, stop_ids=[1], deterministic=False)
    assert isinstance(shared, dict) and "sampling_seed" not in shared
    per_request = request_params(p, 4, stop_ids=[1], deterministic=True)
    assert [r["sampling_seed"] for r in per_request] == [100, 101, 102, 103]
    assert all(r["stop_token_ids"] == [1] and r["n"] == 1 for r in per_request)
    unseeded = request_params(SamplingParams(), 4, stop_ids=[1], deterministic=True)
    assert isinstance(unseeded, dict) and "sampling_seed" not in unseeded


# ---------------------------------------------------------------------------------------- outputs


def _out(triples, kind, **extra):
    fr = {"type": kind, **extra} if kind is not None else None
    return {"output_ids": [t[1] for t in triples], "meta_info": {"finish_reason": fr, "output_token_logprobs": triples}}


def test_finish_reasons():
    assert finish_reason({"finish_reason": {"type": "stop", "matched": 2}}) == "stop"
    assert finish_reason({"finish_reason": {"type": "length", "length": 8}}) == "length"
    with pytest.raises(RuntimeError, match="aborted a request: out of memory"):
        finish_reason({"finish_reason": {"type": "abort", "message": "out of memory", "status_code": None}})
    with pytest.raises(RuntimeError, match="did not finish"):
        finish_reason({"finish_reason": None})


def test_to_rollout_reads_ids_and_logprobs_from_the_same_triples():
    r = to_rollout(1, [5, 6], _out([(-0.5, 7, None), (-1.25, 2, None)], "stop", matched=2))
    assert (r.prompt_index, r.prompt_ids, r.output_ids, r.logprobs, r.finish_reason) == (
        1,
        [5, 6],
        [7, 2],
        [-0.5, -1.25],
        "stop",
    )
    bad = _out([(-0.5, 7, None)], "length")
    bad["output_ids"] = [8]
    with pytest.raises(RuntimeError, match="disagree"):
        to_rollout(0, [5], bad)
    with pytest.raises(RuntimeError, match="aborted"):
        to_rollout(0, [5], _out([(-0.5, 7, None)], "abort", message="cancelled"))


def test_check_success_raises_on_a_false_flag():
    assert check_success((True, "Success"), "begin_weight_update") == "Success"
    with pytest.raises(RuntimeError, match="update_weights_from_tensor failed: must run between"):
        check_success(
            (False, "must run between begin_weight_update() and end_weight_update()"), "update_weights_from_tensor"
        )
    # flush_cache answers with a FlushCacheReqOutput(success, message)
    assert check_success(SimpleNamespace(success=True, message=""), "flush_cache") == ""
    with pytest.raises(RuntimeError, match="flush_cache failed"):
        check_success(SimpleNamespace(success=False, message="requests are running"), "flush_cache")
    with pytest.raises(TypeError, match="expected a"):  # e.g. release_memory_occupation's None
        check_success(None, "release_memory_occupation")
    with pytest.raises(TypeError, match="not a bool"):
        check_success(SimpleNamespace(success="yes"), "flush_cache")


# ---------------------------------------------------------------------------------------- weights


def test_buckets_group_by_bytes_in_order_and_lazily():
    sizes = [3, 3, 10, 1, 1, 1]  # float32 elements: 12, 12, 40, 4, 4, 4 bytes
    pulled = []

    def named():
        for i, n in enumerate(sizes):
            pulled.append(i)
            yield f"w{i}", torch.zeros(n)

    it = buckets(named(), 24)
    first = next(it)
    assert [n for n, _ in first] == ["w0", "w1"] and pulled == [0, 1, 2]  # w2 starts the next bucket
    rest = [[n for n, _ in b] for b in it]
    assert rest == [["w2"], ["w3", "w4", "w5"]]  # a tensor larger than a bucket is one of its own
    with pytest.raises(ValueError):
        next(buckets(named(), 0))


def test_memory_share_of_the_device_becomes_a_share_of_what_is_free():
    gib = 1 << 30
    assert sglang_mem_fraction(0.5, 80 * gib, 80 * gib) == pytest.approx(0.5)
    # the trainer holds 30 GiB: 40 GiB of 80 is 0.8 of the 50 that are free
    assert sglang_mem_fraction(0.5, 50 * gib, 80 * gib) == pytest.approx(0.8)
    with pytest.raises(RuntimeError, match="only 30.0 GiB is free"):
        sglang_mem_fraction(0.5, 30 * gib, 80 * gib)
    with pytest.raises(ValueError):
        sglang_mem_fraction(1.0, 80 * gib, 80 * gib)


def test_weight_ledger_refuses_generation_until_a_full_load_after_wake():
    ledger = WeightLedger()
    assert ledger.valid  # weights from disk
    ledger.loaded(["a", "b", "c"])
    ledger.woke()
    assert not ledger.valid and ledger.missing() == ["a", "b", "c"]
    ledger.loaded(["a"])
    assert not ledger.valid and ledger.missing() == ["b", "c"]
    ledger.loaded(["b", "c"])
    assert ledger.valid
    ledger.failed()  # a partial update: SGLang says discard the whole weights
    assert not ledger.valid
    ledger.loaded(["a", "b", "c"])
    assert ledger.valid


def test_weight_ledger_needs_a_load_after_a_wake_before_any_load():
    ledger = WeightLedger()
    ledger.woke()
    assert not ledger.valid and ledger.missing() == []
    ledger.loaded([])
    assert not ledger.valid
    ledger.loaded(["a"])
    assert ledger.valid


def test_weight_ledger_with_a_cpu_backup_stays_valid():
    ledger = WeightLedger(restores_on_wake=True)
    ledger.loaded(["a"])
    ledger.woke()
    assert ledger.valid


def _refuse_dtensor(ctx):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    sharded = distribute_tensor(torch.ones(4, 2), init_device_mesh("cpu", (1,)), [Shard(0)])
    with pytest.raises(TypeError, match="'lm_head.weight' is a sharded DTensor"):
        engine_tensor("lm_head.weight", sharded, torch.device("cpu"))


def test_load_weights_refuses_a_dtensor():
    """Gathering is a collective, which stays in train/ (full_named_tensors hands full tensors)."""
    from fastcrit.train.dist import launch

    launch(_refuse_dtensor, (), 1, "cpu")


def test_engine_tensor_keeps_a_tensor_on_its_device():
    t = torch.ones(3, requires_grad=True)
    out = engine_tensor("w", t, torch.device("cpu"))
    assert not out.requires_grad and out.data_ptr() == t.data_ptr()


# ---------------------------------------------------------------------------------------- config


def test_config_refuses_overlapping_tensor_parallel_engines():
    from fastcrit.config import ConfigError, load_config

    load_config(sets=["rollout.engine=sglang", "rollout.tp_size=2", "trainer.nproc=1"])
    load_config(sets=["rollout.engine=native", "rollout.tp_size=2", "trainer.nproc=2"])  # tp_size unused
    with pytest.raises(ConfigError, match="engines would overlap"):
        load_config(sets=["rollout.engine=sglang", "rollout.tp_size=2", "trainer.nproc=2"])
    with pytest.raises(ConfigError, match="proxy.rollout.tp_size"):
        load_config(sets=["proxy.rollout.engine=sglang", "proxy.rollout.tp_size=2", "trainer.nproc=2"])
    with pytest.raises(ConfigError, match="mem_fraction_static"):
        load_config(sets=["rollout.mem_fraction_static=1.0"])


def test_config_refuses_two_in_process_engines_of_different_tp_size():
    from fastcrit.config import ConfigError, load_config

    both = ["rollout.engine=sglang", "proxy.rollout.engine=sglang", "rollout.tp_size=2"]
    with pytest.raises(ConfigError, match="share SGLang's process-wide settings"):
        load_config(sets=both)
    load_config(sets=[*both, "proxy.rollout.tp_size=2"])
    load_config(sets=[*both, "proxy.endpoint=http://127.0.0.1:8000/v1"])  # the proxy runs elsewhere
    load_config(sets=["rollout.engine=sglang", "proxy.rollout.engine=native", "rollout.tp_size=2"])


def test_engine_args_reach_the_engine(tiny_model_path):
    from fastcrit.config import ConfigError, load_config
    from fastcrit.rollout import make_engine

    cfg = load_config(sets=["rollout.engine_args={max_batch: 3, compact_fraction: 0.5}"])
    assert cfg.rollout.engine_args == {"max_batch": 3, "compact_fraction": 0.5}
    eng = make_engine(cfg.rollout, tiny_model_path, dtype="float32", device=torch.device("cpu"))
    assert (eng.max_batch, eng.compact_fraction) == (3, 0.5)
    eng.close()
    bad = load_config(sets=["rollout.engine_args={enable_deterministic_inference: true}"])
    with pytest.raises(ValueError, match="not NativeEngine arguments"):
        make_engine(bad.rollout, tiny_model_path, dtype="float32", device=torch.device("cpu"))
    with pytest.raises(ConfigError, match="rollout.engine_args: expected a mapping"):
        load_config(sets=["rollout.engine_args=3"])


# ---------------------------------------------------------------------------------------- on a GPU


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU; this machine has none")
    pytest.importorskip("sglang")
    from fastcrit.config import RolloutConfig
    from fastcrit.models.hf import load_tokenizer
    from fastcrit.models.tiny import build_tiny_model
    from fastcrit.rollout.sglang import SGLangEngine

    d = build_tiny_model(
        str(tmp_path_factory.mktemp("tiny") / "m"), hidden=128, layers=2, heads=2, kv_heads=1, intermediate=256, seed=1
    )
    eng = SGLangEngine(
        d, RolloutConfig(mem_fraction_static=0.3), dtype="float32", device="cuda:0", disable_cuda_graph=True
    )
    yield d, eng, load_tokenizer(d)
    eng.close()


@pytest.mark.gpu
def test_greedy_and_logprobs_match_native(setup):
    from fastcrit.rollout.native import NativeEngine

    d, eng, tok = setup
    prompts = [
        tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, return_dict=False)
        for t in ("reverse abc", "hi there")
    ]
    params = SamplingParams(n=2, max_new_tokens=8, temperature=0.0)
    got = eng.generate(prompts, params)
    ref = NativeEngine(d, dtype="float32", device="cuda").generate(prompts, params)
    assert [r.prompt_index for r in got] == [0, 0, 1, 1]
    for a, b in zip(got, ref):
        assert a.output_ids[:4] == b.output_ids[:4]
        k = min(len(a.logprobs), len(b.logprobs), 4)
        assert torch.allclose(torch.tensor(a.logprobs[:k]), torch.tensor(b.logprobs[:k]), atol=2e-3)


@pytest.mark.gpu
def test_sleep_wake_and_weight_sync(setup):
    from fastcrit.models.hf import load_model

    d, eng, tok = setup
    prompts = [[1, 50, 60, 70]]
    params = SamplingParams(max_new_tokens=6, temperature=0.0)
    before = eng.generate(prompts, params)[0].output_ids
    state = load_model(d).state_dict()
    first, eos = before[0], tok.eos_token_id
    swapped = dict(state)
    head = state["lm_head.weight"].clone()
    head[[first, eos]] = head[[eos, first]]
    swapped["lm_head.weight"] = head
    eng.sleep()
    eng.wake()
    with pytest.raises(RuntimeError, match="load the full set"):  # the resumed weights hold no values
        eng.generate(prompts, params)
    eng.load_weights(swapped.items())  # one session: every weight, the head swapped
    assert eng.generate(prompts, params)[0].output_ids == [eos]
    eng.load_weights(state.items())
    assert eng.generate(prompts, params)[0].output_ids == before


# ---------------------------------------------------------------------------------------- environment


def test_nccl_env_is_what_sglang_sets_and_keeps_the_users_values():
    from fastcrit.rollout.sglang import nccl_env

    # 0.5.23 engine.py:1897-1914 with the defaults (no symmetric memory, no NVLS): both off.
    assert nccl_env({}, {}) == {"NCCL_CUMEM_ENABLE": "0", "NCCL_NVLS_ENABLE": "0"}
    assert nccl_env({"enable_nccl_nvls": True}, {}) == {"NCCL_CUMEM_ENABLE": "0", "NCCL_NVLS_ENABLE": "1"}
    assert nccl_env({"enable_symm_mem": True}, {}) == {"NCCL_CUMEM_ENABLE": "1", "NCCL_NVLS_ENABLE": "1"}
    # SGLang keeps a value the user set unless a flag asks for another: so do we.
    assert nccl_env({}, {"NCCL_CUMEM_ENABLE": "1"}) == {"NCCL_NVLS_ENABLE": "0"}
    assert nccl_env({}, {"NCCL_CUMEM_ENABLE": "1", "NCCL_NVLS_ENABLE": "1"}) == {}
    assert nccl_env({"enable_symm_mem": True}, {"NCCL_CUMEM_ENABLE": "1"}) == {"NCCL_NVLS_ENABLE": "1"}
    with pytest.raises(ValueError, match="NCCL_CUMEM_ENABLE=0, but SGLang sets NCCL_CUMEM_ENABLE=1"):
        nccl_env({"enable_symm_mem": True}, {"NCCL_CUMEM_ENABLE": "0"})
    with pytest.raises(ValueError, match="NCCL_NVLS_ENABLE=0, but SGLang sets NCCL_NVLS_ENABLE=1"):
        nccl_env({"enable_nccl_nvls": True}, {"NCCL_NVLS_ENABLE": "0"})


def test_sigterm_is_taken_back_from_an_event_loop_that_registered_it():
    # What SGLang's TokenizerManager does in the trainer's process (0.5.23
    # managers/tokenizer_manager.py:2453-2456): loop.add_signal_handler(SIGTERM, ...).
    import asyncio
    import os
    import signal

    from fastcrit.rollout.sglang import keep_signal

    got = []

    def ours(signum, frame):
        got.append("ours")

    before = signal.signal(signal.SIGTERM, ours)
    loop = asyncio.new_event_loop()
    try:
        loop.add_signal_handler(signal.SIGTERM, lambda: got.append("sglang"))
        keep_signal(loop, signal.SIGTERM, ours)
        assert signal.getsignal(signal.SIGTERM) is ours  # else the kill below would end this process
        os.kill(os.getpid(), signal.SIGTERM)
        loop.run_until_complete(asyncio.sleep(0.05))  # where the loop's handler would have run
        assert got == ["ours"]
    finally:
        loop.close()
        signal.signal(signal.SIGTERM, before)
