"""The face of fastcrit: `fastcrit train | sft | gen | sandbox | bench ...` -> config -> recipe."""

from __future__ import annotations

import argparse
import os
import sys

from fastcrit.config import ConfigError, load_config
from fastcrit.data.datasets import DatasetError
from fastcrit.launch_checks import check_data, check_model, check_output_dir, check_weights


def _with_reward_model(ctx, cfg):
    """A run whose reward uses `model` trains its reward model first (`fastcrit rm`) when it is the
    run's own (reward.model_path "" or <rm.output_dir>/final), not there yet, and rm.steps > 0;
    reused once done."""
    import os

    if "model" not in cfg.reward.name.split("+"):
        return
    from fastcrit.config_values import reward_model_path, rm_output_dir
    from fastcrit.recipes.rm import run_rm

    path = reward_model_path(cfg)
    ours = os.path.normpath(os.path.join(rm_output_dir(cfg), "final")) == os.path.normpath(path)
    marker = "COMPLETE" if ours else "config.json"  # ours: written last, after the weights
    if os.path.isfile(os.path.join(path, marker)):
        return
    if cfg.rm.steps <= 0 or not ours:
        raise ConfigError(
            f"reward.model_path {path!r} holds no reward model; train one with "
            f"`fastcrit rm CONFIG` (it writes <rm.output_dir>/final, here "
            f"{os.path.join(rm_output_dir(cfg), 'final')})"
        )
    run_rm(ctx, cfg)


def _prepared(ctx, cfg):
    """The recipe's pre-stage (its ``prepare``, fastcrit.registry), run before its training."""
    from fastcrit.registry import recipe

    prepare = recipe(cfg.algorithm.name).prepare_fn()
    return prepare(ctx, cfg) if prepare else cfg


def _train_entry(ctx, cfg):
    from fastcrit.recipes.scaffold import run_recipe
    from fastcrit.registry import recipe

    _with_reward_model(ctx, cfg)
    run_recipe(ctx, _prepared(ctx, cfg), recipe(cfg.algorithm.name).load())


def _sft_entry(ctx, cfg):
    from fastcrit.recipes.sft import run_sft

    run_sft(ctx, _prepared(ctx, cfg))


def _rm_entry(ctx, cfg):
    from fastcrit.recipes.rm import run_rm

    run_rm(ctx, cfg)


def _synth_entry(ctx, cfg):
    from fastcrit.recipes.ctrl.synthesis import run_synth

    run_synth(ctx, cfg)


def _load(args):
    from fastcrit.train.dist import torchrun_world

    cfg = load_config(args.config, args.set, world_size=torchrun_world())
    from fastcrit.recipes.common import check_hardware

    check_hardware(cfg, args.config)
    _compute_threads(cfg)
    return cfg


def _compute_threads(cfg) -> None:
    """torch's intra-op threads := ``trainer.compute_threads`` (0: torch's default), in this process."""
    if cfg.trainer.compute_threads > 0:
        import torch

        torch.set_num_threads(cfg.trainer.compute_threads)


def _sglang_engines(cfg) -> list[tuple[str, object]]:
    """(config section, RolloutConfig) of the SGLang engines a run of ``cfg`` may start: ``rollout``'s,
    and ``proxy.rollout``'s when a recipe with a proxy (CTRL) runs its proxy or generator locally."""
    from fastcrit.registry import recipe

    engines = [("rollout", cfg.rollout)]
    if recipe(cfg.algorithm.name).proxy and (not cfg.proxy.endpoint or cfg.ctrl.generator):
        engines.append(("proxy.rollout", cfg.proxy.rollout))
    return [(name, r) for name, r in engines if r.engine == "sglang"]


def _engine_env(cfg) -> dict[str, str]:
    """The NCCL variables the config's SGLang engines will set (fastcrit.rollout.sglang.nccl_env),
    for every rank before its process group starts."""
    env: dict[str, str] = {}
    for name, r in _sglang_engines(cfg):
        import os

        from fastcrit.rollout.sglang import nccl_env

        try:
            wanted = nccl_env(r.engine_args, dict(os.environ))
        except ValueError as e:
            raise ConfigError(f"{name}.engine_args: {e}") from None
        for k, v in wanted.items():
            if env.setdefault(k, v) != v:
                raise ConfigError(
                    f"the rollout and proxy.rollout SGLang engines would set {k} to {env[k]} and "
                    f"{v} (their engine_args differ); one process holds one value"
                )
    return env


