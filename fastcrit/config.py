"""One typed dataclass tree holds every default; YAML files and `--set a.b=c` only override.

Errors name the key's full path and the file (or `--set`) it came from:

    ConfigError: configs/cpu/grpo.yaml: rollout.n: expected int, got str 'eight'
"""

from __future__ import annotations

import dataclasses
import os
import sys
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

import yaml

from fastcrit.config_checks import validate  # the cross-field rules, apart from the tree
from fastcrit.config_input import read_yaml, show, suggest
from fastcrit.errors import ConfigError
from fastcrit.models.tiny import TinySettings  # torch-free at import; the tiny model's own defaults
from fastcrit.sandbox.types import SandboxConfig  # torch-free; the sandbox's own defaults


@dataclass
class ModelConfig:
    path: str = "tiny"  # a local Hugging Face directory, or "tiny" (built once, cached on disk)
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    tiny: TinySettings = field(default_factory=TinySettings)  # built once, cached under $FASTCRIT_CACHE
    # Liger-Kernel's RMSNorm, SwiGLU and RoPE patches on the trained models, on CUDA only and only
    # for the architectures fastcrit.models.liger lists (qwen2, llama); elsewhere this does nothing.
    liger: bool = True


@dataclass
class DataConfig:
    train: str = "reverse"  # a shipped task name ("reverse") or a .jsonl / .json (array) / .parquet path
    val: str = "reverse:test"  # "<task>:<split>" or a path; "" = no validation
    # Programming problems (CTRL): the file's layout; "auto" detects fastcrit / humaneval / mbpp /
    # mbppplus / apps / taco / codecontests / livecodebench from the first row.
    format: str = "auto"
    prompt_key: str = "prompt"
    answer_key: str = "answer"
    system_prompt: str = ""
    max_prompt_len: int = 64  # prompts longer than this are skipped and counted, never truncated
    prompts_per_step: int = 8  # prompts per rollout step (x rollout.n samples)
    val_size: int = 64  # validation prompts per evaluation (greedy)
    # Rows a loader skips (not valid JSON, missing fields, unconvertible problems, repeated ids) are
    # counted and logged; true makes any one an error naming the first few. Prompts over
    # max_prompt_len are not rows skipped by a loader: they stay counted and logged either way.
    strict: bool = False


@dataclass
class RolloutConfig:
    engine: Literal["native", "sglang"] = "native"
    n: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 16
    # SGLang only (GPU)
    mem_fraction_static: float = 0.5  # share of the whole GPU the awake engine holds (weights + KV cache)
    tp_size: int = 1  # GPUs per engine; > 1 only with trainer.nproc = 1
    weight_bucket_mb: int = 512
    # Extra keyword arguments of the engine: NativeEngine's (max_batch, compact_fraction,
    # attn_implementation, static_decode, cuda_graph) or sglang.Engine's by their ServerArgs names, e.g.
    # {enable_deterministic_inference: true} (SGLang reads per-request seeds only then).
    engine_args: dict[str, Any] = field(default_factory=dict)


@dataclass
class AlgorithmConfig:
    # a recipe's name (fastcrit.registry; `fastcrit recipes` lists them): grpo, rloo; ctrl: GRPO on
    # critiques; pacs, ppo, raro: see pacs.*, ppo.*, raro.*
    name: str = "grpo"
    norm_adv_by_std: bool = True
    kl_coef: float = 0.0  # coefficient of the KL loss to the frozen reference (0 = no reference)
    kl_kind: Literal["k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl"] = "low_var_kl"
    # The KL penalty in PPO's reward, from ppo.kl_in_reward_coef: fixed, or adaptive (verl's controller):
    # after each step coef *= 1 + clip(kl / kl_target - 1, -0.2, 0.2) * sequences / kl_horizon (the step's
    # KL, a mean of per-sequence token means, and its sequences, all ranks). The KL loss stays fixed.
    kl_ctrl: Literal["fixed", "adaptive"] = "fixed"
    kl_target: float = 0.1  # verl's target_kl
    kl_horizon: float = 10000.0  # verl's horizon, in sequences
    clip_low: float = 0.2
    clip_high: float = 0.2
    clip_c: float | None = None  # dual-clip constant (> 1) for negative advantages
    loss_agg: Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"] = (
        "token-mean"
    )
    # seq-mean-token-sum-norm divides each sequence's token sum by this constant (verl's actor
    # loss_scale_factor); None = rollout.max_new_tokens. Never the longest response of a batch.
    loss_scale_factor: float | None = None
    entropy_coef: float = 0.0
    ppo_epochs: int = 1
    mini_batches: int = 1  # optimizer steps per rollout step = ppo_epochs * mini_batches
    # Where PPO's "old" log-probs come from: the trainer recomputes them with one forward pass (true),
    # or the engine's sampling log-probs are used (false). auto = recompute whenever the two can
    # differ: rollout.engine=sglang or model.dtype other than float32 (verl always recomputes).
    recompute_old_logprobs: bool | Literal["auto"] = "auto"
    # Truncated importance sampling (verl's tis_imp_ratio_cap / token-level rollout_is): each token's
    # policy-gradient loss times min(exp(old - engine log-prob), tis_cap), detached; None = off.
    # Needs recomputed old log-probs (else the weight is 1).
    tis_cap: float | None = None


