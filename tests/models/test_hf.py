import os

import pytest
import torch

from fastcrit.models.hf import load_model, load_tokenizer, resolve_model_path, save_pretrained_safetensors


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from fastcrit.models.tiny import build_tiny_model
    from fastcrit.models.tokenizer import default_corpus

    d = str(tmp_path_factory.mktemp("tiny") / "m")
    return build_tiny_model(
        d,
        hidden=32,
        layers=2,
        heads=4,
        kv_heads=2,
        intermediate=64,
        vocab_size=300,
        corpus=default_corpus(use_human_eval=False),
    )


def test_missing_paths_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve_model_path(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="no config.json"):
        resolve_model_path(tmp_path)
    with pytest.raises(ValueError, match="bad option 'width=3'"):
        resolve_model_path("tiny:width=3")
    with pytest.raises(ValueError, match="layers must be an integer"):
        resolve_model_path("tiny:layers=two")
    with pytest.raises(ValueError, match="unknown dtype"):
        load_model(tmp_path, dtype="float8")


def test_tiny_spec_resolves_through_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FASTCRIT_CACHE", str(tmp_path))
    d = resolve_model_path("tiny:hidden=32,layers=1,heads=2,kv_heads=1,intermediate=32,vocab_size=280")
    assert os.path.dirname(d) == str(tmp_path)
    assert load_model(d).config.num_hidden_layers == 1


def test_load_model_dtype_and_tokenizer(tiny):
    m = load_model(tiny, dtype="bf16")
    assert m.dtype == torch.bfloat16 and not m.training
    tok = load_tokenizer(tiny)
    assert tok.padding_side == "left" and tok.pad_token_id is not None


@pytest.mark.parametrize("tie", [False, True])
def test_save_state_dict_loads_back(tiny, tmp_path, tie):
    from transformers import AutoModelForCausalLM

    model = load_model(tiny)
    if tie:
        model.config.tie_word_embeddings = True
        model.lm_head.weight = model.model.embed_tokens.weight
    tok = load_tokenizer(tiny)
    with torch.no_grad():
        state = {k: v * 1.5 for k, v in model.state_dict().items()}  # a trainer-side state dict (copies)
    if tie:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    out = save_pretrained_safetensors(
        state, tok, str(tmp_path / "ckpt"), config=model.config, generation_config=model.generation_config
    )
    assert os.path.exists(os.path.join(out, "model.safetensors"))
    again = AutoModelForCausalLM.from_pretrained(out, local_files_only=True)
    ids = torch.tensor([[3, 50, 60, 7]])
    with torch.no_grad():
        model.load_state_dict(state)
        assert torch.allclose(again(ids).logits, model(ids).logits, atol=1e-6)
    assert again.generate(ids, max_new_tokens=3, do_sample=False).shape[1] >= 5


def test_save_model_object(tiny, tmp_path):
    model = load_model(tiny)
    out = save_pretrained_safetensors(model, load_tokenizer(tiny), str(tmp_path / "c"))
    again = load_model(out)
    for (k, a), (k2, b) in zip(model.state_dict().items(), again.state_dict().items()):
        assert k == k2 and torch.equal(a, b)
    with pytest.raises(ValueError, match="needs the model's config"):
        save_pretrained_safetensors(model.state_dict(), None, str(tmp_path / "d"))


def _save_with_a_dtensor(ctx, tiny, directory):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    model = load_model(tiny)
    state = dict(model.state_dict())
    state["model.norm.weight"] = distribute_tensor(
        state["model.norm.weight"], init_device_mesh("cpu", (1,)), [Shard(0)]
    )
    with pytest.raises(TypeError, match="'model.norm.weight' is a sharded DTensor"):
        save_pretrained_safetensors(state, None, directory, config=model.config)
    assert not os.path.exists(directory)  # refused before anything was written