def cmd_train(args) -> int:
    cfg = _load(args)
    if args.resume:
        cfg = _resuming(cfg, args.resume)
    check_data(cfg, "train")
    check_model(cfg)
    check_weights(cfg.model.path, "model.path")
    check_output_dir(cfg.trainer.output_dir, "trainer.output_dir")
    if _finished(cfg):
        return 0
    if cfg.trainer.device == "cuda" and not cfg.trainer.skip_plan:
        _check_plan(cfg, args.config)
    return _run(args, cfg, _train_entry, cfg.trainer.nproc)


def _finished(cfg) -> bool:
    """A run continued into an output directory whose checkpoints say it is finished: say so and
    train nothing (its config.yaml and summary.json stay as the run left them). Other settings
    than the saved run's, or fewer steps than it has, stop with a ConfigError
    (fastcrit.train.resume_check)."""
    from fastcrit.train.resume_check import check_resume

    try:
        done = check_resume(cfg)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if done is None:
        return False
    out = cfg.trainer.output_dir
    print(
        f"fastcrit: {out} holds this run finished at step {done[1]} (trainer.total_steps): nothing to "
        f"train; its results are in {os.path.join(out, 'summary.json')}. Raise trainer.total_steps to "
        "train further, or set trainer.output_dir to a new directory for a new run.",
        file=sys.stderr,
        flush=True,
    )
    return True


def _rank_entry(ctx, cfg, entry):
    """Every rank's start: ``trainer.compute_threads`` (a spawned rank is a fresh process, which
    the launching process's ``torch.set_num_threads`` does not reach), then ``entry``."""
    _compute_threads(cfg)
    entry(ctx, cfg)


def _run(args, cfg, entry, nproc: int) -> int:
    """Launch ``entry`` on ``nproc`` ranks; a run stopped by SIGTERM / SIGINT (fastcrit.train.preempt)
    says how to continue it and exits with 128 + the signal number (143, 130)."""
    import os
    import signal

    from fastcrit.train.dist import launch
    from fastcrit.train.preempt import Stopped, stopped_at_once

    try:
        launch(
            _rank_entry,
            (cfg, entry),
            nproc,
            cfg.trainer.device,
            cfg.trainer.dist_timeout_s,
            env=_engine_env(cfg),
            separate=bool(_sglang_engines(cfg)),
        )
    except Stopped as s:
        stopped = s
    except KeyboardInterrupt:  # a second Ctrl-C in this process's rank (or a first before its handler)
        stopped = Stopped(signal.SIGINT, None, at_once=True)
    except BaseException:  # torch's checkpoint saver wraps it in CheckpointException, a BaseException
        if not stopped_at_once():
            raise
        # the second Ctrl-C landed in a library that made its own error of it (e.g. in a save)
        stopped = Stopped(signal.SIGINT, None, at_once=True)
    else:
        return 0
    if os.environ.get("RANK", "0") == "0":  # under torchrun, one message for all ranks
        print(_stop_report(args, cfg, stopped), file=sys.stderr, flush=True)
    return stopped.exit_code