@dataclass
class PACSConfig:
    """PACS: BCE-with-logits of 0/1 outcomes on grouped advantages of beta-scaled log-prob scores."""

    beta: float = 1.0  # scale of the log-prob score
    reward_method: Literal["1", "2"] = "1"  # "1": beta * sum(logp - old_logp); "2": beta * mean(logp)
    estimator: Literal["rloo", "grpo", "naive"] = "rloo"  # advantage of the score within a group
    weight_mode: Literal["question", "none", "only_positive", "only_negative"] = "question"


@dataclass
class PPOConfig:
    """PPO with a value critic (verl's design): GAE on token rewards, whitened advantages, a clipped
    value loss; the sequence reward sits on the last response token, a KL penalty optionally on
    every token."""

    critic_path: str = ""  # "" = model.path; a causal LM gets a fresh value head
    critic_lr: float = 1e-5  # the critic's AdamW lr (the rest of optim.* is shared)
    critic_warmup: int = 0  # first steps train only the critic
    gamma: float = 1.0
    lam: float = 1.0
    value_clip: float = 0.5  # |v - v_old| range of the clipped value loss
    kl_in_reward_coef: float = 0.0  # reward -= coef * kl(old, ref) per token (0 = no penalty)
    kl_in_reward_kind: Literal["k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl"] = "k1"
    # Online reward model (iterated RLHF): every this many steps the reward model (reward.name's
    # `model` part) takes rm_refresh_steps Bradley-Terry steps (rm.batch_size pairs, rm.lr) on pairs
    # of the policy's own answers since the last refresh, ranked by rm.label_reward, and scores with
    # the new weights from then on. It is checkpointed in <checkpoint>/rm/. 0 = a frozen reward model.
    rm_refresh_every: int = 0
    rm_refresh_steps: int = 10


