"""GRPO and RLOO with a verifiable reward: rollout -> reward -> advantages -> update -> weight sync.

Departures from verl worth knowing: on the native engine in fp32 the behaviour log-probs are the
engine's (no extra trainer forward; they equal the trainer's up to kernel rounding, ~1e-6) unless
`algorithm.recompute_old_logprobs` is set, while with SGLang or bf16 the trainer recomputes them as
verl always does (``Run.batch``); and the KL to the frozen reference is a loss term (verl's
`use_kl_loss`), never folded into the reward.
"""

from __future__ import annotations

import torch

from fastcrit.algos.advantages import outcome_advantages
from fastcrit.data.prompts import EncodedPrompt
from fastcrit.recipes.scaffold import Run, info_means, reward_items
from fastcrit.registry import Recipe
from fastcrit.reward import make_reward
from fastcrit.train.dist import all_reduce_mean, std_over_ranks
from fastcrit.types import SamplingParams

RECIPE = (
    Recipe(names=("grpo",), step="GRPO"),
    Recipe(names=("rloo",), step="GRPO", minimums={"rollout.n": (2, "a sample's baseline is the others' mean")}),
)


class GRPO:
    def __init__(self, run: Run):
        c = run.cfg
        self.run = run
        self.reward = make_reward(c, run.out, run.ctx.rank, run.ctx.device)
        self.prompts = run.load_prompts(c.data.train, "train")
        self.val = run.load_prompts(c.data.val, "test")[: c.data.val_size] if c.data.val else []

    def score(self, prompts: list[EncodedPrompt], rollouts) -> tuple[torch.Tensor, dict]:
        texts = [self.run.tok.decode(r.output_ids, skip_special_tokens=True) for r in rollouts]
        results = self.reward(reward_items(rollouts, texts, [p.example for p in prompts]))
        return torch.tensor([r.score for r in results], dtype=torch.float32), results

    def sample_and_score(self, step: int):
        """This rank's prompts of the step, their rollout.n samples, and the samples' rewards."""
        run = self.run
        prompts = run.share(self.prompts, step)
        rollouts = run.generate([p.ids for p in prompts], run.sampling(step))
        with run.timer("reward"):
            scores, results = self.score(prompts, rollouts)
        return prompts, rollouts, scores, results

    def step(self, step: int) -> dict[str, float]:
        run = self.run
        prompts, rollouts, scores, results = self.sample_and_score(step)
        batch = run.batch(rollouts, scores)
        batch.ref_logprobs = run.reference(batch)
        a = run.cfg.algorithm
        batch.advantages = outcome_advantages(
            a.name, scores, batch.group_ids, batch.response_mask, norm_by_std=a.norm_adv_by_std
        )
        stats = run.update(batch)
        run.sync()
        return {
            "reward/mean": scores.mean().item(),
            "reward/std": std_over_ranks(scores),
            **info_means(results, "reward/"),
            "response_len/mean": batch.response_mask.sum(-1).mean().item(),
            **stats,
        }

    def evaluate(self) -> dict[str, float]:
        """Greedy decoding on this rank's share of the validation prompts; mean over ranks."""
        if not self.val:
            return {}
        run = self.run
        share = self.val[run.ctx.rank :: run.ctx.world_size]
        params = SamplingParams(n=1, max_new_tokens=run.cfg.rollout.max_new_tokens, temperature=0.0)
        scores, results = self.score(share, run.engine.generate([p.ids for p in share], params))
        return all_reduce_mean({"val/reward": scores.mean().item(), **info_means(results, "val/")})