def _stop_report(args, cfg, stopped) -> str:
    """What happened and the command that continues: ``--resume`` from the newest checkpoint when
    there is one (the user's other --set options kept), else the command as it was given."""
    import os
    import shlex

    from fastcrit.train.checkpoint import checkpoint_dir, latest_checkpoint

    out, train = cfg.trainer.output_dir, args.command == "train"
    if stopped.at_once:
        what = "stopped at once by a second SIGINT (the step in progress is lost)"
        ckpt = latest_checkpoint(out) if train else None
    elif stopped.step is not None:
        ckpt = checkpoint_dir(out, stopped.step)
        what = f"stopped by {stopped.name}"
    else:
        ckpt = None
        what = f"stopped by {stopped.name} " + (
            "before the first RL step" if train else f"during `fastcrit {args.command}`"
        )
    argv = ["fastcrit", args.command, args.config]
    sets = list(args.set)
    if ckpt:
        argv += ["--resume", out]
        sets = [s for s in sets if s.split("=", 1)[0].strip() not in ("trainer.output_dir", "trainer.resume")]
    elif getattr(args, "resume", None):
        argv += ["--resume", args.resume]
    for s in sets:
        argv += ["--set", s]
    command = " ".join(shlex.quote(a) for a in argv)
    if "TORCHELASTIC_RUN_ID" in os.environ:  # this rank's torchrun command, with its own options
        command = "torchrun TORCHRUN_OPTIONS -m fastcrit.cli " + command.split(" ", 1)[1]
    if ckpt:
        return f"fastcrit: {what}; newest checkpoint: {ckpt}\nresume with: {command}"
    return f"fastcrit: {what}; nothing to resume from\nstart again with: {command}"


def _check_plan(cfg, config_path: str) -> None:
    """`fastcrit plan`'s check before any weights load: a phase that cannot fit on this machine's
    GPU stops the run with the plan and the keys that would lower it."""
    from fastcrit.train.plan import device_capacity_gib, make_plan, render

    try:
        plan = make_plan(cfg, device_capacity_gib())
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if not plan.fits():
        over = "; ".join(f"{p.name}: {', '.join(plan.fixes.get(p.name, [])) or 'no key found'}" for p in plan.over())
        raise ConfigError(
            f"{config_path}: a phase does not fit on this GPU (fastcrit plan's table follows); "
            f"what would lower it: {over}. Set trainer.skip_plan=true to run anyway.\n{render(plan)}"
        )


def _resuming(cfg, run_dir: str):
    """`--resume RUN_DIR`: trainer.output_dir = RUN_DIR (a previous run's output directory, or its
    newest checkpoints/step_<N>) and trainer.resume = true; RUN_DIR must hold a complete checkpoint."""
    import dataclasses

    from fastcrit.train.checkpoint import resume_output_dir

    try:
        out = resume_output_dir(run_dir)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, output_dir=out, resume=True))


def _launch_steps(args, section: str, entry) -> int:
    """`fastcrit sft` / `fastcrit rm`: ``<section>.steps`` must be > 0; run ``entry`` on every rank."""
    cfg = _load(args)
    if getattr(cfg, section).steps <= 0:
        raise ConfigError(f"{args.config}: {section}.steps must be > 0 for `fastcrit {args.command}`")
    check_data(cfg, args.command)
    if section == "sft":
        check_model(cfg)
        check_weights(cfg.model.path, "model.path")
    check_output_dir(cfg.trainer.output_dir, "trainer.output_dir")
    return _run(args, cfg, entry, cfg.trainer.nproc)


def cmd_sft(args) -> int:
    return _launch_steps(args, "sft", _sft_entry)


def cmd_rm(args) -> int:
    return _launch_steps(args, "rm", _rm_entry)


def cmd_ctrl_synth(args) -> int:
    cfg = _load(args)
    check_output_dir(cfg.trainer.output_dir, "trainer.output_dir")
    return _run(args, cfg, _synth_entry, 1)


def cmd_critique(args) -> int:
    cfg = _load(args)
    check_output_dir(cfg.trainer.output_dir, "trainer.output_dir")
    from fastcrit.recipes.ctrl.evaluate import run_critique

    run_critique(cfg)
    return 0


def cmd_plan(args) -> int:
    """`fastcrit plan CONFIG`: each phase's device memory per GPU; exit 1 when a phase does not fit."""
    cfg = load_config(args.config, args.set)
    from fastcrit.train.plan import GIB, device_capacity_gib, make_plan, render

    capacity = device_capacity_gib() if args.gpu_memory_gib is None else args.gpu_memory_gib
    try:
        plan = make_plan(cfg, capacity)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    print(render(plan))
    if args.json:
        import json

        try:
            with open(args.json, "w") as f:
                json.dump(plan.to_dict(), f, indent=1)
        except OSError as e:
            raise ConfigError(f"--json {args.json}: cannot write it ({e.strerror or e})") from None
    if not plan.fits():
        over = ", ".join(f"{p.name} ({p.total / GIB:.1f} GiB)" for p in plan.over())
        print(f"fastcrit: {args.config} does not fit on {capacity:g} GiB per GPU: {over}", file=sys.stderr)
        return 1
    return 0