@dataclass
class RAROConfig:
    """RARO: one model as policy and as relativistic critic (by system prompt), trained jointly."""

    policy_system: str = "Answer the question."
    critic_system: str = (
        "Two answers to the question follow, one by an expert and one by a student, in "
        "random order. Say briefly which is the expert's, then end with exactly one of "
        "[Answer 1], [Answer 2] or [Tie]."
    )
    critic_samples: int = 4  # critic verdicts per (question, answer, answer) pair: one GRPO group
    critic_max_new_tokens: int = 64
    # What the critic sees of each answer, the expert's and the policy's: "answer", the final answer
    # read by the format each data row's task declares (fastcrit.data.tasks.TASK_ANSWER_FORMATS, or
    # an answer_format column; a policy output without one is masked and counted), or "full", the
    # whole output, reasoning included.
    critic_sees: Literal["answer", "full"] = "answer"
    replay_capacity: int = 1024  # (question, expert answer, policy answer) triples kept
    replay_mode: Literal["fifo", "reservoir"] = "fifo"
    replay_ratio: float = 0.5  # share of replayed pairs in the critic's batch
    tau_crit: float = 0.55  # tie rewards, critic / policy
    tau_pol: float = 0.6
    lambda_pol: float = 1.0 / 9.0  # role weights of the joint loss
    lambda_crit: float = 8.0 / 9.0
    # The warm start (sft.data "" = made from data.train) teaches both roles' formats. Policy rows
    # answer with the expert's answer, except a share warm_start_cut of them, cut short at a random
    # point: a starting policy that often stops early, a gap a critic can see. Critic rows show the
    # expert's answer and another question's and name the expert's ("expert"), or the expert's
    # answer and the same cut short at a random word ("cut": the cut policy's mistake, a difference
    # a small critic learns), or the expert's answer and the same with warm_start_mistake ("wrong":
    # the wrong policy's mistake), or name one at random ("random": the critic learns the verdict
    # format only and starts at chance, still exploring).
    warm_start_cut: float = 0.0
    # A share warm_start_wrong of the policy's warm-start answers that are not cut get one mistake
    # that keeps their length, always in the same place, so that a greedy starting policy makes it
    # too: "repeat", the last word replaced by the one before it ("e d c b a" -> "e d c b b"); "swap",
    # the last two words swapped ("e d c a b"); "z", the last word replaced by "z" ("e d c b z", a
    # mistake a critic can see without reading the question). Meant for short answers of words,
    # such as reverse's.
    warm_start_wrong: float = 0.0
    warm_start_mistake: Literal["repeat", "swap", "z"] = "repeat"
    warm_start_critic: Literal["expert", "cut", "wrong", "random"] = "expert"
    # The share of questions that also get a critic row (1.0: every one). Fewer critic rows than
    # policy rows start RL with a policy that has its format and a critic that has seen the task
    # but does not yet tell the answers apart: a gap for the critic's own reward to close.
    warm_start_critic_share: float = 1.0


@dataclass
class RMConfig:
    """`fastcrit rm`: a reward model trained on preference pairs with the Bradley-Terry loss."""

    data: str = "reverse:prefs"  # a JSONL / parquet file of {prompt, chosen, rejected}, or a shipped set
    # On-policy pairs instead (the RLHF way): when label_reward is set, the starting model samples
    # samples_per_prompt answers (rollout.temperature) to each of `prompts` prompts of data.train,
    # label_reward scores them, and every two answers with different scores make a pair
    # (written to <output_dir>/pairs.jsonl); `data` is then not read.
    label_reward: str = ""
    samples_per_prompt: int = 4
    prompts: int = 2000
    val_fraction: float = 0.1  # held out for accuracy (chosen scored above rejected)
    steps: int = 200
    batch_size: int = 32  # pairs per step
    lr: float = 1e-4
    warmup_steps: int = 10
    output_dir: str = ""  # "" = <trainer.output_dir>/rm; the model is <output_dir>/final
    # On-policy pairs: prompts per chunk of sampling dealt over the ranks (the unit of work, and of
    # reuse when `fastcrit rm` runs again with the same settings; fastcrit.train.shards).
    chunk_prompts: int = 64


@dataclass
class RewardConfig:
    # A reward manager by name (see fastcrit.reward), a user function "module:function", or several
    # joined by "+" ("model+rule"), whose scores add up with `weights` (each part's score is logged).
    name: str = "reverse"
    score: Literal["pass_rate", "all_pass"] = "pass_rate"  # code: fraction of tests, or 1 if all pass
    weights: list[float] = field(default_factory=list)  # one per "+" part; [] = all 1.0
    model_path: str = ""  # the `model` manager's; "" = the one this run trains (<rm.output_dir>/final)
    model_batch_size: int = 32  # sequences per reward-model forward


@dataclass
class ProxyConfig:
    """CTRL's frozen generator ("proxy"): writes the initial solutions and revises them after a
    critique. A local model on its own engine, or an OpenAI-compatible endpoint (how a large
    generator is usually served: vLLM / SGLang / TGI / `fastcrit serve`)."""

    model: ModelConfig = field(default_factory=lambda: ModelConfig(path=""))  # "" = model.path
    # Its own engine and lengths; revisions decode greedily (temperature 0), as in the paper.
    rollout: RolloutConfig = field(
        default_factory=lambda: RolloutConfig(n=1, temperature=0.0, max_new_tokens=768, mem_fraction_static=0.2)
    )
    max_prompt_len: int = 2048  # longer revision prompts are not sent; the critique scores 0
    endpoint: str = ""  # e.g. http://127.0.0.1:8000/v1; when set, used instead of proxy.model
    api_model: str = ""  # the model name the endpoint serves
    api_key_env: str = ""  # environment variable holding the endpoint's API key ("" = none)
    concurrency: int = 64  # HTTP requests in flight
    timeout_s: float = 120.0
    retries: int = 3


