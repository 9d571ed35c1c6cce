"""PACS (implicit actor-critic coupling through supervised learning) with a 0/1 verifiable reward:

    for each step:
        sample n responses per prompt from the policy                 (behaviour log-probs kept)
        y = verifier(response) in {0, 1}
        r = beta * sum_t (log pi(y_t) - log pi_old(y_t))              (reward_method "1"; "2": mean log pi)
        A = advantage of r within the prompt's group                   (rloo | grpo | naive)
        loss = mean_b w_b * BCEWithLogits(A_b, y_b)                    (weights: pacs.weight_mode)
        optimizer steps on the loss                                    (+ KL loss if algorithm.kl_coef)

No value network and no policy-gradient term: the score r is the critic, coupled to the policy. The
loss is ``fastcrit_kernels.pacs_loss`` on the fused log-probs. With reward_method "1", r is 0 at the
first optimizer step on a batch (the policy is still the behaviour policy), so the gradient there is
that of BCE at logit 0: +(0.5 - y) per sample's log-prob ratio; later mini-batches see r move.
"""

from __future__ import annotations

import torch

from fastcrit.algos.losses import PACSObjective
from fastcrit.config import ConfigError
from fastcrit.recipes.grpo import GRPO
from fastcrit.recipes.scaffold import Run, info_means
from fastcrit.registry import Recipe

RECIPE = Recipe(
    names=("pacs",),
    step="PACS",
    minimums={"rollout.n": (2, "advantages within each prompt's samples")},
    policy_gradient=False,  # a BCE loss on the advantages: no policy-gradient term for tis_cap to weight
)


class PACS(GRPO):
    """GRPO's data, reward managers and evaluation; PACS's step."""

    def __init__(self, run: Run):
        super().__init__(run)
        self.objective = SeenLogits(PACSObjective(run.cfg.pacs, run.cfg.algorithm))

    def step(self, step: int) -> dict[str, float]:
        run = self.run
        _, rollouts, scores, results = self.sample_and_score(step)
        labels = outcome_labels(scores, run.cfg.reward.name)
        batch = run.batch(rollouts, labels)
        batch.ref_logprobs = run.reference(batch)
        self.objective.reset()
        stats = run.update(batch, self.objective)
        run.sync()
        return {
            "reward/mean": scores.mean().item(),
            **info_means(results, "reward/"),
            "pacs/pos_frac": labels.mean().item(),
            **self.objective.logit_means(),
            "response_len/mean": batch.response_mask.sum(-1).mean().item(),
            **stats,
        }


def outcome_labels(scores: torch.Tensor, reward_name: str) -> torch.Tensor:
    """PACS trains on 0/1 outcomes: any other score is a configuration error, named."""
    bad = scores[(scores != 0) & (scores != 1)]
    if len(bad):
        raise ConfigError(
            f"algorithm.name=pacs needs 0/1 rewards, but reward manager {reward_name!r} "
            f"gave {bad[:3].tolist()}: choose a binary one (e.g. reward.name=exact_match, "
            f"or reward.score=all_pass for code)"
        )
    return scores.float()


class SeenLogits:
    """The PACS objective, remembering the logits (advantages of r) the loss saw in this step."""

    def __init__(self, inner: PACSObjective):
        self.inner = inner
        self.agg, self.whole_groups, self.entropy = inner.agg, inner.whole_groups, inner.entropy
        self.seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    def reset(self) -> None:
        self.seen = []

    def check(self, batch) -> None:
        self.inner.check(batch)

    def __call__(self, logp, entropy, mb):
        d = logp.device
        a = self.inner.logits(logp.detach(), mb.old_logprobs.to(d), mb.response_mask.to(d), mb.group_ids)
        self.seen.append((a.cpu(), mb.scores))
        return self.inner(logp, entropy, mb)

    def logit_means(self) -> dict[str, float]:
        """pacs/logit_pos, pacs/logit_neg: mean logit on samples labelled 1 / 0 (0 when none)."""
        if not self.seen:
            return {}
        a = torch.cat([s[0] for s in self.seen])
        y = torch.cat([s[1] for s in self.seen])
        mean = lambda m: a[m].mean().item() if m.any() else 0.0
        return {"pacs/logit_pos": mean(y == 1), "pacs/logit_neg": mean(y == 0)}
