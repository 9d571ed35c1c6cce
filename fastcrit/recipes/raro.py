"""RARO: one model as the policy and as a relativistic critic, trained jointly from expert answers
(no verifier in the loop):

    for each step:
        answers  = policy(question)                        n per question (raro.policy_system)
        shown    = each answer's final answer              by its task's format (raro.critic_sees)
        buffer.push((question, expert, shown) for each)    FIFO or reservoir, checkpointed
        pairs    = the fresh triples + replayed ones        raro.replay_ratio of the critic's batch
        verdicts = critic(question, the two answers in random order)   raro.critic_samples per pair
        label    = the one final [Answer 1] / [Answer 2] / [Tie], else unparseable
        critic reward: names the expert 1, fooled 0, tie tau_crit
        policy reward: mean over its pair's parseable verdicts of fooled 1, named 0, tie tau_pol
        advantages: GRPO within each group (a question's answers, a pair's verdicts) over kept rows
        one update on both roles' samples: lambda_pol * L_pol + lambda_crit * L_crit (+ KL) per step

A row is masked (no loss, no say in its group's advantages) and counted in ``raro/masked/<reason>``
when it is a policy answer cut at max_new_tokens (``policy_overlong``), without a final answer
(``policy_no_answer``), or with no parseable verdict (``policy_unjudged``: every verdict
unparseable, or the critic prompt longer than data.max_prompt_len), or a verdict cut at
raro.critic_max_new_tokens (``critic_overlong``) or without one label (``critic_unparseable``).
The reward manager (``reward.name``) is not used for training: when the data's answers can be
checked, it scores the policy's held-out answers (``val/reward``), which says whether fooling the
critic also meant answering better.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random

import torch

from fastcrit.algos.raro import TIE, RaroObjective, kept_group_advantages
from fastcrit.config import ConfigError
from fastcrit.config_values import loss_scale
from fastcrit.data.datasets import load_dataset
from fastcrit.data.prompts import encode_chat
from fastcrit.data.replay import ReplayBuffer
from fastcrit.data.tasks import ANSWER_FORMATS, TASK_ANSWER_FORMATS, answer_format, final_answer
from fastcrit.recipes.scaffold import Run, reward_items
from fastcrit.registry import Recipe
from fastcrit.reward import RewardItem, get_reward_manager, make_reward
from fastcrit.train.dist import all_reduce_mean, barrier
from fastcrit.types import SamplingParams

POLICY, CRITIC = 0, 1
MASKED = ("policy_overlong", "policy_no_answer", "policy_unjudged", "critic_overlong", "critic_unparseable")

RECIPE = Recipe(
    names=("raro",),
    step="RARO",
    prepare="prepare",
    minimums={
        "rollout.n": (2, "a question's answers are one group; a group of one has no advantage"),
        "raro.critic_samples": (2, "a pair's verdicts are one group; a group of one has no advantage"),
    },
    needs_reward=False,  # its critic scores the answers
    answers_in_prompt=2,  # the critic role reads the question and two answers
)


def shown_answer(text: str, example, r, where: str) -> str | None:
    """What the critic sees of ``text``, an answer to ``example``: with ``r.critic_sees == "answer"``
    its final answer by the format the example's row declares (None when it has none), else the
    whole text. A row that declares no known format is a ConfigError naming ``where``."""
    if r.critic_sees == "full":
        return text
    fmt = answer_format(example.meta)
    if fmt not in ANSWER_FORMATS:
        raise ConfigError(
            f"raro.critic_sees=answer: {where}: a row declares {'no' if fmt is None else f'an unknown ({fmt!r})'} "
            f"final-answer format; give each row a `task` that declares one ({', '.join(TASK_ANSWER_FORMATS)}) "
            f"or an `answer_format` ({' | '.join(ANSWER_FORMATS)}), or set raro.critic_sees=full"
        )
    return final_answer(text, fmt)


@dataclasses.dataclass
class Judged:
    """One critic prompt: a (question, expert, policy answer) triple shown in some order."""

    question: str
    expert: str
    answer: str
    expert_pos: int  # 1 or 2
    policy_row: int | None  # the fresh policy sample it judges; None for a replayed pair


class RARO:
    def __init__(self, run: Run):
        c = run.cfg
        self.run, self.r = run, c.raro
        self.buffer = ReplayBuffer(c.raro.replay_capacity, c.raro.replay_mode, seed=c.trainer.seed + run.ctx.rank)

        def load(spec: str, split: str):
            # the expert's answer is the critic's reference: a row without one (or, where the critic
            # sees final answers, without a final answer in it) is left out
            return run.load_prompts(
                spec,
                split,
                c.raro.policy_system,
                why="without an expert (final) answer",
                keep=lambda e: bool(e.answer) and shown_answer(e.answer, e, c.raro, spec) is not None,
            )

        self.prompts = load(c.data.train, "train")
        self.val = load(c.data.val, "test")[: c.data.val_size] if c.data.val else []
        self.check = make_reward(c, run.out, run.ctx.rank, run.ctx.device) if c.reward.name else None
        self.verdicts = get_reward_manager("raro", tau_crit=c.raro.tau_crit, tau_pol=c.raro.tau_pol)
        self.objective = RaroObjective(
            c.algorithm, {POLICY: ("policy", c.raro.lambda_pol), CRITIC: ("critic", c.raro.lambda_crit)}, loss_scale(c)
        )
        self.start_answers: list[str] | None = None  # the starting policy's held-out answers (evaluate)

    def state_dict(self) -> dict:
        return {"buffer": self.buffer.state_dict(), "start_answers": self.start_answers}

    def load_state_dict(self, state: dict) -> None:
        self.buffer.load_state_dict(state["buffer"])
        self.start_answers = state.get("start_answers")

    # -- the critic's prompt and verdicts --------------------------------------------------------

    def shown(self, text: str, example) -> str | None:
        return shown_answer(text, example, self.r, "data")

    def critic_ids(self, j: Judged) -> list[int]:
        tok = self.run.tok
        return encode_chat(tok, critic_text(j), self.r.critic_system)

    def judge(self, pairs: list[Judged], params: SamplingParams):
        """Critic rollouts for the pairs whose prompt fits, their verdicts scored by the `raro`
        reward manager (a cut-off verdict counts as unparseable), and how many prompts were too long."""
        ids = [self.critic_ids(j) for j in pairs]
        fits = [i for i, x in enumerate(ids) if len(x) <= self.run.cfg.data.max_prompt_len]
        outs = self.run.generate([ids[i] for i in fits], params)
        outs = [dataclasses.replace(o, prompt_index=fits[o.prompt_index]) for o in outs]
        items = [
            RewardItem(
                "",
                self.run.tok.decode(o.output_ids, skip_special_tokens=True) if o.finish_reason != "length" else "",
                "",
                {"expert_pos": pairs[o.prompt_index].expert_pos},
            )
            for o in outs
        ]
        return outs, self.verdicts(items), len(pairs) - len(fits)

    # -- one step ---------------------------------------------------------------------------------

    def step(self, step: int) -> dict[str, float]:
        run, r = self.run, self.r
        prompts = run.share(self.prompts, step)
        pol = run.generate([p.ids for p in prompts], run.sampling(step))
        texts = [run.tok.decode(o.output_ids, skip_special_tokens=True) for o in pol]
        masked = dict.fromkeys(MASKED, 0)
        fresh = []
        rng = random.Random(run.cfg.trainer.seed * 7919 + step * 31 + run.ctx.rank)
        for i, o in enumerate(pol):
            ex = prompts[o.prompt_index].example
            shown = self.shown(texts[i], ex) if o.finish_reason != "length" else None
            if shown is None:
                masked["policy_overlong" if o.finish_reason == "length" else "policy_no_answer"] += 1
                continue
            fresh.append(Judged(ex.prompt, self.shown(ex.answer, ex), shown, rng.choice((1, 2)), i))
        n_replay = round(len(fresh) * r.replay_ratio / (1.0 - r.replay_ratio)) if r.replay_ratio else 0
        replayed = [Judged(q, e, a, rng.choice((1, 2)), None) for q, e, a in self.buffer.sample(n_replay)]
        for j in fresh:
            self.buffer.push((j.question, j.expert, j.answer))
        pairs = fresh + replayed
        params = dataclasses.replace(
            run.sampling(step, n=r.critic_samples, stream=1, first=run.ctx.rank * 2**24),
            max_new_tokens=r.critic_max_new_tokens,
        )
        crit, verdicts, too_long = self.judge(pairs, params)
        labels = [None if v.info["unparseable"] else v.info["label"] for v in verdicts]

        # Critic rewards by the matrix; a policy sample's is the mean over its pair's parseable verdicts.
        crit_scores, pol_votes = [v.score for v in verdicts], {}
        for o, v in zip(crit, verdicts):
            row = pairs[o.prompt_index].policy_row
            if not v.info["unparseable"] and row is not None:
                pol_votes.setdefault(row, []).append(v.info["policy_reward"])
        pol_scores = [sum(pol_votes[i]) / len(pol_votes[i]) if i in pol_votes else 0.0 for i in range(len(pol))]
        masked["policy_unjudged"] = sum(j.policy_row not in pol_votes for j in fresh)
        for o, lab in zip(crit, labels):
            if lab is None:
                masked["critic_overlong" if o.finish_reason == "length" else "critic_unparseable"] += 1

        # One joint batch: policy groups by question, critic groups by pair; left-out rows masked.
        crit_rows = [dataclasses.replace(o, prompt_index=len(prompts) + o.prompt_index) for o in crit]
        batch = run.batch(pol + crit_rows, torch.tensor(pol_scores + crit_scores, dtype=torch.float32))
        keep = torch.tensor([i in pol_votes for i in range(len(pol))] + [lab is not None for lab in labels])
        batch.response_mask = batch.response_mask * keep[:, None].float()
        batch.roles = torch.tensor([POLICY] * len(pol) + [CRITIC] * len(crit))
        batch.ref_logprobs = run.reference(batch)
        adv = kept_group_advantages(batch.scores, batch.group_ids, keep, norm_by_std=run.cfg.algorithm.norm_adv_by_std)
        batch.advantages = adv[:, None] * batch.response_mask
        stats = run.update(batch, self.objective)
        run.sync()
        parsed = [(lab, pairs[o.prompt_index].expert_pos) for o, lab in zip(crit, labels) if lab is not None]
        n_crit = max(len(crit), 1)
        return {
            "raro/critic_acc": critic_acc(parsed),
            "raro/tie_rate": sum(lab == TIE for lab, _ in parsed) / max(len(parsed), 1),
            "raro/unparseable_rate": sum(lab is None for lab in labels) / n_crit,
            "raro/policy_reward": sum(pol_scores[i] for i in pol_votes) / max(len(pol_votes), 1),
            "raro/buffer_size": float(len(self.buffer)),
            "raro/replayed_pairs": float(len(replayed)),
            "raro/critic_prompt_too_long": float(too_long),
            **{f"raro/masked/{k}": float(v) for k, v in masked.items()},
            "reward/mean": batch.scores[keep].mean().item() if keep.any() else 0.0,
            **stats,
        }

    def evaluate(self) -> dict[str, float]:
        """Greedy: the policy answers each held-out question; the critic judges it against the
        expert's answer (expert first for even questions, second for odd ones). The two roles move
        together, so each is also measured against the other's start: the critic judges the
        *starting* policy's answers as well (``val/critic_acc_fixed``: did the critic learn to tell
        them from the expert's?), and ``val/start_policy_reward`` is what those answers earn from
        the current critic (the current policy's ``val/policy_reward`` above it: did the policy learn
        what the critic looks for?)."""
        if not self.val:
            return {}
        run = self.run
        share = self.val[run.ctx.rank :: run.ctx.world_size]
        greedy = SamplingParams(n=1, max_new_tokens=run.cfg.rollout.max_new_tokens, temperature=0.0)
        pol = run.engine.generate([p.ids for p in share], greedy)
        texts = [run.tok.decode(o.output_ids, skip_special_tokens=True) for o in pol]
        if self.start_answers is None:
            self.start_answers = texts
        critic_params = dataclasses.replace(greedy, max_new_tokens=self.r.critic_max_new_tokens)
        out = {f"val/{k}": v for k, v in self._judged(share, texts, critic_params).items()}
        fixed = self._judged(share, self.start_answers, critic_params)
        out["val/critic_acc_fixed"] = fixed["critic_acc"]
        out["val/start_policy_reward"] = fixed["policy_reward"]
        if self.check is not None:
            results = self.check(reward_items(pol, texts, [p.example for p in share]))
            out["val/reward"] = sum(x.score for x in results) / max(len(results), 1)
        return all_reduce_mean(out)

    def summary(self, first: dict, last: dict) -> dict:
        """Each role against the other's start: the critic's accuracy on the starting policy's
        held-out answers before and after training, and what the starting and the final policy's
        answers earn from the final critic."""
        if not first or not last:
            return {}
        out = {
            "critic_acc_start": first["val/critic_acc_fixed"],
            "critic_acc_end": last["val/critic_acc_fixed"],
            "policy_reward_start": last["val/start_policy_reward"],
            "policy_reward_end": last["val/policy_reward"],
        }
        if "val/reward" in first:
            out.update(reward_start=first["val/reward"], reward_end=last["val/reward"])
        return {"eval": out}

    def summary_lines(self, summary: dict) -> list[str]:
        e = summary.get("eval")
        if not e:
            return []
        lines = [
            f"  critic accuracy on the starting policy's held-out answers: "
            f"{e['critic_acc_start']:.3f} -> {e['critic_acc_end']:.3f}",
            f"  policy reward from the final critic, starting -> final policy: "
            f"{e['policy_reward_start']:.3f} -> {e['policy_reward_end']:.3f}",
        ]
        if "reward_start" in e:
            lines.append(
                f"  held-out task reward (reward.name, never trained on): "
                f"{e['reward_start']:.3f} -> {e['reward_end']:.3f}"
            )
        return lines

    def _judged(self, share, texts: list[str], params: SamplingParams) -> dict[str, float]:
        """The critic's greedy verdicts on (expert, answer) for each held-out question whose answer
        has a final answer to show (``no_answer_rate``: the share without)."""
        shown = [(i, p.example, self.shown(t, p.example)) for i, (p, t) in enumerate(zip(share, texts))]
        pairs = [Judged(ex.prompt, self.shown(ex.answer, ex), a, 1 + i % 2, i) for i, ex, a in shown if a is not None]
        crit, verdicts, _ = self.judge(pairs, params)
        labels = [None if v.info["unparseable"] else v.info["label"] for v in verdicts]
        parsed = [(lab, pairs[o.prompt_index].expert_pos) for o, lab in zip(crit, labels) if lab is not None]
        pol_r = [v.info["policy_reward"] for v in verdicts if not v.info["unparseable"]]
        return {
            "critic_acc": critic_acc(parsed),
            "tie_rate": sum(lab == TIE for lab, _ in parsed) / max(len(parsed), 1),
            "unparseable_rate": sum(lab is None for lab in labels) / max(len(labels), 1),
            "policy_reward": sum(pol_r) / max(len(pol_r), 1),
            "no_answer_rate": (len(shown) - len(pairs)) / max(len(shown), 1),
        }


def critic_acc(parsed: list[tuple[int, int]]) -> float:
    """Of the verdicts that name an answer (ties aside), the share naming the expert's."""
    named = [(lab, e) for lab, e in parsed if lab != TIE]
    return sum(lab == e for lab, e in named) / max(len(named), 1)