@dataclass
class CTRLConfig:
    """Critique RL (CTRL): stage 1 synthesis, stage 2 RL, and test-time critique rounds."""

    synth_dir: str = ""  # stage 1 output (solutions, SFT critiques); "" = <trainer.output_dir>/synth
    # The prompts of generator, critic, stage-1 writer and reviser (fastcrit.data.ctrl_prompts):
    # "paper" = the CTRL paper's layout and instructions; "compact" = the same parts in a few words
    # (the tiny CPU models, whose contexts cannot take the paper's instructions).
    prompts: Literal["paper", "compact"] = "paper"
    # Stage 1 cuts each split's problems into chunks of this many, dealt over the ranks: the unit of
    # work and of resume (a killed run loses at most the chunk each rank had in hand). Solutions are
    # seeded per problem, so it changes no sample beyond the last float bits of differently shaped
    # batches; a resume needs the value the stage started with.
    synth_chunk: int = 64
    # The model that writes the initial solutions (stage 1 and test time): a local model dir;
    # "" = the proxy, which then both answers and revises (the paper's setup).
    generator: str = ""
    solutions_per_problem: int = 1  # initial solutions sampled from the generator per problem
    # Who writes stage 1's critiques (fastcrit.recipes.ctrl.writer): "model" = a writer model given
    # the execution feedback as a hint it must not reveal (the paper's; critiques that leak the
    # hint, lack a verdict or whose verdict disagrees with execution are dropped and counted);
    # "template" = a fixed text filled from the feedback and the reference solution (no model).
    synth_writer: Literal["model", "template"] = "model"
    synth_writer_model: str = ""  # local model dir; "" = the critic's base model (model.path)
    synth_writer_endpoint: str = ""  # an OpenAI-compatible writer instead of a local one
    synth_writer_api_model: str = ""  # the model name that endpoint serves
    synth_writer_temperature: float = 0.0  # 0 = greedy; attempt j of a split then draws from its seed + j
    synth_writer_top_p: float = 1.0
    solution_temperature: float = 1.0  # sampling temperature of the initial solutions
    solution_top_p: float = 1.0  # their nucleus sampling (the paper's generator: T 0.7, top-p 0.8)
    # The temperature of the solutions critics are evaluated on (stage 1's held-out split, which
    # `fastcrit train` evaluates on, and `fastcrit critique`); None = solution_temperature. 0 makes
    # the critics start from the generator's greedy answers, the strongest single-answer baseline.
    eval_temperature: float | None = None
    sft_balance: bool = True  # repeat the rarer judgment's critiques until both are as many
    # Seeds the held-out problems' initial solutions (stage 1's val split) apart from trainer.seed,
    # so runs with different training seeds are evaluated on the same solutions and the spread
    # between them is their critics' own (0 samples what trainer.seed 0 does).
    val_seed: int = 0
    # Training reward: a critique whose own review contradicts itself (a word marked "[x -> x]" as
    # different where both sides agree, or a verdict against its review), whose edit does not fit
    # it (Correct with a change to make; Incorrect with an edit that changes nothing or is not the
    # change its review states), or that misquotes the code it reviews (the line it says the code
    # has is not in the code; an Incorrect verdict's edit of a part the code lacks;
    # fastcrit.data.critique.review_agrees) is invalid: it scores
    # 0 and is not executed, as a critique without a judgment. Reads the critique and the code it
    # reviews, never the outcome. Off = the paper's rule alone.
    consistent_review: bool = False
    # With consistent_review: a critique with no review it can check (neither a word-by-word nor a
    # whole-line review of the code's line) is invalid too, so dropping the review is no way out.
    require_review: bool = False
    # Training reward: Critique-RL's direct discriminability reward (Xi et al., 2025): a valid
    # critique whose verdict matches the sandbox's outcome of the solution it judged earns this much
    # on top of its revision's score. 0 = the paper's rule alone (the revision's score only).
    judgment_reward: float = 0.0
    # Critique-RL's stage I: the first this many RL steps reward the verdict alone (judgment_reward
    # x right verdict; nothing is revised or executed); the revision's score joins after them.
    judgment_only_steps: int = 0
    rounds: int = 1  # critique -> revision rounds at test time (`fastcrit critique`)
    # `fastcrit critique` (fastcrit.recipes.ctrl.evaluate): initial solutions per problem (sampled at
    # solution_temperature; stage 1's count is solutions_per_problem), seeds (trainer.seed, +1, ...;
    # figures are means with their standard error), and the baselines in the same table
    eval_solutions: int = 5
    eval_seeds: int = 3
    baselines: list[str] = field(
        default_factory=lambda: ["generator_greedy", "no_critique", "self_critique", "execution_feedback"]
    )
    # Test time and the held-out evaluation: the critic's sampling temperature (0 = greedy) and how
    # many critiques each solution gets, each the start of its own chain of rounds (figures are means
    # over them: the expected pass@1 and judgment accuracy of one sampled critique). The revisions
    # stay greedy (the paper's proxy). Sampled, the evaluation reports the greedy round beside it.
    critique_temperature: float = 0.0
    critique_top_p: float = 1.0  # sampled critiques: nucleus sampling (the paper's critic: T 0.7, top-p 0.8)
    critique_samples: int = 1
    critic: str = ""  # test time: critic model dir; "" = newest checkpoint of trainer.output_dir
    critic_endpoint: str = ""  # test time: an OpenAI-compatible critic instead of a local one
    critic_api_model: str = ""  # the model name that critic endpoint serves
    output: str = ""  # test-time JSONL of every round; "" = <trainer.output_dir>/critique.jsonl


