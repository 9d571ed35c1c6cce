"""A value model (PPO's critic, a reward model) from a causal LM of any family that Transformers can
give a score head: token classification where the family has it, else sequence classification
(Gemma 3, OLMo 2, MiniCPM3 have only that; fastcrit.train.value runs the score on every position
either way); a family with neither is refused by name, before a PPO run starts."""

import pytest
import torch
import transformers as tf

from fastcrit.cli import main
from fastcrit.models.hf import load_value_model
from fastcrit.train.value import ValueModel
from tests.models.small_configs import SMALL


def _causal_lm_dir(config, path):
    torch.manual_seed(0)
    tf.AutoModelForCausalLM.from_config(config).save_pretrained(path)
    return str(path)


def test_a_family_with_sequence_classification_only_gets_per_token_values(tmp_path):
    # OLMo 2 has no ForTokenClassification: the critic failed to load after the policy had
    path = _causal_lm_dir(tf.Olmo2Config(**SMALL), tmp_path / "olmo2")
    m = load_value_model(path)
    assert m.config.architectures == ["Olmo2ForSequenceClassification"] and m._fresh_value_head
    ids = torch.randint(0, SMALL["vocab_size"], (2, 7))
    values = ValueModel(m)(ids, torch.ones_like(ids), torch.arange(7).expand(2, -1))
    with torch.no_grad():
        hidden = m.model(input_ids=ids).last_hidden_state
    torch.testing.assert_close(values, m.score(hidden)[..., 0])  # a value at every position
    m.save_pretrained(tmp_path / "vm")
    again = load_value_model(str(tmp_path / "vm"))
    assert not again._fresh_value_head and torch.equal(again.score.weight, m.score.weight)
    assert load_value_model(path, meta=True).score.weight.is_meta


def test_a_family_without_a_score_head_is_refused_before_a_ppo_run(tmp_path, capsys):
    path = _causal_lm_dir(tf.GraniteConfig(**SMALL, logits_scaling=4.0), tmp_path / "granite")
    with pytest.raises(ValueError, match="no token- or sequence-classification model for model_type 'granite'"):
        load_value_model(path, meta=True)
    out = tmp_path / "run"
    argv = ["train", "configs/cpu/ppo.yaml", "--set", f"ppo.critic_path={path}", "--set", f"trainer.output_dir={out}"]
    assert main(argv) == 2
    assert "config error: ppo.critic_path: " in capsys.readouterr().err
    assert not out.exists()