def warm_start_rows(examples, r, seed: int = 0) -> list[dict]:
    """SFT rows for both roles, from the expert answers alone: the policy answers each question (a
    share ``r.warm_start_cut`` of its answers cut short at a random word, a share
    ``r.warm_start_wrong`` of the others with ``with_mistake``); the critic sees the expert's answer
    and another question's expert answer (a wrong answer that looks right) or, with
    ``r.warm_start_critic == "cut"``, the expert's answer cut short at a random word (the mistake
    the cut policy makes), or with ``"wrong"`` the expert's answer with the mistake (the one the
    wrong policy makes), in random order, and names the expert's, or (``"random"``) one at random.
    Only a share ``r.warm_start_critic_share`` of the questions gets a critic row. The critic's
    answers are what it sees in training (``shown_answer``: final answers, by default)."""
    rng = random.Random(seed)
    rows = []
    for i, ex in enumerate(examples):
        answer, words = ex.answer, ex.answer.split(" ")
        if len(words) > 1 and rng.random() < r.warm_start_cut:
            answer = " ".join(words[: rng.randrange(1, len(words))])
        elif r.warm_start_wrong and rng.random() < r.warm_start_wrong:  # no draw unless set: rows as before
            answer = with_mistake(answer, r.warm_start_mistake)
        rows.append(
            {
                "messages": [
                    {"role": "system", "content": r.policy_system},
                    {"role": "user", "content": ex.prompt},
                    {"role": "assistant", "content": answer},
                ]
            }
        )
        expert = shown_answer(ex.answer, ex, r, "data.train")
        peer = examples[(i + rng.randrange(1, len(examples))) % len(examples)]
        other = shown_answer(peer.answer, peer, r, "data.train")
        shown_words = (expert or "").split(" ")
        if r.warm_start_critic == "cut" and len(shown_words) > 1:
            other = " ".join(shown_words[: rng.randrange(1, len(shown_words))])
        elif r.warm_start_critic == "wrong" and expert is not None:
            other = with_mistake(expert, r.warm_start_mistake)
        if expert is None or other is None or other == expert:
            continue
        # draws only when a share is set, so the default's rows stay those of earlier runs
        if r.warm_start_critic_share < 1.0 and rng.random() >= r.warm_start_critic_share:
            continue
        pos = rng.choice((1, 2))
        j = Judged(ex.prompt, expert, other, pos, None)
        label = rng.choice((1, 2)) if r.warm_start_critic == "random" else pos
        rows.append(
            {
                "messages": [
                    {"role": "system", "content": r.critic_system},
                    {"role": "user", "content": critic_text(j)},
                    {"role": "assistant", "content": f"[Answer {label}]"},
                ]
            }
        )
    return rows