@dataclass
class OptimConfig:
    lr: float = 1e-5
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    grad_clip: float = 1.0
    warmup_steps: int = 0
    lr_schedule: Literal["constant", "cosine"] = "constant"  # after warm-up; over every optimizer step
    min_lr_ratio: float = 0.0  # cosine: the last step's lr as a fraction of lr


@dataclass
class SFTConfig:
    """Supervised warm start on (prompt, answer) pairs; also run alone by `fastcrit sft`."""

    steps: int = 0  # 0 = no warm start before RL
    batch_size: int = 32
    lr: float = 1e-3
    warmup_steps: int = 10
    lr_schedule: Literal["constant", "cosine"] = "constant"  # cosine decays to optim.min_lr_ratio
    data: str = "reverse"
    output_dir: str = ""  # "" = <trainer.output_dir>/sft


@dataclass
class TrainerConfig:
    total_steps: int = 100
    output_dir: str = "runs/grpo"
    save_every: int = 50  # 0 = only at the end
    # Complete checkpoints kept in output_dir/checkpoints: after each save the older ones go, never
    # the one just written (so the last step's, the model a finished run hands over, always stays).
    # 0 or null = keep every one.
    keep_last: int | None = 2
    eval_every: int = 0  # 0 = only at the start and the end
    seed: int = 0
    device: Literal["cpu", "cuda"] = "cpu"
    nproc: int = 1  # training processes (FSDP2 world size); gloo on CPU, nccl on CUDA. Under torchrun: its world size
    # How long a rank waits for the others (joining, and in each collective) before it stops with an
    # error naming itself: a node that never joins, a rank that died without its peers noticing.
    dist_timeout_s: float = 1800.0  # fastcrit.train.dist.DEFAULT_TIMEOUT_S reads it (why 1800: dist.py)
    # Stages dealt over the ranks in chunks through files (CTRL's synthesis, rm's on-policy answers;
    # fastcrit.train.shards): how long a rank waits while no new chunk appears (the others' chunks,
    # then rank 0's merge) before it stops with an error naming the missing chunks and their ranks.
    # The clock restarts with every chunk, so it bounds one chunk's time, not the stage's.
    stage_wait_s: float = 3600.0
    micro_batch_size: int = 64  # sequences per forward/backward
    # Sequences per forward-only pass (old and reference log-probs, values): no activations are
    # kept there, so it can be larger than micro_batch_size (verl's log_prob_micro_batch_size).
    # 0 = micro_batch_size.
    logprob_micro_batch_size: int = 0
    # > 0: micro-batches by a token budget instead (rows x longest row <= this many tokens, longest
    # rows first, each cut to its own longest row); ranks agree on how many. 0 = micro_batch_size rows.
    max_tokens_per_micro_batch: int = 0
    # With a token budget: the rows of a micro-batch run end to end without padding (positions
    # restart per row; flash-attn's varlen path on CUDA, a block-causal mask on CPU, which is slower
    # there than padding and is for checking). The budget then counts real tokens.
    pack_sequences: bool = False
    # Rows with the same prompt (a group's n samples) run the prompt once in every training and
    # reference forward: its keys and values are computed for one row and gathered to the others
    # (the same log-probs and gradients up to rounding; the layers see p + n r tokens, not n (p + r)).
    # Not with pack_sequences (the packed rows run as they are).
    share_prompts: bool = True
    # Activation checkpointing per decoder layer in every trained model (SFT, the policy update,
    # PPO's value critic, reward models): each layer keeps only its input and runs again in the
    # backward. The same loss and gradients; ~1/3 more compute in the update for activations of
    # one layer instead of all (what lets a 7B model's micro-batches fit beside its optimizer).
    # A training forward then runs rows whole (share_prompts applies to forward-only passes).
    gradient_checkpointing: bool = False
    # Every model's decoder layers (the policy, the reference, SFT, PPO's critic, reward models)
    # through torch.compile (Inductor, dynamic shapes; fastcrit.train.policy.compile_layers): the
    # same log-probs and gradients to rounding. Compiling takes tens of seconds per kind of pass,
    # paid in the first step (compile/time_s, compile/graphs in the metrics). Off by default: on a
    # CPU our hand-fused RMSNorm / SwiGLU functions and SDPA already run the layers about as fast
    # (benchmarks/README.md, bench_trl.py --compile). With share_prompts the shared-prompt passes
    # run the layers eager (a KV cache would give every layer its own graphs).
    compile: bool = False
    # `fastcrit train` on CUDA first runs `fastcrit plan`'s check (each phase's device memory from
    # the config and the models' config.json) and stops before loading weights when a phase cannot
    # fit, naming the keys that would make it fit. true skips the check.
    skip_plan: bool = False
    resume: bool = True  # continue from the newest checkpoint in output_dir when there is one
    progress: bool = True
    # Where the metrics rows go (fastcrit.train.trackers), rank 0 only, the same keys at the same
    # steps as metrics.jsonl, which is always written ("jsonl" may be named or not), and the summary:
    # "tensorboard": event files in <output_dir>/tensorboard (pip install 'fastcrit[tensorboard]');
    # "wandb": a Weights & Biases run (pip install wandb). SFT and reward-model stages log to their
    # own directories (<output_dir>/sft/tensorboard; W&B runs "<name>-sft", "<name>-rm").
    loggers: list[Literal["jsonl", "tensorboard", "wandb"]] = field(default_factory=lambda: ["jsonl"])
    wandb_project: str = "fastcrit"
    wandb_name: str = ""  # the W&B run's name; "" = the output directory's name
    # "" = W&B's own choice (the WANDB_MODE environment variable, else online); "offline" writes the
    # run under <output_dir>/wandb only (`wandb sync` uploads it later)
    wandb_mode: Literal["", "online", "offline"] = ""
    compute_threads: int = 0  # torch threads per process; 0 = leave torch's default

    @property
    def forward_micro_batch_size(self) -> int:
        """Rows per forward-only micro-batch: ``logprob_micro_batch_size``, or ``micro_batch_size``."""
        return self.logprob_micro_batch_size or self.micro_batch_size


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)  # code rewards (CTRL, ...)
    proxy: ProxyConfig = field(default_factory=ProxyConfig)  # CTRL's generator / reviser
    ctrl: CTRLConfig = field(default_factory=CTRLConfig)
    pacs: PACSConfig = field(default_factory=PACSConfig)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    rm: RMConfig = field(default_factory=RMConfig)
    raro: RAROConfig = field(default_factory=RAROConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)