def cmd_recipes(args) -> int:
    """`fastcrit recipes`: the algorithm.name values `fastcrit train` knows, their files and needs."""
    import os

    from fastcrit.registry import RECIPES_DIR, recipes

    package_root = os.path.dirname(os.path.dirname(RECIPES_DIR))
    for name, r in recipes().items():
        needs = [f"{k} >= {least}" for k, (least, _) in r.minimums.items()] + [
            label
            for label, on in (
                ("reward.name in " + "|".join(r.reward_names), bool(r.reward_names)),
                ("no reward needed", not r.needs_reward),
                ("value critic", r.value_critic),
                ("KL in reward", r.kl_in_reward),
                ("proxy model", r.proxy),
                (f"pre-stage {r.prepare}", bool(r.prepare)),
            )
            if on
        ]
        where = os.path.relpath(r.file, package_root) if r.module.startswith("fastcrit.") else r.file
        print(f"{name:8s} {where}:{r.step}" + (f"  ({'; '.join(needs)})" if needs else ""))
    return 0


def cmd_gen(args) -> int:
    """Generate from a model directory (or `tiny`) with the native engine, for a quick look."""
    from fastcrit.data.prompts import encode_chat
    from fastcrit.models.hf import load_tokenizer, resolve_model_path
    from fastcrit.rollout.native import NativeEngine
    from fastcrit.types import SamplingParams

    params = SamplingParams(n=args.n, max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed)
    path = resolve_model_path(args.model)
    check_weights(args.model, "MODEL")
    try:
        tok = load_tokenizer(path)
        engine = NativeEngine(path, dtype="float32", device="cpu")
    except (OSError, ValueError, RuntimeError) as e:  # not a loadable model (its loaders' RuntimeError)
        print(f"fastcrit gen: {e}", file=sys.stderr)
        return 2
    ids = [encode_chat(tok, p) for p in args.prompt]
    for r in engine.generate(ids, params):
        print(
            f"[{r.prompt_index}] {tok.decode(r.output_ids, skip_special_tokens=True)!r} "
            f"({r.finish_reason}, {len(r.output_ids)} tokens)"
        )
    return 0


def cmd_export(args) -> int:
    """`fastcrit export CHECKPOINT OUT`: the model alone, as a Hugging Face directory."""
    import os

    from fastcrit.models.hf import export_model
    from fastcrit.train.checkpoint import latest_checkpoint

    src = args.checkpoint
    if not os.path.isfile(os.path.join(src, "config.json")) and latest_checkpoint(src):
        src = latest_checkpoint(src)  # a run's output directory: its newest complete checkpoint
    check_weights(src, "CHECKPOINT")
    check_output_dir(args.out, "OUT")
    try:
        out = export_model(src, args.out, args.dtype)
    except (ValueError, OSError, RuntimeError) as e:  # not a loadable model (its loaders' RuntimeError)
        print(f"fastcrit export: {e}", file=sys.stderr)
        return 2
    print(f"exported {src} to {out}")
    return 0


