"""PPO with a value critic and a reward model (verl's design):

    for each step:
        sample n responses per prompt                                   (behaviour log-probs kept)
        score = sum_k w_k reward_k(prompt, response)                    (reward model, rules, ...)
        token_reward[t] = -kl_coef * kl(old[t], ref[t]);  token_reward[last] += score
        V = critic(prompt + response)                                   (state before each token)
        A, returns = GAE(token_reward, V, gamma, lam);  A = whiten(A)
        critic: clipped value regression of V towards returns           (its own optimizer)
        policy: PPO clipped objective on A (+ KL loss if algorithm.kl_coef), after critic_warmup

The critic starts from ``ppo.critic_path`` (default ``model.path``; a causal LM gets a fresh value
head) and is checkpointed next to the policy in ``<checkpoint>/critic/``, a Hugging Face directory
that loads with ``AutoModelForTokenClassification``.
"""
from __future__ import annotations

import dataclasses

import torch

from fastcrit.algos.advantages import gae, last_valid_index, masked_whiten
from fastcrit.config import ConfigError, loss_scale
from fastcrit.models.hf import load_tokenizer
from fastcrit.recipes.grpo import GRPO
from fastcrit.recipes.scaffold import Run, info_means
from fastcrit.train.actor import Actor
from fastcrit.train.value import build_value_actor, compute_values, explained_variance, update_values
from fastcrit_kernels import kl_penalty


class PPO(GRPO):
    """GRPO's data, reward managers and evaluation; PPO's step with a critic."""

    def __init__(self, run: Run):
        super().__init__(run)
        c = run.cfg
        path = c.ppo.critic_path or run.model_path
        if load_tokenizer(path).get_vocab() != run.tok.get_vocab():
            raise ConfigError(f"ppo.critic_path {path!r}: its tokenizer differs from the policy's; the "
                              "critic reads the policy's token ids")
        updates = c.trainer.total_steps * c.algorithm.ppo_epochs * c.algorithm.mini_batches
        self.critic = build_value_actor(path, dtype=c.model.dtype, device=run.ctx.device,
                                        world_size=run.ctx.world_size, total_updates=updates,
                                        optim=dataclasses.replace(c.optim, lr=c.ppo.critic_lr))

    def actors(self) -> dict[str, Actor]:
        return {"critic": self.critic}

    def step(self, step: int) -> dict[str, float]:
        run, c = self.run, self.run.cfg
        _, rollouts, scores, results = self.sample_and_score(step)
        batch = run.batch(rollouts, scores)
        batch.ref_logprobs = run.reference(batch)
        with run.timer("values"):
            batch.values = compute_values(self.critic, batch, c.trainer.micro_batch_size)
        rewards, kl = token_rewards(batch, c.ppo.kl_in_reward_coef, c.ppo.kl_in_reward_kind)
        adv, batch.returns = gae(rewards, batch.values, batch.response_mask, gamma=c.ppo.gamma, lam=c.ppo.lam)
        batch.advantages = masked_whiten(adv, batch.response_mask)
        with run.timer("critic"):
            critic_stats = update_values(self.critic, batch, c.algorithm, c.ppo,
                                         micro_batch_size=c.trainer.micro_batch_size,
                                         grad_clip=c.optim.grad_clip, agg_scale=loss_scale(c))
        stats = run.update(batch) if step > c.ppo.critic_warmup else {}
        run.sync()
        return {"reward/mean": scores.mean().item(), **info_means(results, "reward/"), **rm_means(results),
                "critic/explained_var": explained_variance(batch.values, batch.returns, batch.response_mask),
                "critic/values_mean": masked_mean(batch.values, batch.response_mask),
                "critic/returns_mean": masked_mean(batch.returns, batch.response_mask),
                **({"reward/kl_penalty": kl} if kl is not None else {}),
                "response_len/mean": batch.response_mask.sum(-1).mean().item(), **critic_stats, **stats}


def rm_means(results) -> dict[str, float]:
    """rm/score_mean: the reward model's mean score (alone, or as the `model` part of a sum)."""
    vals = [r.info.get("rm_score", r.info.get("model/rm_score")) for r in results]
    vals = [v for v in vals if v is not None]
    return {"rm/score_mean": sum(vals) / len(vals)} if vals else {}


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    return float((x * mask).sum() / mask.sum().clamp(min=1.0))


def token_rewards(batch, kl_coef: float, kl_kind: str) -> tuple[torch.Tensor, float | None]:
    """[B, R] rewards: the sequence score on the last valid response token, minus ``kl_coef`` times
    the per-token KL of the behaviour policy to the reference (when kl_coef != 0). Also the mean KL."""
    mask = batch.response_mask
    rewards = torch.zeros_like(mask, dtype=torch.float32)
    last = last_valid_index(mask)
    has = mask.sum(1) > 0
    rewards[has, last[has]] = batch.scores[has].float()
    if kl_coef == 0.0 or batch.ref_logprobs is None:
        return rewards, None
    kl = kl_penalty(batch.old_logprobs, batch.ref_logprobs, kl_kind) * mask
    return rewards - kl_coef * kl, masked_mean(kl, mask)
