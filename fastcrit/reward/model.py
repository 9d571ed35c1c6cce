"""The `model` reward: a reward model's score of (prompt, response), its value head read at the last
token of [chat-templated prompt, response, EOS] (verl's reward model form; `fastcrit rm` trains one).

The last token is found by the attention mask, for a token- and a sequence-classification head
alike, whatever the padding side. Transformers' own ``*ForSequenceClassification`` pooling looks
for the pad id instead: it reads the token before the EOS when pad == EOS, and refuses batches of
more than one row when the config has no pad id; its pooling is not used here.

The reward model has its own tokenizer, so it scores the texts, not the policy's token ids; any
local Hugging Face directory with a one-label token / sequence classification head loads (a causal
LM would get an untrained head: refused, since its scores would mean nothing).
"""

from __future__ import annotations

import torch

from fastcrit.algos.advantages import last_valid_index
from fastcrit.config import ConfigError
from fastcrit.data.prompts import encode_chat
from fastcrit.models.hf import load_tokenizer, load_value_model
from fastcrit.reward.base import RewardItem, RewardResult, register


def rm_ids(tok, prompt: str, response: str) -> list[int]:
    """The token ids a reward model reads for one (prompt, response); training uses the same."""
    return encode_chat(tok, prompt) + tok.encode(response, add_special_tokens=False) + [tok.eos_token_id]


def pad_left(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r) :] = torch.tensor(r, dtype=torch.long)
        mask[i, width - len(r) :] = 1
    return ids, mask


@register("model")
class ModelReward:
    name = "model"

    def __init__(
        self, path: str = "", dtype: str = "float32", device: str | torch.device = "cpu", batch_size: int = 32
    ):
        if not path:
            raise ConfigError("reward.name uses 'model': set reward.model_path to a reward model directory")
        self.model = load_value_model(path, dtype=dtype, device=device)
        if getattr(self.model, "_fresh_value_head", False):
            raise ConfigError(
                f"reward.model_path {path!r} is a causal LM without a reward head; train one "
                "with `fastcrit rm CONFIG` (or point to a reward model directory)"
            )
        self.tok = load_tokenizer(path)
        self.device, self.batch_size = torch.device(device), batch_size

    @torch.no_grad()
    def load_weights(self, named_tensors) -> None:
        """Copy full tensors into the reward model by Hugging Face name (a reward model trained on
        during a run, e.g. PPO's ``ppo.rm_refresh_every``). Every weight must be given; a name the
        model lacks or a wrong shape raises before anything is copied."""
        targets = self.model.state_dict(keep_vars=True)
        given = dict(named_tensors)
        missing, unknown = sorted(set(targets) - set(given)), sorted(set(given) - set(targets))
        if missing or unknown:
            raise KeyError(f"ModelReward.load_weights: missing {missing[:3]}, unknown {unknown[:3]}")
        for name, t in given.items():
            if tuple(t.shape) != tuple(targets[name].shape):
                raise ValueError(
                    f"ModelReward.load_weights: {name!r} has shape {tuple(t.shape)}, "
                    f"the reward model expects {tuple(targets[name].shape)}"
                )
        for name, t in given.items():
            targets[name].data.copy_(t.to(device=targets[name].device, dtype=targets[name].dtype))

    @torch.no_grad()
    def score_ids(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """[B] fp32 scores, on CPU, of the rows of ``input_ids`` [B, T] (padded on either side, with
        any pad id): the scalar head applied to the hidden state of each row's last token whose
        ``attention_mask`` [B, T] is 1."""
        d, model = self.device, self.model
        pos = (torch.cumsum(attention_mask, 1) - 1).clamp(min=0)
        hidden = getattr(model, model.base_model_prefix)(
            input_ids=input_ids.to(d), attention_mask=attention_mask.to(d), position_ids=pos.to(d), use_cache=False
        ).last_hidden_state
        last = last_valid_index(attention_mask).to(d)
        return model.score(hidden[torch.arange(len(last), device=d), last])[:, 0].float().cpu()

    def scores(self, items: list[RewardItem]) -> torch.Tensor:
        out = []
        for s in range(0, len(items), self.batch_size):
            rows = [rm_ids(self.tok, it.prompt, it.response) for it in items[s : s + self.batch_size]]
            out.append(self.score_ids(*pad_left(rows, self.tok.pad_token_id)))
        return torch.cat(out) if out else torch.zeros(0)

    def __call__(self, items: list[RewardItem]) -> list[RewardResult]:
        return [RewardResult(float(s), {"rm_score": float(s)}) for s in self.scores(items)]


class CombinedReward:
    """Several managers' scores added with weights ("model+rule"); each part's score is in the info
    under its name, and each part's own info under "<name>/<key>"."""

    def __init__(self, parts: list[tuple[str, object]], weights: list[float]):
        self.parts, self.weights = parts, weights
        self.name = "+".join(n for n, _ in parts)

    def __call__(self, items: list[RewardItem]) -> list[RewardResult]:
        results = [RewardResult(0.0, {}) for _ in items]
        for (name, mgr), w in zip(self.parts, self.weights):
            for res, r in zip(results, mgr(items)):
                res.score += w * r.score
                res.info[name] = r.score
                res.info.update({f"{name}/{k}": v for k, v in r.info.items()})
        return results