# ---------------------------------------------------------------------------------------------
# Overriding with type checks


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if origin is Literal:
        choices = typing.get_args(tp)
        if value not in choices:
            raise ConfigError(f"{where}: expected one of {list(choices)}, got {show(value)}")
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, where)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if errors else f"{where}: bad value {show(value)}")
    if tp is tuple or origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {type(value).__name__} {show(value)}")
        return tuple(value)
    if tp is dict or origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {type(value).__name__} {show(value)}")
        key_tp, val_tp = typing.get_args(tp) or (Any, Any)
        return {_coerce(k, key_tp, where): _coerce(v, val_tp, f"{where}.{k}") for k, v in value.items()}
    if origin is list:
        (item_tp,) = typing.get_args(tp) or (Any,)
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list, got {type(value).__name__} {show(value)}")
        return [_coerce(v, item_tp, f"{where}[{i}]") for i, v in enumerate(value)]
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: expected bool, got {type(value).__name__} {show(value)}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: expected int, got {type(value).__name__} {show(value)}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads `1e-6` (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{where}: expected float, got {type(value).__name__} {show(value)}")
    if tp is str:
        if isinstance(value, str):
            if "\0" in value:  # no path or name can hold one; os calls would raise mid-run
                raise ConfigError(f"{where}: contains a NUL character: {show(value)}")
            return value
        hint = " (YAML reads yes/no/on/off/true/false as booleans: quote the value)" if isinstance(value, bool) else ""
        raise ConfigError(f"{where}: expected str, got {type(value).__name__} {show(value)}{hint}")
    raise ConfigError(f"{where}: unsupported type {_type_name(tp)}")


def _apply(node: Any, overrides: dict, prefix: str, source: str) -> None:
    hints = typing.get_type_hints(type(node))
    for key, value in overrides.items():
        path = f"{prefix}{key}"
        if not isinstance(key, str) or key not in hints:
            raise ConfigError(f"{source}: {path}: unknown key{suggest(key, node, prefix, Config())}")
        tp = hints[key]
        current = getattr(node, key)
        if dataclasses.is_dataclass(current):
            if not isinstance(value, dict):
                raise ConfigError(f"{source}: {path}: expected a mapping (the section's keys), got {show(value)}")
            _apply(current, value, f"{path}.", source)
        else:
            try:
                setattr(node, key, _coerce(value, tp, path))
            except ConfigError as e:
                raise ConfigError(f"{source}: {e}") from None


def parse_set(item: str) -> dict:
    """`a.b.c=value` -> {"a": {"b": {"c": value}}}; the value is read as YAML (`8`, `true`, `[1,2]`)."""
    if "=" not in item:
        raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. --set rollout.n=8")
    key, raw = item.split("=", 1)
    value = read_yaml(raw, f"--set {show(item)}") if raw != "" else ""
    out: dict = {}
    node = out
    parts = key.strip().split(".")
    if not all(parts):
        raise ConfigError(f"--set {item!r}: bad key {key!r}")
    for p in parts[:-1]:
        node = node.setdefault(p, {})
    node[parts[-1]] = value
    return out


def load_config(path: str | None = None, sets: list[str] | None = None, world_size: int | None = None) -> Config:
    """The defaults, then ``path``'s YAML, then each ``--set``, validated. ``world_size`` (torchrun's,
    when it started this process) replaces trainer.nproc before the checks, with a note on stderr
    from rank 0 when the two differ."""
    cfg = Config()
    if path is not None:
        if os.path.isdir(path):
            raise ConfigError(f"{path}: is a directory, not a config file")
        if not os.path.isfile(path):
            raise ConfigError(f"{path}: config file not found")
        try:
            with open(path, "rb") as f:  # bytes: PyYAML then names the byte that is not UTF-8
                data = read_yaml(f, path)
        except OSError as e:
            raise ConfigError(f"{path}: cannot read the config file ({e.strerror or e})") from None
        data = {} if data is None else data
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: the top level must be a mapping, got {type(data).__name__}")
        _apply(cfg, data, "", path)
    for item in sets or []:
        _apply(cfg, parse_set(item), "", "--set")
    if world_size is not None and world_size != cfg.trainer.nproc:
        if os.environ.get("RANK", "0") == "0":
            print(
                f"fastcrit: trainer.nproc={cfg.trainer.nproc} is replaced by torchrun's world size "
                f"{world_size} (--nnodes x --nproc-per-node)",
                file=sys.stderr,
                flush=True,
            )
        cfg.trainer.nproc = world_size
    validate(cfg)
    return cfg


def to_dict(cfg: Any) -> dict:
    def plain(v):
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        return v

    return plain(dataclasses.asdict(cfg))


def dump_yaml(cfg: Config, path: str) -> None:
    with open(path, "w") as f:
        yaml.safe_dump(to_dict(cfg), f, sort_keys=False)
