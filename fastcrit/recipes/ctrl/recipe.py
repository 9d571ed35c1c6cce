"""CTRL stage 2 (Xie et al., 2025): the critic learns by GRPO to write critiques that make a frozen
generator fix its code.

    for each (problem, initial solution):      # from stage 1 (synthesis.py)
        critiques ~ critic(problem, solution)   x n
        revision  = proxy(problem, solution, critique)      greedy; skipped if no judgment
        reward    = sandbox pass rate of the revision        0 if the critique has no judgment
    GRPO advantages over the n critiques; KL loss to the reference; PPO clipped update; sync.

Departure from verl's pipeline, on purpose: the sandbox runs while the reference log-probs are
computed (``time/sandbox_s`` wall, ``time/sandbox_wait_s`` what was left after the reference pass,
``time/ref_s``), not before them. The reward sits on the critique's last token (an outcome reward:
GRPO broadcasts the sequence advantage over the critique's tokens).
"""

from __future__ import annotations

import dataclasses
import sys
import time

import torch
from tqdm import tqdm

from fastcrit.algos.advantages import outcome_advantages
from fastcrit.data.critique import review_agrees
from fastcrit.data.ctrl_prompts import critique_messages
from fastcrit.data.prompts import encode_chat
from fastcrit.recipes.ctrl.evaluate import baseline_round, figures, greedy_pass_at_1
from fastcrit.recipes.ctrl.rounds import (
    Attempt,
    RoundReport,
    critique_protocol,
    critique_round,
    kept_when_correct,
    repeat_attempts,
    revise,
    round_seed,
)
from fastcrit.recipes.ctrl.shared import critic_sft_path, load_attempts, make_generator, make_proxy, synth_dir
from fastcrit.recipes.ctrl.synthesis import run_synth
from fastcrit.recipes.scaffold import Run
from fastcrit.registry import Recipe
from fastcrit.reward import RewardItem, make_reward
from fastcrit.rollout.chat import LocalChat
from fastcrit.train.dist import all_reduce_mean, std_over_ranks
from fastcrit.train.memory import return_memory
from fastcrit.types import is_greedy

RECIPE = Recipe(
    names=("ctrl",),
    step="CTRL",
    prepare="prepare",
    reward_names=("code",),  # the sandbox scores the revisions
    prompt_rows=False,  # data.train / data.val are problem files (data.format), read by its pre-stage
    proxy=True,
)


def prepare(ctx, cfg):
    """Before training (`fastcrit train` and `fastcrit sft`): stage 1, the synthetic critiques (kept
    once complete); an empty sft.data means its critic SFT rows."""
    out = run_synth(ctx, cfg)
    if cfg.sft.data:
        return cfg
    return dataclasses.replace(cfg, sft=dataclasses.replace(cfg.sft, data=critic_sft_path(out)))


def critique_scores(n: int, sent: list[tuple[int, str]], results) -> torch.Tensor:
    """[n] rewards: the revision's score where one ran, else 0 (no judgment, or not sent)."""
    scores = torch.zeros(n)
    for (i, _), r in zip(sent, results):
        scores[i] = r.score
    return scores


def judged_right(attempts: list[Attempt], judged: list[bool | None], skip: set[int]) -> torch.Tensor:
    """[n] 1.0 where a valid critique's verdict is the real outcome of the solution it judged (the
    discriminability reward of ``ctrl.judgment_reward``); 0 for a wrong verdict, none, or an invalid
    critique (in ``skip``)."""
    return torch.tensor(
        [float(j is not None and i not in skip and j == a.passed) for i, (j, a) in enumerate(zip(judged, attempts))]
    )


