import json
import os

import pytest
import torch
from safetensors.torch import load_file

from fastcrit.models.tiny import build_tiny_model, ensure_tiny_model
from fastcrit.models.tokenizer import default_corpus

SMALL = dict(hidden=32, layers=2, heads=4, kv_heads=2, intermediate=64, vocab_size=300)


@pytest.fixture(scope="module")
def corpus():
    return default_corpus(use_human_eval=False)


def _weights(d):
    return load_file(os.path.join(d, "model.safetensors"))


def test_build_loads_with_transformers(tmp_path, corpus):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d = build_tiny_model(str(tmp_path / "m"), corpus=corpus, seed=3, **SMALL)
    model = AutoModelForCausalLM.from_pretrained(d, local_files_only=True)
    tok = AutoTokenizer.from_pretrained(d, local_files_only=True)
    assert type(model).__name__ == "Qwen2ForCausalLM"
    cfg = model.config
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads) == (32, 2, 4, 2)
    assert cfg.vocab_size == len(tok) <= 300
    assert model.generation_config.eos_token_id == tok.eos_token_id
    ids = torch.tensor(
        [tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, return_dict=False)]
    )
    out = model.generate(ids, max_new_tokens=5, do_sample=False)
    assert out.shape == (1, ids.shape[1] + 5) or tok.eos_token_id in out[0, ids.shape[1] :].tolist()


def test_deterministic_given_seed(tmp_path, corpus):
    a = _weights(build_tiny_model(str(tmp_path / "a"), corpus=corpus, seed=7, **SMALL))
    b = _weights(build_tiny_model(str(tmp_path / "b"), corpus=corpus, seed=7, **SMALL))
    c = _weights(build_tiny_model(str(tmp_path / "c"), corpus=corpus, seed=8, **SMALL))
    assert a.keys() == b.keys() == c.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["model.layers.0.mlp.up_proj.weight"], c["model.layers.0.mlp.up_proj.weight"])


def test_ensure_builds_once_and_reuses(tmp_path, monkeypatch):
    monkeypatch.setenv("FASTCRIT_CACHE", str(tmp_path / "cache"))
    d1 = ensure_tiny_model(**SMALL)
    assert d1.startswith(str(tmp_path / "cache")) and os.path.basename(d1).startswith("tiny-qwen2-")
    stamp = os.stat(os.path.join(d1, "model.safetensors")).st_mtime_ns
    d2 = ensure_tiny_model(**SMALL)
    assert d2 == d1 and os.stat(os.path.join(d1, "model.safetensors")).st_mtime_ns == stamp
    with open(os.path.join(d1, "fastcrit_tiny.json")) as f:
        assert json.load(f)["settings"]["hidden"] == 32
    d3 = ensure_tiny_model(**{**SMALL, "seed": 1})
    assert d3 != d1
    # Nothing half-built is left next to the finished models.
    assert sorted(os.listdir(tmp_path / "cache")) == sorted([os.path.basename(d1), os.path.basename(d3)])


def test_ensure_replaces_incomplete_dir(tmp_path):
    target = tmp_path / "m"
    target.mkdir()
    (target / "config.json").write_text("{}")  # a leftover from a crashed build
    d = ensure_tiny_model(str(target), **SMALL)
    assert os.path.exists(os.path.join(d, "model.safetensors"))


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="hidden=30 is not a multiple of heads=4"):
        ensure_tiny_model("/nonexistent/never", **{**SMALL, "hidden": 30})
    with pytest.raises(ValueError, match="unknown option"):
        ensure_tiny_model("/nonexistent/never", width=3)
