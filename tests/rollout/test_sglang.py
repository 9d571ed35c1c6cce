"""SGLangEngine against the native engine and a full forward pass. Needs a CUDA GPU and sglang."""
import pytest
import torch

from fastcrit.types import SamplingParams


def test_module_imports_without_sglang():
    import sys

    import fastcrit.rollout.sglang as mod

    assert hasattr(mod, "SGLangEngine")
    if not torch.cuda.is_available():  # sglang is imported only when an engine is built
        assert "sglang" not in sys.modules


def _refuse_dtensor(ctx):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from fastcrit.rollout.sglang import SGLangEngine

    # The refusal comes before anything reaches SGLang, so it is checked on an engine object that
    # was never started (no GPU, no sglang needed): only the state load_weights reads is set.
    eng = object.__new__(SGLangEngine)
    eng._closed, eng._asleep = False, False
    sharded = distribute_tensor(torch.ones(4, 2), init_device_mesh("cpu", (1,)), [Shard(0)])
    with pytest.raises(TypeError, match="'lm_head.weight' is a sharded DTensor"):
        eng.load_weights([("lm_head.weight", sharded)])


def test_load_weights_refuses_a_dtensor():
    """Gathering is a collective, which stays in train/ (full_named_tensors hands full tensors)."""
    from fastcrit.train.dist import launch

    launch(_refuse_dtensor, (), 1, "cpu")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    pytest.importorskip("sglang")
    from fastcrit.models.hf import load_tokenizer
    from fastcrit.models.tiny import build_tiny_model
    from fastcrit.rollout.sglang import SGLangEngine

    d = build_tiny_model(str(tmp_path_factory.mktemp("tiny") / "m"), hidden=128, layers=2, heads=2, kv_heads=1,
                         intermediate=256, seed=1)
    from fastcrit.config import RolloutConfig

    eng = SGLangEngine(d, RolloutConfig(mem_fraction_static=0.3), dtype="float32", device="cuda:0",
                       disable_cuda_graph=True)
    yield d, eng, load_tokenizer(d)
    eng.close()


@pytest.mark.gpu
def test_greedy_and_logprobs_match_native(setup):
    from fastcrit.rollout.native import NativeEngine

    d, eng, tok = setup
    prompts = [tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True,
                                       return_dict=False) for t in ("reverse abc", "hi there")]
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
    head = state["lm_head.weight"].clone()
    head[[first, eos]] = head[[eos, first]]
    eng.sleep()
    eng.wake()
    eng.load_weights([("lm_head.weight", head)])
    assert eng.generate(prompts, params)[0].output_ids == [eos]
    eng.load_weights(state.items())
    assert eng.generate(prompts, params)[0].output_ids == before