class CTRL:
    def __init__(self, run: Run):
        c = run.cfg
        self.run = run
        self.reward = make_reward(c, run.out, run.ctx.rank)
        # the proxy sleeps while the trainer works and wakes for the revisions (on a GPU)
        self.proxy = make_proxy(c, run.ctx.device, sleeps=True)
        self.proxy.sleep()
        d = synth_dir(c)
        self.pairs = self._encode(load_attempts(d, "train"))
        self.val = load_attempts(d, "val")[: c.data.val_size] if c.data.val else []
        self.critic = LocalChat(run.engine, run.tok, max_prompt_len=c.data.max_prompt_len)
        self.baselines: dict[str, float] | None = None  # measured at the first evaluation (frozen models)

    def _encode(self, attempts: list[Attempt]) -> list[tuple[list[int], Attempt]]:
        tok, limit, out, skipped = self.run.tok, self.run.cfg.data.max_prompt_len, [], 0
        for a in attempts:
            ids = encode_chat(tok, critique_messages(a.problem, a.solution, self.run.cfg.ctrl.prompts))
            if len(ids) > limit:
                skipped += 1
                continue
            out.append((ids, a))
        if skipped:
            self.run.log.write(f"data: skipped {skipped} critique prompts longer than data.max_prompt_len={limit}")
        return out

    def step(self, step: int) -> dict[str, float]:
        run, c = self.run, self.run.cfg
        self.reward.stats()  # the step's sandbox counters start here (not with an evaluation's)
        pairs = run.share(self.pairs, step)
        rollouts = run.generate([ids for ids, _ in pairs], run.sampling(step))  # n critiques each
        attempts = [pairs[r.prompt_index][1] for r in rollouts]
        critiques = [run.tok.decode(r.output_ids, skip_special_tokens=True) for r in rollouts]
        invalid = self._inconsistent(attempts, critiques)
        stage_one = step <= c.ctrl.judgment_only_steps  # Critique-RL's stage I: the verdict alone
        skip = set(range(len(critiques))) if stage_one else invalid
        with run.timer("revise"):
            self._wake_proxy()
            judged, sent = revise(
                self.proxy,
                attempts,
                critiques,
                max_new_tokens=c.proxy.rollout.max_new_tokens,
                temperature=c.proxy.rollout.temperature,
                skip=skip,
                style=c.ctrl.prompts,
            )
            self.proxy.sleep()
        t0, finished = time.perf_counter(), []
        pending = self.reward.submit(
            [RewardItem(attempts[i].problem.question, text, "", problem=attempts[i].problem) for i, text in sent]
        )
        pending.add_done_callback(lambda _: finished.append(time.perf_counter()))  # the sandbox runs ...
        batch = run.batch(rollouts, None)
        batch.ref_logprobs = run.reference(batch)  # ... while the reference scores the critiques
        with run.timer("sandbox_wait"):
            results = pending.result()
        run.times["time/sandbox_s"] = (finished[0] if finished else time.perf_counter()) - t0
        revision = critique_scores(len(rollouts), sent, results)
        right = judged_right(attempts, judged, invalid)
        batch.scores = scores = revision + c.ctrl.judgment_reward * right
        batch.advantages = outcome_advantages(
            "grpo", scores, batch.group_ids, batch.response_mask, norm_by_std=c.algorithm.norm_adv_by_std
        )
        stats = run.update(batch)
        run.sync()
        return {
            **self._metrics(attempts, critiques, judged, sent, results, scores),
            "reward/revision_mean": revision.mean().item(),
            "reward/judgment_mean": right.mean().item(),
            "response_len/mean": batch.response_mask.sum(-1).mean().item(),
            **stats,
        }

    def _inconsistent(self, attempts: list[Attempt], critiques: list[str]) -> set[int]:
        """The critiques that contradict their own review, when ``ctrl.consistent_review`` makes
        them invalid, and those without a review when ``ctrl.require_review`` does (CTRLConfig)."""
        c = self.run.cfg.ctrl
        if not c.consistent_review:
            return set()
        out = {True} if c.require_review else {True, None}  # None: nothing to check
        return {i for i, (a, t) in enumerate(zip(attempts, critiques)) if review_agrees(t, a.solution) not in out}

    def _metrics(self, attempts, critiques, judged, sent, results, scores) -> dict[str, float]:
        n = max(len(attempts), 1)
        after = {
            i: r.info.get("total", 0) > 0 and r.info.get("passed") == r.info.get("total")
            for (i, _), r in zip(sent, results)
        }
        failing = [i for i in after if not attempts[i].passed]
        passing = [i for i in after if attempts[i].passed]
        told, kept = kept_when_correct(attempts, judged, sent)
        agree = [v for v in map(review_agrees, critiques, (a.solution for a in attempts)) if v is not None]
        sb = self.reward.stats()
        return {
            "reward/mean": scores.mean().item(),
            "reward/std": std_over_ranks(scores),
            "critique/valid_rate": sum(j is not None for j in judged) / n,
            "critique/judgment_acc": sum(j is not None and j == a.passed for j, a in zip(judged, attempts)) / n,
            "critique/review_agrees": sum(agree) / max(len(agree), 1),
            "critique/reviewed_rate": len(agree) / n,
            "revision/pass_rate": sum(after.values()) / max(len(after), 1),
            "revision/fixed": sum(after[i] for i in failing) / max(len(failing), 1),
            "revision/broken": sum(not after[i] for i in passing) / max(len(passing), 1),
            "revision/kept_when_correct": kept / max(told, 1),
            "initial/pass_rate": sum(a.passed for a in attempts) / n,
            "sandbox/cache_hit_rate": sb["hit_rate"],
            "sandbox/executions": float(sb["executions"]),
        }

    def evaluate(self) -> dict[str, float]:
        """One critique -> revision round on this rank's share of the held-out solutions (the
        paper's table in miniature), the critiques as ``ctrl.critique_temperature`` /
        ``critique_samples`` say; sampled, a greedy round too (``val/greedy_*``). Means over ranks.
        Every evaluation draws the same numbers (seed ``trainer.seed``), so the SFT and RL critics
        are compared on the same draws."""
        if not self.val:
            return {}
        run, c = self.run, self.run.cfg
        share = self.val[run.ctx.rank :: run.ctx.world_size]
        tokens = dict(
            critic_tokens=c.rollout.max_new_tokens,
            generator_tokens=c.proxy.rollout.max_new_tokens,
            style=c.ctrl.prompts,
        )
        temperature, k = c.ctrl.critique_temperature, c.ctrl.critique_samples
        steps = 1 + (not is_greedy(temperature)) + (len(c.ctrl.baselines) if self.baselines is None else 0)
        # rank 0's, under the training bar, gone once done; disable=None: none when stderr is no terminal
        bar = tqdm(
            total=steps,
            desc="eval",
            unit="step",
            file=sys.stderr,
            dynamic_ncols=True,
            leave=False,
            disable=None if c.trainer.progress and run.ctx.is_main else True,
        )
        self._wake_proxy()
        _, rep, _ = critique_round(
            self.critic,
            self.proxy,
            self.reward,
            repeat_attempts(share, k),
            temperature=temperature,
            seed=round_seed(c.trainer.seed, 1),
            top_p=c.ctrl.critique_top_p,
            **tokens,
        )
        bar.update(1)
        out = {
            **RoundReport(0, sum(a.passed for a in share) / len(share)).metrics("val/generator_"),
            **rep.metrics("val/"),
        }
        if not is_greedy(temperature):
            _, greedy, _ = critique_round(self.critic, self.proxy, self.reward, share, **tokens)
            out.update(greedy.metrics("val/greedy_"))
            bar.update(1)
        if self.baselines is None:
            self.baselines = self._baselines(share, bar)
        bar.close()
        out.update(self.baselines)
        self.proxy.sleep()
        return all_reduce_mean(out)

    def _baselines(self, share: list[Attempt], bar=None) -> dict[str, float]:
        """``ctrl.baselines`` on this rank's held-out solutions, once (they involve no critic): the
        generator's greedy pass@1, and one round without a critique, with the generator critiquing
        itself, and with the execution feedback (fastcrit.recipes.ctrl.evaluate)."""
        c = self.run.cfg
        generator = make_generator(c, self.run.ctx.device) if c.ctrl.generator else self.proxy
        out = {}
        try:
            for name in c.ctrl.baselines:
                if name == "generator_greedy":
                    out["val/generator_greedy_pass@1"] = greedy_pass_at_1(
                        generator, self.reward, [a.problem for a in share], c
                    )
                else:
                    _, rep, _ = baseline_round(name, c, generator, self.proxy, self.reward, share, seed=c.trainer.seed)
                    out.update({f"val/{name}_{k}": v for k, v in figures(rep).items()})
                if bar is not None:
                    bar.update(1)
        finally:
            if generator is not self.proxy:
                generator.close()
        return out

    def _wake_proxy(self) -> None:
        """The proxy's memory back on the device, after the trainer's unused cached blocks went
        back to the driver (an SGLang proxy allocates in its own processes)."""
        return_memory(self.run.ctx.device)
        self.proxy.wake()

    def summary(self, first: dict, last: dict) -> dict:
        """The paper's table in miniature. "sft_critic" is the critic RL started from (the SFT warm
        start when sft.steps > 0), "rl_critic" the one it ended with."""
        if not first:
            return {}
        return {
            "eval": {
                "problems": len(self.val),
                "generator": first["val/generator_pass@1"],
                "sft_critic": first["val/pass@1"],
                "rl_critic": last["val/pass@1"],
                # the baselines (ctrl.baselines), measured once: what the critics must beat
                **{
                    k: first.get(f"val/{k}_pass@1")
                    for k in ("generator_greedy", "no_critique", "self_critique", "execution_feedback")
                    if f"val/{k}_pass@1" in first
                },
                **(
                    {"self_critique_judgment_acc": first["val/self_critique_judgment_acc"]}
                    if "val/self_critique_judgment_acc" in first
                    else {}
                ),
                "sft_critic_judgment_acc": first["val/judgment_acc"],
                "rl_critic_judgment_acc": last["val/judgment_acc"],
                "sft_critic_fixed": first["val/fixed"],
                "rl_critic_fixed": last["val/fixed"],
                "sft_critic_broken": first["val/broken"],
                "rl_critic_broken": last["val/broken"],
                # the paper's Δ↑ / Δ↓: fixed / broken as shares of all held-out problems
                "sft_critic_delta_up": first.get("val/delta_up"),
                "rl_critic_delta_up": last.get("val/delta_up"),
                "sft_critic_delta_down": first.get("val/delta_down"),
                "rl_critic_delta_down": last.get("val/delta_down"),
                # how often the proxy left the code alone when told it was correct (its literalness)
                "sft_critic_kept_when_correct": first.get("val/kept_when_correct"),
                "rl_critic_kept_when_correct": last.get("val/kept_when_correct"),
                # how often a critique was true to its own review of the code's line (critique/review_agrees)
                "sft_critic_review_agrees": first.get("val/review_agrees"),
                "rl_critic_review_agrees": last.get("val/review_agrees"),
                # how the critiques above were written (greedy: temperature 0, one per solution)
                "critique_temperature": self.run.cfg.ctrl.critique_temperature,
                "critique_top_p": self.run.cfg.ctrl.critique_top_p,
                "critique_samples": self.run.cfg.ctrl.critique_samples,
                **(
                    {}
                    if "val/greedy_pass@1" not in first
                    else {
                        "sft_critic_greedy": first["val/greedy_pass@1"],
                        "rl_critic_greedy": last["val/greedy_pass@1"],
                        "sft_critic_greedy_judgment_acc": first["val/greedy_judgment_acc"],
                        "rl_critic_greedy_judgment_acc": last["val/greedy_judgment_acc"],
                    }
                ),
            }
        }

    def summary_lines(self, summary: dict) -> list[str]:
        e = summary.get("eval")
        if not e:
            return []
        kept = lambda v: "  -" if v is None else f"{v:.3f}"
        how = critique_protocol(e["critique_temperature"], e["critique_samples"], e.get("critique_top_p", 1.0))
        greedy = (
            []
            if "sft_critic_greedy" not in e
            else [
                f"    greedy critiques: SFT critic {e['sft_critic_greedy']:.3f} / "
                f"{e['sft_critic_greedy_judgment_acc']:.3f}, RL critic {e['rl_critic_greedy']:.3f} / "
                f"{e['rl_critic_greedy_judgment_acc']:.3f} (pass@1 / judgment_acc)"
            ]
        )
        base = [
            f"    {label:13s} {e[key]:.3f}"
            + (f"   {e['self_critique_judgment_acc']:.3f}" if key == "self_critique" else "")
            for key, label in (
                ("generator_greedy", "(greedy gen.)"),
                ("no_critique", "(no critique)"),
                ("self_critique", "(self-crit.)"),
                ("execution_feedback", "(exec. feedb.)"),
            )
            if e.get(key) is not None
        ]
        return [
            f"  held-out problems ({e['problems']}), one critique -> revision round, {how}:",
            "    critic        pass@1  judgment_acc  fixed  broken  kept when judged correct",
            f"    (generator)   {e['generator']:.3f}",
            *base,
            f"    SFT critic    {e['sft_critic']:.3f}   {e['sft_critic_judgment_acc']:.3f}"
            f"         {e['sft_critic_fixed']:.3f}  {e['sft_critic_broken']:.3f}"
            f"   {kept(e.get('sft_critic_kept_when_correct'))}",
            f"    RL critic     {e['rl_critic']:.3f}   {e['rl_critic_judgment_acc']:.3f}"
            f"         {e['rl_critic_fixed']:.3f}  {e['rl_critic_broken']:.3f}"
            f"   {kept(e.get('rl_critic_kept_when_correct'))}",
            *greedy,
        ]

    def close(self) -> None:
        self.reward.close()
        self.proxy.close()
