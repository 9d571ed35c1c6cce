"""The cross-field rules of a config: what the types of fastcrit/config.py's dataclass tree cannot
express (a count that must be positive, settings that only make sense together, a recipe's needs as
its fastcrit.registry declaration states them). ``load_config`` calls ``validate`` on every config it
builds; a broken rule raises ConfigError naming the field."""

from __future__ import annotations

import dataclasses

from fastcrit.config_ranges import check_ranges
from fastcrit.config_values import recompute_old_logprobs
from fastcrit.errors import ConfigError
from fastcrit.registry import recipe
from fastcrit.sandbox.types import SandboxConfig


def validate(cfg) -> None:
    """Cross-field checks that types alone cannot express (``cfg``: fastcrit.config.Config; not
    imported here, since config.py imports this module)."""

    def need(cond: bool, msg: str) -> None:
        if not cond:
            raise ConfigError(msg)

    spec = recipe(cfg.algorithm.name)  # what the recipe needs (fastcrit.registry): ConfigError if none
    check_ranges(cfg)
    need(cfg.rollout.n >= 1, f"rollout.n: must be >= 1, got {cfg.rollout.n}")
    need(cfg.rollout.max_new_tokens >= 1, "rollout.max_new_tokens: must be >= 1")
    need(cfg.rollout.temperature >= 0, "rollout.temperature: must be >= 0")
    need(0 < cfg.rollout.top_p <= 1, "rollout.top_p: must be in (0, 1]")
    for name, r in (("rollout", cfg.rollout), ("proxy.rollout", cfg.proxy.rollout)):
        need(0 < r.mem_fraction_static < 1, f"{name}.mem_fraction_static: must be in (0, 1)")
        need(r.tp_size >= 1, f"{name}.tp_size: must be >= 1")
        # Every training process starts its own engine at its own GPU: with tp_size > 1 they overlap.
        need(
            r.engine != "sglang" or r.tp_size == 1 or cfg.trainer.nproc == 1,
            f"{name}.tp_size={r.tp_size} with trainer.nproc={cfg.trainer.nproc}: every training process "
            f"starts its own engine on GPUs rank..rank+tp_size-1, so the engines would overlap; use "
            f"tp_size=1 (one engine per GPU) or trainer.nproc=1",
        )
    need(cfg.trainer.total_steps >= 0, "trainer.total_steps: must be >= 0")
    need(cfg.trainer.nproc >= 1, "trainer.nproc: must be >= 1")
    need(
        cfg.trainer.dist_timeout_s > 0, f"trainer.dist_timeout_s: must be > 0 seconds, got {cfg.trainer.dist_timeout_s}"
    )
    need(cfg.trainer.save_every >= 0, "trainer.save_every: must be >= 0")
    need(
        cfg.trainer.keep_last is None or cfg.trainer.keep_last >= 0,
        f"trainer.keep_last: must be >= 0 (0 or null keeps every checkpoint), got {cfg.trainer.keep_last}",
    )
    need(cfg.trainer.micro_batch_size >= 1, "trainer.micro_batch_size: must be >= 1")
    need(
        cfg.trainer.logprob_micro_batch_size >= 0,
        "trainer.logprob_micro_batch_size: must be >= 0 (0 = trainer.micro_batch_size)",
    )
    need(
        cfg.trainer.max_tokens_per_micro_batch >= 0,
        "trainer.max_tokens_per_micro_batch: must be >= 0 (0 = micro-batches of micro_batch_size rows)",
    )
    need(
        not cfg.trainer.pack_sequences or cfg.trainer.max_tokens_per_micro_batch > 0,
        "trainer.pack_sequences: needs trainer.max_tokens_per_micro_batch > 0 (the tokens one packed "
        "micro-batch may hold)",
    )
    need(
        not (cfg.trainer.pack_sequences and cfg.trainer.device == "cuda") or cfg.model.dtype != "float32",
        "trainer.pack_sequences on CUDA runs on flash-attn 2, which takes bf16 / fp16 only: set "
        "model.dtype=bfloat16 (the trainer keeps fp32 master weights), or trainer.pack_sequences=false",
    )
    need(cfg.data.prompts_per_step >= 1, "data.prompts_per_step: must be >= 1")
    need(
        cfg.data.prompts_per_step % cfg.trainer.nproc == 0,
        f"data.prompts_per_step ({cfg.data.prompts_per_step}) must be a multiple of "
        f"trainer.nproc ({cfg.trainer.nproc}): each process rolls out whole groups",
    )
    need(0.0 <= cfg.optim.min_lr_ratio <= 1.0, f"optim.min_lr_ratio: must be in [0, 1], got {cfg.optim.min_lr_ratio}")
    need(cfg.algorithm.mini_batches >= 1, "algorithm.mini_batches: must be >= 1")
    need(cfg.algorithm.ppo_epochs >= 1, "algorithm.ppo_epochs: must be >= 1")
    need(
        cfg.algorithm.clip_c is None or cfg.algorithm.clip_c > 1.0,
        f"algorithm.clip_c: the dual-clip constant must be > 1, got {cfg.algorithm.clip_c}",
    )
    a = cfg.algorithm
    need(
        a.loss_scale_factor is None or a.loss_scale_factor > 0,
        f"algorithm.loss_scale_factor: must be > 0, got {a.loss_scale_factor}",
    )
    need(a.tis_cap is None or a.tis_cap > 0, f"algorithm.tis_cap: must be > 0, got {a.tis_cap}")
    need(
        a.tis_cap is None or recompute_old_logprobs(cfg),
        "algorithm.tis_cap corrects the gap between the engine's and the trainer's log-probs, which "
        "it only sees when the trainer recomputes them: set algorithm.recompute_old_logprobs=true",
    )
    need(
        a.tis_cap is None or spec.policy_gradient,
        f"algorithm.tis_cap weights the PPO policy-gradient loss; algorithm.name={a.name}'s loss has none",
    )
    for key, (least, why) in spec.minimums.items():
        section, _, name = key.partition(".")
        value = getattr(getattr(cfg, section, None), name, None)
        if not isinstance(value, int | float):
            raise ConfigError(f"{spec.file}: Recipe minimums: {key!r} is not a numeric config key")
        need(value >= least, f"{key}: algorithm.name={a.name} needs {key} >= {least}, got {value} ({why})")
    need(
        cfg.reward.name != "" or not spec.needs_reward,
        f"reward.name: empty; algorithm.name={a.name} needs a reward (only recipes that score their own "
        f"answers, e.g. raro, train without one)",
    )
    parts = cfg.reward.name.split("+") if cfg.reward.name else []
    need(all(parts), f"reward.name: empty part in {cfg.reward.name!r}")
    need(
        not cfg.reward.weights or len(cfg.reward.weights) == len(parts),
        f"reward.weights: {len(cfg.reward.weights)} weights for {len(parts)} reward parts {parts}",
    )
    if a.kl_ctrl == "adaptive":
        need(
            spec.kl_in_reward,
            f"algorithm.kl_ctrl=adaptive adapts the KL penalty in PPO's reward (ppo.kl_in_reward_coef); "
            f"algorithm.name={a.name} has none (its KL term, algorithm.kl_coef, is a loss and stays fixed)",
        )
        need(
            cfg.ppo.kl_in_reward_coef > 0,
            "algorithm.kl_ctrl=adaptive multiplies ppo.kl_in_reward_coef, the coefficient it starts from: "
            f"set it > 0 (got {cfg.ppo.kl_in_reward_coef}; 0 would stay 0)",
        )
        need(a.kl_target > 0, f"algorithm.kl_target: must be > 0, got {a.kl_target}")
        seqs = cfg.data.prompts_per_step * cfg.rollout.n
        need(
            a.kl_horizon > 0.2 * seqs,
            f"algorithm.kl_horizon ({a.kl_horizon}) must exceed 0.2 x the step's sequences ({seqs}, "
            "data.prompts_per_step x rollout.n): the adaptive coefficient's factor 1 +- 0.2 x sequences / "
            "horizon would reach 0 or below",
        )
    need(cfg.ppo.value_clip >= 0, "ppo.value_clip: must be >= 0")
    need(0.0 <= cfg.ppo.gamma <= 1.0 and 0.0 <= cfg.ppo.lam <= 1.0, "ppo.gamma, ppo.lam: must be in [0, 1]")
    need(cfg.ppo.rm_refresh_every >= 0, "ppo.rm_refresh_every: must be >= 0")
    if cfg.ppo.rm_refresh_every and spec.online_reward_model:
        need(
            "model" in cfg.reward.name.split("+"),
            f"ppo.rm_refresh_every: reward.name {cfg.reward.name!r} has no `model` part to refresh",
        )
        need(
            bool(cfg.rm.label_reward),
            "ppo.rm_refresh_every: set rm.label_reward, the reward that ranks the policy's answers into pairs",
        )
        need(cfg.ppo.rm_refresh_steps >= 1, "ppo.rm_refresh_steps: must be >= 1")
    need(0.0 < cfg.rm.val_fraction < 1.0, "rm.val_fraction: must be in (0, 1)")
    need(
        not cfg.rm.label_reward or cfg.rm.samples_per_prompt >= 2,
        "rm.samples_per_prompt: on-policy pairs need at least 2 answers per prompt",
    )
    need(0.0 <= cfg.raro.replay_ratio < 1.0, "raro.replay_ratio: must be in [0, 1)")
    need(cfg.raro.replay_capacity >= 1, "raro.replay_capacity: must be >= 1")
    need(0.0 <= cfg.raro.warm_start_cut <= 1.0, "raro.warm_start_cut: must be in [0, 1]")
    need(0.0 <= cfg.raro.warm_start_wrong <= 1.0, "raro.warm_start_wrong: must be in [0, 1]")
    need(0.0 < cfg.raro.warm_start_critic_share <= 1.0, "raro.warm_start_critic_share: must be in (0, 1]")
    need(cfg.raro.lambda_pol >= 0 and cfg.raro.lambda_crit >= 0, "raro.lambda_pol, raro.lambda_crit: must be >= 0")
    need(cfg.pacs.beta > 0, f"pacs.beta: must be > 0, got {cfg.pacs.beta}")
    need(cfg.ctrl.rounds >= 1, f"ctrl.rounds: must be >= 1, got {cfg.ctrl.rounds}")
    need(cfg.ctrl.eval_solutions >= 1, f"ctrl.eval_solutions: must be >= 1, got {cfg.ctrl.eval_solutions}")
    need(cfg.ctrl.eval_seeds >= 1, f"ctrl.eval_seeds: must be >= 1, got {cfg.ctrl.eval_seeds}")
    known = ("generator_greedy", "no_critique", "self_critique", "execution_feedback")
    bad = [b for b in cfg.ctrl.baselines if b not in known]
    need(
        not bad and len(set(cfg.ctrl.baselines)) == len(cfg.ctrl.baselines),
        f"ctrl.baselines: {bad or 'repeated names'}: each must be one of {list(known)}, once",
    )
    need(
        cfg.ctrl.critique_temperature >= 0,
        f"ctrl.critique_temperature: must be >= 0, got {cfg.ctrl.critique_temperature}",
    )
    need(0 < cfg.ctrl.critique_top_p <= 1, f"ctrl.critique_top_p: must be in (0, 1], got {cfg.ctrl.critique_top_p}")
    need(cfg.ctrl.critique_samples >= 1, f"ctrl.critique_samples: must be >= 1, got {cfg.ctrl.critique_samples}")
    if cfg.ctrl.critique_samples != 1:
        from fastcrit.types import is_greedy  # the one greedy rule; it loads torch, so only here

        need(
            not is_greedy(cfg.ctrl.critique_temperature),
            f"ctrl.critique_samples: {cfg.ctrl.critique_samples} greedy critiques of one solution are one "
            f"critique; sample them (ctrl.critique_temperature > 0) or set 1",
        )
    need(cfg.ctrl.solutions_per_problem >= 1, "ctrl.solutions_per_problem: must be >= 1")
    need(0 < cfg.ctrl.solution_top_p <= 1, f"ctrl.solution_top_p: must be in (0, 1], got {cfg.ctrl.solution_top_p}")
    need(
        cfg.ctrl.eval_temperature is None or cfg.ctrl.eval_temperature >= 0,
        f"ctrl.eval_temperature: must be >= 0 (or null: ctrl.solution_temperature), got {cfg.ctrl.eval_temperature}",
    )
    need(
        cfg.ctrl.synth_writer_temperature >= 0,
        f"ctrl.synth_writer_temperature: must be >= 0, got {cfg.ctrl.synth_writer_temperature}",
    )
    need(
        0 < cfg.ctrl.synth_writer_top_p <= 1,
        f"ctrl.synth_writer_top_p: must be in (0, 1], got {cfg.ctrl.synth_writer_top_p}",
    )
    need(cfg.ctrl.synth_chunk >= 1, f"ctrl.synth_chunk: must be >= 1, got {cfg.ctrl.synth_chunk}")
    need(cfg.trainer.stage_wait_s > 0, f"trainer.stage_wait_s: must be > 0 seconds, got {cfg.trainer.stage_wait_s}")
    need(cfg.rm.chunk_prompts >= 1, f"rm.chunk_prompts: must be >= 1, got {cfg.rm.chunk_prompts}")
    need(cfg.ctrl.judgment_reward >= 0, f"ctrl.judgment_reward: must be >= 0, got {cfg.ctrl.judgment_reward}")
    need(
        cfg.ctrl.judgment_only_steps >= 0, f"ctrl.judgment_only_steps: must be >= 0, got {cfg.ctrl.judgment_only_steps}"
    )
    need(
        cfg.ctrl.judgment_only_steps == 0 or cfg.ctrl.judgment_reward > 0,
        "ctrl.judgment_only_steps: the verdict-only steps need ctrl.judgment_reward > 0 (every reward would be 0)",
    )
    need(
        not cfg.ctrl.require_review or cfg.ctrl.consistent_review,
        "ctrl.require_review: only with ctrl.consistent_review: true (it makes a critique without a "
        "review invalid, as consistent_review does one that contradicts its review)",
    )
    need(cfg.proxy.rollout.n == 1, "proxy.rollout.n: the proxy writes one revision per critique (n=1)")
    need(cfg.proxy.max_prompt_len >= 1, "proxy.max_prompt_len: must be >= 1")
    # CTRL's critic engine and its local proxy's engine run in one process, where SGLang keeps one
    # process-wide config, the last engine started's (docs/gpu.md, "Two SGLang engines in one
    # process"): a weight sync into the critic would be cut for the proxy's TP ranks.
    need(
        bool(cfg.proxy.endpoint)
        or cfg.rollout.engine != "sglang"
        or cfg.proxy.rollout.engine != "sglang"
        or cfg.proxy.rollout.tp_size == cfg.rollout.tp_size,
        f"proxy.rollout.tp_size={cfg.proxy.rollout.tp_size} with rollout.tp_size={cfg.rollout.tp_size}: two "
        f"SGLang engines in one process share SGLang's process-wide settings (the last one started wins), "
        f"so they need the same tp_size; or serve the proxy elsewhere (proxy.endpoint)",
    )
    need(
        not spec.reward_names or cfg.reward.name in spec.reward_names,
        f"reward.name: algorithm.name={a.name} takes {' or '.join(spec.reward_names)} (got {cfg.reward.name!r})",
    )
    try:  # the sandbox validates its own fields (names them as sandbox.<key>)
        SandboxConfig(**dataclasses.asdict(cfg.sandbox))
    except ValueError as e:
        raise ConfigError(str(e)) from None