def _at_least(least, kind):
    """An argparse type: ``kind`` of the text, refused (a usage error, exit 2) below ``least``."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {kind.__name__}, got {text!r}") from None
        if not value >= least:  # `not >=` also refuses nan
            raise argparse.ArgumentTypeError(f"must be >= {least}, got {text}")
        return value

    return parse


def _above_zero(text: str) -> float:
    """An argparse type: a finite float > 0 (0 or nan read as the default before, silently)."""
    import math

    value = _at_least(0.0, float)(text)
    if value == 0 or not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fastcrit", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    for name, fn, text in (
        ("train", cmd_train, "RL training (GRPO, RLOO, PPO, PACS, RARO, CTRL) from a YAML config"),
        ("sft", cmd_sft, "supervised fine-tuning (the warm start) from a config"),
        ("rm", cmd_rm, "train a reward model on preference pairs (Bradley-Terry)"),
        ("ctrl-synth", cmd_ctrl_synth, "CTRL stage 1: sample solutions, run them, write synthetic critiques"),
        ("critique", cmd_critique, "CTRL at test time: generator solutions, then rounds of critique -> revision"),
    ):
        sp = sub.add_parser(name, help=text)
        sp.add_argument("config", help="YAML file overriding the defaults (see configs/)")
        sp.add_argument(
            "--set",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="override one key, e.g. --set rollout.n=8 (repeatable)",
        )
        sp.set_defaults(func=fn)
        if name == "train":
            sp.add_argument(
                "--resume",
                metavar="RUN_DIR",
                help="continue the run in RUN_DIR (a previous run's trainer.output_dir, or its "
                "newest checkpoints/step_<N>) from its newest checkpoint; it must hold a "
                "complete one. Like --set trainer.output_dir=RUN_DIR --set trainer.resume=true, "
                "but an error when there is nothing to resume",
            )

    pl = sub.add_parser("plan", help="the device memory each phase of a run needs per GPU, from the config alone")
    pl.add_argument("config", help="YAML file overriding the defaults (see configs/)")
    pl.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one key, e.g. --set trainer.micro_batch_size=4 (repeatable)",
    )
    pl.add_argument(
        "--gpu-memory-gib",
        type=_above_zero,
        default=None,
        metavar="N",
        help="memory of one GPU (default: this machine's GPU 0, else 80)",
    )
    pl.add_argument("--json", metavar="FILE", help="also write the plan as JSON")
    pl.set_defaults(func=cmd_plan)

    rc = sub.add_parser("recipes", help="the algorithm.name values `fastcrit train` knows (and FASTCRIT_RECIPES adds)")
    rc.set_defaults(func=cmd_recipes)

    g = sub.add_parser("gen", help="generate with the native engine from a local model directory")
    g.add_argument("model", help="a Hugging Face model directory, or 'tiny'")
    g.add_argument("--prompt", action="append", required=True, help="user message (repeatable)")
    g.add_argument("--n", type=_at_least(1, int), default=1)
    g.add_argument("--max-new-tokens", type=_at_least(1, int), default=32)
    g.add_argument("--temperature", type=_at_least(0.0, float), default=0.0)
    g.add_argument("--seed", type=int, default=0)
    g.set_defaults(func=cmd_gen)

    ex = sub.add_parser(
        "export",
        help="write a checkpoint's model alone (config, safetensors weights, "
        "tokenizer, generation config) for transformers",
    )
    ex.add_argument(
        "checkpoint",
        help="a checkpoints/step_<N> directory (or a run's output_dir: its newest), "
        "or any Hugging Face model directory",
    )
    ex.add_argument("out", help="the directory to write (must not exist, or be empty)")
    ex.add_argument(
        "--dtype",
        choices=("bf16", "fp32", "fp16"),
        default=None,
        help="the weights' dtype (default: the checkpoint's own)",
    )
    ex.set_defaults(func=cmd_export)

    from fastcrit.bench_cli import register as register_bench  # torch-free, cheap to import
    from fastcrit.data.cli import register as register_data
    from fastcrit.rollout.serve import register as register_serve
    from fastcrit.sandbox.cli import register as register_sandbox

    register_bench(sub)
    register_data(sub)
    register_serve(sub)
    register_sandbox(sub, problem_jobs=_problem_jobs)
    return p


def _problem_jobs(*args):
    from fastcrit.data.problem_jobs import problem_jobs

    return problem_jobs(*args)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ConfigError as e:
        print(f"fastcrit: config error: {e}", file=sys.stderr)
        return 2
    except DatasetError as e:
        print(f"fastcrit: data error: {e}", file=sys.stderr)
        return 2
    except FileNotFoundError as e:
        print(f"fastcrit: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # a Ctrl-C where no handler of ours runs (e.g. while the config loads)
        print("fastcrit: interrupted (SIGINT)", file=sys.stderr)
        return 130
    except RuntimeError as e:
        if type(e).__name__ != "DistError":  # fastcrit.train.dist's: not imported here (torch-free CLI start)
            raise
        print(f"fastcrit: {e}", file=sys.stderr)  # the rank and what failed; its traceback came before
        return 1


if __name__ == "__main__":
    sys.exit(main())
