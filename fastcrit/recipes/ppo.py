"""PPO with a value critic and a reward model (verl's design):

    for each step:
        sample n responses per prompt                                   (behaviour log-probs kept)
        score = sum_k w_k reward_k(prompt, response)                    (reward model, rules, ...)
        token_reward[t] = -kl_coef * kl(old[t], ref[t]);  token_reward[last] += score
        kl_coef = next_kl_coef(kl_coef, the step's KL)                  (algorithm.kl_ctrl: fixed | adaptive)
        V = critic(prompt + response)                                   (state before each token)
        A, returns = GAE(token_reward, V, gamma, lam);  A = whiten(A)         (over every rank's tokens)
        critic: clipped value regression of V towards returns           (its own optimizer)
        policy: PPO clipped objective on A (+ KL loss if algorithm.kl_coef), after critic_warmup

The critic starts from ``ppo.critic_path`` (default ``model.path``; a causal LM gets a fresh value
head) and is checkpointed next to the policy in ``<checkpoint>/critic/``, a Hugging Face directory
that loads with ``AutoModelForTokenClassification``.

With ``ppo.rm_refresh_every`` the reward model learns on as the policy moves (iterated, online RLHF):

        pairs += answers of this step ranked by rm.label_reward            (per prompt, as `fastcrit rm`)
        every rm_refresh_every steps: rm_refresh_steps Bradley-Terry steps on pairs; pairs = []

so the policy is scored by a reward model that has seen what the policy now writes, not only what it
wrote before training (a frozen one is over-optimised: see docs/algorithms.md).
"""

from __future__ import annotations

import dataclasses
import random

import torch

from fastcrit.algos.advantages import gae, last_valid_index, masked_whiten
from fastcrit.algos.kl_control import kl_row_means, next_kl_coef
from fastcrit.config import ConfigError
from fastcrit.config_values import loss_scale, reward_model_path
from fastcrit.data.datasets import PreferencePair
from fastcrit.models.hf import load_tokenizer, parse_dtype
from fastcrit.recipes.grpo import GRPO
from fastcrit.recipes.rm import accuracy, bradley_terry_step, ranked_pairs
from fastcrit.recipes.scaffold import Run, info_means, reward_items
from fastcrit.registry import Recipe
from fastcrit.reward import get_reward_manager
from fastcrit.reward.model import CombinedReward, ModelReward
from fastcrit.train.actor import Actor, free_gradients
from fastcrit.train.dist import all_reduce, all_reduce_mean, masked_mean_over_ranks
from fastcrit.train.policy import gathered_tensors
from fastcrit.train.value import build_value_actor, compute_values, explained_variance, update_values
from fastcrit_kernels import kl_penalty

RECIPE = Recipe(names=("ppo",), step="PPO", kl_in_reward=True, value_critic=True, online_reward_model=True)