def with_mistake(answer: str, kind: str) -> str:
    """``answer`` with the warm start's mistake ``kind`` (``raro.warm_start_mistake``) in its last
    two words (split on single spaces), its length kept: ``"repeat"`` writes the second-to-last word
    again in place of the last ("e d c b a" -> "e d c b b"), ``"swap"`` swaps the two ("e d c a b"),
    ``"z"`` writes "z" in place of the last ("e d c b z": a mistake seen in the answer alone). An
    answer of one word, or that the mistake leaves as it was, comes back unchanged."""
    words = answer.split(" ")
    if len(words) < 2:
        return answer
    if kind == "repeat":
        words[-1] = words[-2]
    elif kind == "swap":
        words[-2], words[-1] = words[-1], words[-2]
    elif kind == "z":
        words[-1] = "z"
    else:
        raise ValueError(f"raro.warm_start_mistake: unknown mistake {kind!r} (repeat | swap | z)")
    return " ".join(words)


def critic_text(j: Judged) -> str:
    first, second = (j.expert, j.answer) if j.expert_pos == 1 else (j.answer, j.expert)
    return f"Question:\n{j.question}\n\nAnswer 1:\n{first}\n\nAnswer 2:\n{second}"


def prepare(ctx, cfg):
    """Before training (`fastcrit train` and `fastcrit sft`): an empty sft.data with sft.steps > 0
    means both roles' warm start, made from data.train's expert answers."""
    if cfg.sft.data or cfg.sft.steps <= 0:
        return cfg
    return dataclasses.replace(cfg, sft=dataclasses.replace(cfg.sft, data=write_warm_start(ctx, cfg)))


def write_warm_start(ctx, cfg) -> str:
    """``<trainer.output_dir>/raro_sft.jsonl``: both roles' SFT rows from data.train (rank 0 writes)."""
    path = os.path.join(cfg.trainer.output_dir, "raro_sft.jsonl")
    if ctx.is_main and not os.path.exists(path):
        data = load_dataset(cfg.data.train, cfg.data.prompt_key, cfg.data.answer_key, strict=cfg.data.strict)
        examples = [e for e in data.examples if e.answer]
        if len(examples) < 2:
            raise ConfigError(
                f"data.train {cfg.data.train!r}: RARO's warm start needs at least two examples with expert answers"
            )
        os.makedirs(cfg.trainer.output_dir, exist_ok=True)
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            for row in warm_start_rows(examples, cfg.raro, cfg.trainer.seed):
                f.write(json.dumps(row) + "\n")
        os.replace(tmp, path)
    barrier()
    return path
