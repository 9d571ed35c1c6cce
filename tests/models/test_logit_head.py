"""Models whose logits are not plain ``hidden @ lm_head.T``: a constant factor (Granite, Cohere,
MiniCPM3's divided hidden states) is folded into the temperature, so the trainer's log-probs are
the model's own; a ``tanh`` cap (Gemma 2) is refused by name, before a run starts
(fastcrit.models.logit_head, fastcrit.train.policy, `fastcrit train`)."""

import json

import pytest
import torch
import transformers as tf

from fastcrit.cli import main
from fastcrit.models.logit_head import UnsupportedLogits, logit_scale
from fastcrit.train.policy import CausalLMLogprobs
from tests.models.small_configs import SMALL


def _meta(config):
    with torch.device("meta"):
        return tf.AutoModelForCausalLM.from_config(config)


@pytest.mark.parametrize(
    "config, scale",
    [
        (tf.Qwen2Config(**SMALL), 1.0),
        (tf.LlamaConfig(**SMALL), 1.0),
        (tf.Gemma2Config(**SMALL, head_dim=8, final_logit_softcapping=None), 1.0),
        (tf.GraniteConfig(**SMALL, logits_scaling=4.0), 0.25),
        (tf.CohereConfig(**SMALL, logit_scale=0.5), 0.5),
        # its head casts the hidden states to lm_head.weight's dtype first
        (tf.MambaConfig(vocab_size=96, hidden_size=32, num_hidden_layers=1, state_size=4), 1.0),
    ],
    ids=["qwen2", "llama", "gemma2-uncapped", "granite", "cohere", "mamba"],
)
def test_the_factor_comes_from_the_models_own_forward(config, scale):
    lm = _meta(config)
    head = lm.get_output_embeddings()
    assert logit_scale(lm) == pytest.approx(scale, rel=1e-6)
    assert lm.get_output_embeddings() is head and "forward" not in vars(lm.base_model)  # put back


def test_a_tanh_cap_is_refused_naming_its_setting():
    lm = _meta(tf.Gemma2Config(**SMALL, head_dim=8, final_logit_softcapping=30.0))
    with pytest.raises(UnsupportedLogits, match=r"gemma2 transforms .*final_logit_softcapping=30\.0"):
        logit_scale(lm)
    with pytest.raises(UnsupportedLogits, match="final_logit_softcapping"):
        CausalLMLogprobs(lm)


@pytest.mark.parametrize(
    "config",
    [tf.GraniteConfig(**SMALL, logits_scaling=4.0), tf.CohereConfig(**SMALL, logit_scale=0.5)],
    ids=["granite", "cohere"],
)
def test_scaled_families_get_their_own_log_probs(config):
    # Before the fold the trainer's log-probs were log_softmax(hidden @ W / T): for Granite
    # four times sharper than the model's, at every temperature.
    torch.manual_seed(0)
    lm = tf.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():  # make the head matter: random logits near 0 hide a factor
        lm.get_output_embeddings().weight.normal_(0.0, 0.5)
    wrapped = CausalLMLogprobs(lm)
    B, P, R, T = 3, 5, 6, 0.7
    ids = torch.randint(0, SMALL["vocab_size"], (B, P + R))
    mask = torch.ones_like(ids)
    pos = torch.arange(P + R).expand(B, -1)
    got = wrapped(ids, mask, pos, ids[:, P:], torch.ones(B, R), temperature=T)
    with torch.no_grad():
        logits = lm(input_ids=ids, attention_mask=mask).logits[:, P - 1 : -1].float()
    want = torch.log_softmax(logits / T, -1).gather(-1, ids[:, P:, None])[..., 0]
    torch.testing.assert_close(got.detach(), want, rtol=1e-5, atol=1e-5)


def test_train_refuses_a_capped_model_before_any_rank_starts(tmp_path, capsys):
    model = tmp_path / "gemma2"
    model.mkdir()
    cfg = tf.Gemma2Config(**SMALL, head_dim=8, final_logit_softcapping=30.0)
    cfg.architectures = ["Gemma2ForCausalLM"]
    (model / "config.json").write_text(json.dumps(cfg.to_dict()))
    out = tmp_path / "run"
    argv = ["train", "configs/cpu/grpo.yaml", "--set", f"model.path={model}", "--set", f"trainer.output_dir={out}"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "config error: model.path: gemma2 transforms" in err and "final_logit_softcapping: null" in err, err
    assert not out.exists()


def test_train_refuses_a_model_without_decoder_layers_where_they_are_sharded(tmp_path, capsys):
    model = tmp_path / "gpt2"
    model.mkdir()
    cfg = tf.GPT2Config(vocab_size=96, n_embd=32, n_layer=1, n_head=4, n_positions=64)
    cfg.architectures = ["GPT2LMHeadModel"]
    (model / "config.json").write_text(json.dumps(cfg.to_dict()))
    argv = [
        "train",
        "configs/cpu/grpo.yaml",
        "--set",
        f"model.path={model}",
        "--set",
        f"trainer.output_dir={tmp_path}/r",
    ]
    assert main(argv) == 2
    assert "GPT2LMHeadModel keeps its decoder layers elsewhere than transformer.layers" in capsys.readouterr().err