class PPO(GRPO):
    """GRPO's data, reward managers and evaluation; PPO's step with a critic."""

    def __init__(self, run: Run):
        super().__init__(run)
        c = run.cfg
        path = c.ppo.critic_path or run.model_path
        if load_tokenizer(path).get_vocab() != run.tok.get_vocab():
            raise ConfigError(
                f"ppo.critic_path {path!r}: its tokenizer differs from the policy's; the "
                "critic reads the policy's token ids"
            )
        updates = c.trainer.total_steps * c.algorithm.ppo_epochs * c.algorithm.mini_batches
        self.critic = build_value_actor(
            path,
            dtype=c.model.dtype,
            device=run.ctx.device,
            world_size=run.ctx.world_size,
            total_updates=updates,
            optim=dataclasses.replace(c.optim, lr=c.ppo.critic_lr),
            checkpointing=c.trainer.gradient_checkpointing,
            compile=c.trainer.compile,
        )
        self.online = OnlineRM(run, self.reward) if c.ppo.rm_refresh_every else None
        self.kl_coef = c.ppo.kl_in_reward_coef  # moves under algorithm.kl_ctrl=adaptive; checkpointed

    def actors(self) -> dict[str, Actor]:
        return {"critic": self.critic, **({"rm": self.online.actor} if self.online else {})}

    def state_dict(self) -> dict:
        return {"kl_in_reward_coef": self.kl_coef, **(self.online.state_dict() if self.online else {})}

    def load_state_dict(self, state: dict) -> None:
        self.kl_coef = state.get("kl_in_reward_coef", self.kl_coef)
        if self.online:
            self.online.load_state_dict(state)

    def step(self, step: int) -> dict[str, float]:
        run, c = self.run, self.run.cfg
        prompts, rollouts, scores, results = self.sample_and_score(step)
        online = {}
        if self.online:
            texts = [run.tok.decode(r.output_ids, skip_special_tokens=True) for r in rollouts]
            self.online.add(reward_items(rollouts, texts, [p.example for p in prompts]))
            if step % c.ppo.rm_refresh_every == 0:
                with run.timer("rm_refresh"):
                    online = self.online.refresh(step)
        batch = run.batch(rollouts, scores)
        batch.ref_logprobs = run.reference(batch)
        with run.timer("values"):
            batch.values = compute_values(self.critic, batch, c.trainer.forward_micro_batch_size)
        mask = batch.response_mask
        rewards, kl = token_rewards(batch, self.kl_coef, c.ppo.kl_in_reward_kind)
        kl_stats = self.control_kl(kl, mask) if kl is not None else {}
        adv, batch.returns = gae(rewards, batch.values, mask, gamma=c.ppo.gamma, lam=c.ppo.lam)
        batch.advantages = masked_whiten(adv, mask, all_sum=all_reduce)  # over every rank's tokens, as one batch
        with run.timer("critic"):
            critic_stats = update_values(
                self.critic,
                batch,
                c.algorithm,
                c.ppo,
                micro_batch_size=c.trainer.micro_batch_size,
                grad_clip=c.optim.grad_clip,
                agg_scale=loss_scale(c),
                generator=run.shuffle(),
            )
            free_gradients(self.critic)
        stats = run.update(batch) if step > c.ppo.critic_warmup else {}
        run.sync()
        return {
            "reward/mean": scores.mean().item(),
            **info_means(results, "reward/"),
            **rm_means(results),
            "critic/explained_var": explained_variance(batch.values, batch.returns, mask),
            "critic/values_mean": masked_mean_over_ranks(batch.values, mask),
            "critic/returns_mean": masked_mean_over_ranks(batch.returns, mask),
            **kl_stats,
            "response_len/mean": batch.response_mask.sum(-1).mean().item(),
            **critic_stats,
            **online,
            **stats,
        }

    def control_kl(self, kl: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
        """The step's KL to the reference, measured as verl does (the mean over the sequences of all
        ranks of their token means), moves the coefficient for the next step; logged beside the
        coefficient this step used (reward/kl_coef)."""
        a, used = self.run.cfg.algorithm, self.kl_coef
        row_means = kl_row_means(kl, mask)
        total, seqs = all_reduce([float(row_means.sum()), float(len(row_means))])
        measured = total / max(seqs, 1.0)
        self.kl_coef = next_kl_coef(used, measured, seqs, ctrl=a.kl_ctrl, target=a.kl_target, horizon=a.kl_horizon)
        return {"reward/kl_penalty": measured, "reward/kl_coef": used}


class OnlineRM:
    """The reward model of ``reward.name``'s `model` part, trained on during the run
    (``ppo.rm_refresh_every``): a trainable copy of ``reward_model_path`` (its own AdamW at
    ``rm.lr``), the pairs of the policy's answers since the last refresh, and the reward manager
    that scores with its weights."""

    def __init__(self, run: Run, reward):
        c = run.cfg
        self.run, self.cfg = run, c
        self.scorer = model_part(reward)
        self.labeler = get_reward_manager(c.rm.label_reward)
        refreshes = max(1, c.trainer.total_steps // c.ppo.rm_refresh_every)
        optim = dataclasses.replace(c.optim, lr=c.rm.lr, warmup_steps=0, lr_schedule="constant")
        self.actor = build_value_actor(
            reward_model_path(c),
            dtype=c.model.dtype,
            device=run.ctx.device,
            world_size=run.ctx.world_size,
            optim=optim,
            total_updates=refreshes * c.ppo.rm_refresh_steps,
            checkpointing=c.trainer.gradient_checkpointing,
            compile=c.trainer.compile,
        )
        self.tok = load_tokenizer(reward_model_path(c))
        self.pairs: list[PreferencePair] = []
        self.loaded = False  # the scorer holds the trained weights (after a refresh or a resume)

    def add(self, items) -> None:
        """This step's answers, ranked per prompt by ``rm.label_reward``, join the pairs."""
        labels = [r.score for r in self.labeler(items)]
        self.pairs += ranked_pairs([it.prompt for it in items], [it.response for it in items], labels)

    def refresh(self, step: int) -> dict[str, float]:
        """Bradley-Terry steps on the pairs gathered since the last refresh, then the scorer takes
        the new weights. Logged: how often the reward model ranked the policy's new pairs right
        before (rm/onpolicy_acc), the loss and accuracy of the steps, the pairs."""
        c, micro = self.cfg, self.cfg.trainer.micro_batch_size
        have = -all_reduce([-float(len(self.pairs))], "max")[0]  # the fewest of any rank: all step, or none
        out = {"rm/pairs": float(len(self.pairs))}
        if have >= 1:
            rng = random.Random((c.trainer.seed * 1_000_003 + step) * 64 + self.run.ctx.rank)
            sample = rng.sample(self.pairs, min(len(self.pairs), 512))
            out["rm/onpolicy_acc"] = accuracy(self.actor, self.tok, sample, micro)["acc"]
            sums = {"loss": 0.0, "acc": 0.0}
            for _ in range(c.ppo.rm_refresh_steps):
                batch = [rng.choice(self.pairs) for _ in range(c.rm.batch_size)]
                res = bradley_terry_step(self.actor, self.tok, batch, micro, c.optim.grad_clip)
                sums = {k: sums[k] + res[k] / c.ppo.rm_refresh_steps for k in sums}
            out.update({"rm/refresh_loss": sums["loss"], "rm/refresh_acc": sums["acc"]})
            free_gradients(self.actor)
            self.sync()
        self.pairs = []
        return all_reduce_mean(out)

    def sync(self) -> None:
        # a collective: the weights in the scorer's dtype, a bucket per all-gather
        self.scorer.load_weights(
            gathered_tensors(
                self.actor.module, parse_dtype(self.cfg.model.dtype), self.cfg.rollout.weight_bucket_mb << 20
            )
        )
        self.loaded = True

    def state_dict(self) -> dict:
        return {"rm_pairs": [dataclasses.astuple(p) for p in self.pairs]}

    def load_state_dict(self, state: dict) -> None:
        self.pairs = [PreferencePair(*p) for p in state.get("rm_pairs", [])]
        self.sync()  # the checkpoint's reward model, not the one the run started from


def model_part(reward) -> ModelReward:
    """The ModelReward inside ``reward`` (alone or a part of a CombinedReward)."""
    if isinstance(reward, ModelReward):
        return reward
    if isinstance(reward, CombinedReward):
        for _, mgr in reward.parts:
            if isinstance(mgr, ModelReward):
                return mgr
    raise ConfigError("ppo.rm_refresh_every: the reward has no `model` part to train on")


def rm_means(results) -> dict[str, float]:
    """rm/score_mean: the reward model's mean score (alone, or as the `model` part of a sum)."""
    vals = [r.info.get("rm_score", r.info.get("model/rm_score")) for r in results]
    vals = [v for v in vals if v is not None]
    return {"rm/score_mean": sum(vals) / len(vals)} if vals else {}


def token_rewards(batch, kl_coef: float, kl_kind: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """[B, R] rewards: the sequence score on the last valid response token, minus ``kl_coef`` times
    the per-token KL of the behaviour policy to the reference (when kl_coef != 0). Also that [B, R]
    KL (0 on padding), or None without the penalty."""
    mask = batch.response_mask
    rewards = torch.zeros_like(mask, dtype=torch.float32)
    last = last_valid_index(mask)
    has = mask.sum(1) > 0
    rewards[has, last[has]] = batch.scores[has].float()
    if kl_coef == 0.0 or batch.ref_logprobs is None:
        return rewards, None
    kl = kl_penalty(batch.old_logprobs, batch.ref_logprobs, kl_kind) * mask
    return rewards - kl_coef * kl, kl