@pytest.mark.parametrize("form", ["model", "state_dict"])
def test_a_moe_is_saved_in_its_checkpoints_layout(tmp_path, form):
    """Transformers 5 fuses a MoE's experts as it loads them; a save writes them per expert, as the
    family's checkpoints (and so Transformers 4.x, SGLang, vLLM) have them, and loads back equal."""
    from safetensors import safe_open
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    cfg = Qwen3MoeConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        moe_intermediate_size=16,
        num_experts=4,
        num_experts_per_tok=2,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
    )
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(cfg).eval()
    if form == "model":
        save_pretrained_safetensors(model, None, str(tmp_path))
    else:
        save_pretrained_safetensors(model.state_dict(), None, str(tmp_path), config=model.config)
    with safe_open(os.path.join(tmp_path, "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert "model.layers.0.mlp.experts.3.gate_proj.weight" in names
    assert not any(n.endswith("experts.gate_up_proj") for n in names)
    back = load_model(str(tmp_path))
    for (name, a), b in zip(model.state_dict().items(), back.state_dict().values()):
        assert torch.equal(a, b), name


def test_save_refuses_a_dtensor(tiny, tmp_path):
    """Gathering is a collective, which stays in train/ (fastcrit.train.checkpoint gathers first)."""
    from fastcrit.train.dist import launch

    launch(_save_with_a_dtensor, (tiny, str(tmp_path / "ckpt")), 1, "cpu")


# flash_attn/__init__.py of a flash-attn 2 that imports (the functions Transformers takes from it)
FA2_INIT = "def flash_attn_func(*a, **k): pass\ndef flash_attn_varlen_func(*a, **k): pass\n"
FA2_OK = {"flash_attn/__init__.py": FA2_INIT, "flash_attn/bert_padding.py": "def pad_input(): pass\n"}
# what sglang 0.5.23's flash-attn-4 installs: flash_attn/cute only, no flash_attn/__init__.py
FA4 = {"flash_attn/cute/__init__.py": "def flash_attn_varlen_func(*a, **k): pass\n"}


def test_flash_attn_2_missing_names_the_install_step(flash_attn_site):
    from fastcrit.models.hf import flash_attn_2_problem

    problem = flash_attn_2_problem()
    assert problem.startswith("flash-attn is not installed")
    assert "pip install flash-attn --no-build-isolation" in problem and "trainer.pack_sequences=false" in problem


def test_flash_attn_4_namespace_is_not_flash_attn_2(flash_attn_site):
    import importlib.util

    from fastcrit.models.hf import flash_attn_2_problem

    flash_attn_site.dist("flash-attn-4", "4.0.0b36", FA4)
    assert importlib.util.find_spec("flash_attn") is not None  # what the guard used to check
    problem = flash_attn_2_problem()
    assert "flash-attn-4" in problem and "flash_attn.cute" in problem
    assert "pip install flash-attn --no-build-isolation" in problem


def test_flash_attn_2_that_does_not_import_is_refused(flash_attn_site):
    from fastcrit.models.hf import flash_attn_2_problem

    # a build for another torch: its extension does not load
    flash_attn_site.dist(
        "flash-attn",
        "2.8.3.post2",
        {
            **FA2_OK,
            "flash_attn/__init__.py": (
                "raise ImportError('flash_attn_2_cuda.so: undefined symbol: _ZN3c104cuda9SetDeviceEab')\n"
            ),
        },
    )
    problem = flash_attn_2_problem()
    assert "flash-attn 2.8.3.post2 is installed but does not import" in problem
    assert "undefined symbol" in problem and "pip install flash-attn --no-build-isolation" in problem


def test_flash_attn_2_too_old_is_refused(flash_attn_site):
    from fastcrit.models.hf import flash_attn_2_problem

    flash_attn_site.dist("flash-attn", "2.3.2", FA2_OK)
    assert "flash-attn 2.3.2: Transformers loads 2.3.3 or newer" in flash_attn_2_problem()


def test_flash_attn_2_without_bert_padding_is_refused(flash_attn_site):
    from fastcrit.models.hf import flash_attn_2_problem

    flash_attn_site.dist("flash-attn", "2.8.3", {"flash_attn/__init__.py": FA2_INIT})
    assert "does not import (ModuleNotFoundError" in flash_attn_2_problem()


@pytest.mark.parametrize("with_fa4", [False, True], ids=["alone", "over sglang's flash-attn-4"])
def test_a_working_flash_attn_2_passes(flash_attn_site, with_fa4):
    from fastcrit.models.hf import flash_attn_2_problem

    if with_fa4:  # the documented order: the gpu extra (sglang, flash-attn-4), then flash-attn
        flash_attn_site.dist("flash-attn-4", "4.0.0b36", FA4)
    flash_attn_site.dist("flash-attn", "2.8.3.post2", FA2_OK)
    assert flash_attn_2_problem() is None


# --- checkpoints that transformers 4.51-4.57 and 5 read the same ------------------------------------


def _as_v4_reads(directory):
    """What transformers 4.51-4.57 take from a saved directory, by their code: Qwen2Config's
    ``rope_theta`` (default 10000) and ``rope_scaling`` (None = plain rope), and the tokenizer's
    ``extra_special_tokens`` (``PreTrainedTokenizerBase.__init__`` calls its ``.keys()``), its
    ``additional_special_tokens`` and ``tokenizer_class`` (looked up by name; ``TokenizersBackend``
    exists only in 5.x)."""
    import json

    with open(os.path.join(directory, "config.json")) as f:
        config = json.load(f)
    with open(os.path.join(directory, "tokenizer_config.json")) as f:
        tok = json.load(f)
    extra = tok.get("extra_special_tokens", {})
    named = list(extra.keys())  # AttributeError on a list, as in 4.x
    assert tok.get("tokenizer_class") in (None, "PreTrainedTokenizerFast", "Qwen2Tokenizer", "Qwen2TokenizerFast")
    return {
        "rope_theta": config.get("rope_theta", 10000.0),
        "rope_scaling": config.get("rope_scaling"),
        "special": named + list(tok.get("additional_special_tokens") or []),
    }


@pytest.mark.parametrize(
    "rope", [{"rope_type": "default", "rope_theta": 1e6}, {"rope_type": "linear", "factor": 2.0, "rope_theta": 5e5}]
)
def test_a_saved_directory_reads_the_same_in_transformers_4_and_5(tiny, tmp_path, rope):
    import json

    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from fastcrit.models.tokenizer import IM_START

    model = load_model(tiny)
    config = AutoConfig.from_pretrained(tiny)
    config.rope_parameters = dict(rope)
    model = AutoModelForCausalLM.from_config(config).eval()  # the rotary buffers of this rope
    model.load_state_dict(load_model(tiny).state_dict())
    out = save_pretrained_safetensors(model, load_tokenizer(tiny), str(tmp_path / "ckpt"))

    v4 = _as_v4_reads(out)
    assert v4["rope_theta"] == rope["rope_theta"]
    want_scaling = None if rope["rope_type"] == "default" else {k: v for k, v in rope.items() if k != "rope_theta"}
    assert v4["rope_scaling"] == want_scaling
    assert IM_START in v4["special"]

    # transformers 5 reads the same rope back, the same logits, the same tokenizer
    again = AutoModelForCausalLM.from_pretrained(out, local_files_only=True).eval()
    assert again.config.rope_parameters == rope
    ids = torch.tensor([[3, 50, 60, 7, 9, 11, 200]])
    with torch.no_grad():
        torch.testing.assert_close(again(ids).logits, model(ids).logits, atol=0, rtol=0)
    a, b = load_tokenizer(tiny), AutoTokenizer.from_pretrained(out, local_files_only=True)
    assert b.all_special_tokens == a.all_special_tokens
    text = f"{IM_START}user\nreverse 'héllo' 123<|im_end|>\n"
    assert b(text).input_ids == a(text).input_ids
    chat = [{"role": "user", "content": "x"}]
    assert b.apply_chat_template(chat, tokenize=False) == a.apply_chat_template(chat, tokenize=False)
    with open(os.path.join(out, "config.json")) as f:
        assert json.load(f)["rope_parameters"] == rope  # still there for 5.x


@pytest.mark.parametrize("mask", [0o022, 0o002, 0o077])
def test_saved_files_get_a_normal_files_mode(tiny, tmp_path, mask):
    """safetensors >= 0.8.1 writes its file 0600; every saved file must be 0o666 less the umask."""
    old = os.umask(mask)
    try:
        out = save_pretrained_safetensors(load_model(tiny), load_tokenizer(tiny), str(tmp_path / "c"))
    finally:
        os.umask(old)
    names = sorted(os.listdir(out))
    assert "model.safetensors" in names and "tokenizer_config.json" in names
    for name in names:
        assert oct(os.stat(os.path.join(out, name)).st_mode & 0o777) == oct(0o666 & ~mask), name


def test_export_writes_the_model_alone(tiny, tmp_path, capsys):
    import json

    from transformers import AutoModelForCausalLM

    from fastcrit.cli import main

    model = load_model(tiny)
    step = str(tmp_path / "run" / "checkpoints" / "step_3")
    save_pretrained_safetensors(model, load_tokenizer(tiny), step)
    os.makedirs(os.path.join(step, "dcp"))
    for name in ("dcp/__0_0.distcp", "trainer_state.json", "rng_rank0.pt", "COMPLETE"):
        open(os.path.join(step, name), "w").close()

    out = str(tmp_path / "exported")
    assert main(["export", str(tmp_path / "run"), out, "--dtype", "bf16"]) == 0  # a run: its newest
    assert step in capsys.readouterr().out
    assert sorted(os.listdir(out)) == [
        "chat_template.jinja",
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    with open(os.path.join(out, "config.json")) as f:
        assert json.load(f)["dtype"] == "bfloat16"
    assert _as_v4_reads(out)["rope_theta"] == model.config.rope_parameters["rope_theta"]
    again = AutoModelForCausalLM.from_pretrained(out, local_files_only=True)
    for (k, a), (k2, b) in zip(model.state_dict().items(), again.state_dict().items()):
        assert k == k2 and b.dtype == torch.bfloat16 and torch.equal(a.to(torch.bfloat16), b), k
    mask = os.umask(0)
    os.umask(mask)
    assert oct(os.stat(out).st_mode & 0o777) == oct(0o777 & ~mask)

    assert main(["export", step, str(tmp_path / "fp32")]) == 0  # the checkpoint's own dtype
    assert load_model(str(tmp_path / "fp32")).config.dtype == torch.float32
    assert main(["export", step, out]) == 2
    assert "already exists" in capsys.readouterr().err


def test_a_moe_on_the_sglang_engine_is_refused_before_launch(tmp_path):
    """The weight sync sends the trainer's names: for a family whose weights Transformers converts
    as it loads them (a MoE's fused experts), SGLang's loader reads the checkpoint layout and skips
    the fused names without an error, so the engine would keep its first weights."""
    import json

    from transformers import LlamaConfig, Qwen3MoeConfig

    from fastcrit.config import ConfigError, load_config
    from fastcrit.launch_checks import check_model
    from fastcrit.models.hf import weight_conversions

    small = dict(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2)
    moe = Qwen3MoeConfig(**small, intermediate_size=64, moe_intermediate_size=16, num_experts=4, head_dim=8)
    assert weight_conversions(moe) and weight_conversions(LlamaConfig(**small, intermediate_size=64)) == []
    moe.architectures = ["Qwen3MoeForCausalLM"]
    (tmp_path / "config.json").write_text(json.dumps(moe.to_dict()))
    check_model(load_config("configs/cpu/grpo.yaml", [f"model.path={tmp_path}"]))  # native: fine
    with pytest.raises(ConfigError, match="rollout.engine=sglang: Transformers converts qwen3_moe's weights"):
        check_model(load_config("configs/cpu/grpo.yaml", [f"model.path={tmp_path}", "rollout.engine=sglang"]))
