"""What CTRL's three stages share: problem sets, the generator ("proxy"), the test-time critic, and
the synthesis files that link stage 1 to stage 2."""

from __future__ import annotations

import dataclasses
import json
import os

from fastcrit.config import Config, ConfigError, ModelConfig
from fastcrit.data.datasets import DatasetError, resolve_source
from fastcrit.data.problem_files import load_problems
from fastcrit.data.problems import Problem, ProblemError
from fastcrit.models.hf import load_tokenizer, model_spec, resolve_model_path
from fastcrit.recipes.ctrl.rounds import Attempt
from fastcrit.rollout import make_engine
from fastcrit.rollout.chat import HTTPChat, LocalChat
from fastcrit.train.checkpoint import latest_checkpoint


def load_problem_set(
    spec: str, fmt: str, *, limit: int | None = None, what: str = "data.train", log=print, strict: bool = False
) -> list[Problem]:
    """Problems from a shipped task (``minicode``, ``minicode:test``), ``humaneval`` or a file in any
    supported format; skipped rows are reported (first few, and how many), or, ``strict``, refused."""
    if not spec:
        raise ConfigError(f"{what}: no problems named (a shipped task, 'humaneval', or a file)")
    path = spec if spec == "humaneval" else resolve_source(spec)
    ps = load_problems(path, fmt, limit=limit, strict=strict)
    if ps.skipped:
        for msg in ps.skipped[:5]:
            log(f"data: skipped {msg}")
        log(f"data: {what}: {len(ps.skipped)} rows skipped, {len(ps.problems)} problems kept ({ps.format} format)")
    return ps.problems


class OwnedChat:
    """A ChatModel together with the engine it owns (closed with it); ``name`` says what it is."""

    def __init__(self, chat_model, engine, name: str):
        self.chat_model, self.engine, self.name = chat_model, engine, name

    def chat(self, conversations, *, max_new_tokens, temperature=0.0, seed=None, top_p=1.0):
        return self.chat_model.chat(
            conversations, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed, top_p=top_p
        )

    def sleep(self) -> None:
        """Release the engine's device memory while the trainer works (an engine that keeps a host
        copy of its weights: ``asleep_between_uses``); nothing for an endpoint or a CPU engine."""
        if self.engine is not None and self.asleep_between_uses:
            self.engine.sleep()

    def wake(self) -> None:
        if self.engine is not None and self.asleep_between_uses:
            self.engine.wake()

    asleep_between_uses = False

    def close(self) -> None:
        self.chat_model.close()
        if self.engine is not None:
            self.engine.close()
            self.engine = None


def local_chat(model: ModelConfig, rollout, max_prompt_len: int, device, seed: int, sleeps: bool = False) -> OwnedChat:
    """A local model on its own engine. ``sleeps`` (a frozen model sharing a GPU with the trainer,
    CTRL's proxy): the engine keeps a host copy of its weights (the native engine's ``cpu_backup``,
    SGLang's ``enable_weights_cpu_backup``), so ``OwnedChat.sleep`` can release its device memory
    between uses and ``wake`` restores it without a trainer to reload it."""
    path = resolve_model_path(model_spec(model))
    sleeps = sleeps and str(device).startswith("cuda")
    if sleeps:
        key = "enable_weights_cpu_backup" if rollout.engine == "sglang" else "cpu_backup"
        rollout = dataclasses.replace(rollout, engine_args={key: True, **rollout.engine_args})
    engine = make_engine(rollout, path, dtype=model.dtype, device=device, seed=seed)
    chat = OwnedChat(LocalChat(engine, load_tokenizer(path), max_prompt_len=max_prompt_len), engine, path)
    chat.asleep_between_uses = sleeps and bool(
        rollout.engine_args.get("enable_weights_cpu_backup" if rollout.engine == "sglang" else "cpu_backup")
    )
    return chat


def http_chat(cfg: Config, endpoint: str, api_model: str, what: str) -> OwnedChat:
    """An OpenAI-compatible endpoint; key, concurrency, timeout and retries from ``proxy.*``."""
    p = cfg.proxy
    key = os.environ.get(p.api_key_env) if p.api_key_env else None
    if p.api_key_env and not key:
        raise ConfigError(f"proxy.api_key_env: the environment variable {p.api_key_env} is not set")
    if not api_model:
        raise ConfigError(f"{what}: name the model the endpoint {endpoint} serves")
    chat = HTTPChat(
        endpoint, api_model, api_key=key, concurrency=p.concurrency, timeout_s=p.timeout_s, retries=p.retries
    )
    return OwnedChat(chat, None, f"{endpoint} ({api_model})")


def _proxy_model(cfg: Config) -> ModelConfig:
    return cfg.proxy.model if cfg.proxy.model.path else cfg.model


def _generator_model(cfg: Config) -> ModelConfig:
    return ModelConfig(path=cfg.ctrl.generator, dtype=cfg.proxy.model.dtype, tiny=cfg.proxy.model.tiny)


def make_proxy(cfg: Config, device, sleeps: bool = False) -> OwnedChat:
    """The generator / reviser: ``proxy.endpoint`` (OpenAI-compatible), else a local model
    (``proxy.model``, or the critic's ``model`` when its path is empty) on its own engine;
    ``sleeps``: see ``local_chat`` (CTRL's RL stage, beside the trainer)."""
    p = cfg.proxy
    if p.endpoint:
        return http_chat(cfg, p.endpoint, p.api_model, "proxy.api_model")
    return local_chat(_proxy_model(cfg), p.rollout, p.max_prompt_len, device, cfg.trainer.seed, sleeps=sleeps)


def make_generator(cfg: Config, device) -> OwnedChat:
    """The writer of the initial solutions: ``ctrl.generator`` (a local model dir, on the proxy's
    engine settings), else the proxy itself."""
    if not cfg.ctrl.generator:
        return make_proxy(cfg, device)
    return local_chat(_generator_model(cfg), cfg.proxy.rollout, cfg.proxy.max_prompt_len, device, cfg.trainer.seed)


def generator_name(cfg: Config) -> str:
    """The ``name`` of what ``make_generator`` would load, found without loading it."""
    if cfg.ctrl.generator:
        return resolve_model_path(model_spec(_generator_model(cfg)))
    if cfg.proxy.endpoint:
        return f"{cfg.proxy.endpoint} ({cfg.proxy.api_model})"
    return resolve_model_path(model_spec(_proxy_model(cfg)))


def critic_chat(cfg: Config) -> tuple[OwnedChat, str]:
    """The critic at test time: ``ctrl.critic_endpoint`` (model ``ctrl.critic_api_model``), else a
    local model: ``ctrl.critic``, else the newest checkpoint of ``trainer.output_dir``, on the
    rollout engine."""
    c = cfg.ctrl
    if c.critic_endpoint:
        chat = http_chat(cfg, c.critic_endpoint, c.critic_api_model, "ctrl.critic_api_model")
        return chat, chat.name
    path = c.critic or latest_checkpoint(cfg.trainer.output_dir)
    if not path:
        raise ConfigError(
            f"ctrl.critic: no critic given and no checkpoint in {cfg.trainer.output_dir} "
            "(train one with `fastcrit train`, or set ctrl.critic=<model dir>)"
        )
    device = "cpu" if cfg.trainer.device == "cpu" else "cuda"
    model = ModelConfig(path=path, dtype=cfg.model.dtype, tiny=cfg.model.tiny)
    chat = local_chat(model, cfg.rollout, cfg.data.max_prompt_len, device, cfg.trainer.seed)
    return chat, chat.name


# ---------------------------------------------------------------------------------------------
# Synthesis files: <synth_dir>/solutions_{train,val}.jsonl, critic_sft.jsonl, COMPLETE


def synth_dir(cfg: Config) -> str:
    return cfg.ctrl.synth_dir or os.path.join(cfg.trainer.output_dir, "synth")


def synth_complete(directory: str) -> bool:
    return os.path.exists(os.path.join(directory, "COMPLETE"))


def critic_sft_path(directory: str) -> str:
    return os.path.join(directory, "critic_sft.jsonl")


def solutions_path(directory: str, split: str) -> str:
    return os.path.join(directory, f"solutions_{split}.jsonl")


def attempt_row(a: Attempt) -> dict:
    return {
        "problem": a.problem.to_dict(),
        "solution": a.solution,
        "passed": a.passed,
        "pass_rate": a.pass_rate,
        "failures": a.failures,
        "failed_tests": a.failed_tests,
    }


def load_attempts(directory: str, split: str) -> list[Attempt]:
    """The (problem, initial solution, outcome) rows stage 1 wrote; bad rows raise naming file:line."""
    path = solutions_path(directory, split)
    if not os.path.exists(path):
        raise DatasetError(
            f"{path}: not found; run `fastcrit ctrl-synth CONFIG` first "
            "(`fastcrit train` runs it when the directory has no COMPLETE marker)"
        )
    out = []
    with open(path) as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
                out.append(
                    Attempt(
                        Problem.from_dict(r["problem"]),
                        r["solution"],
                        bool(r["passed"]),
                        float(r["pass_rate"]),
                        list(r["failures"]),
                        [int(i) for i in r.get("failed_tests", [])],
                    )
                )
            except (json.JSONDecodeError, KeyError, TypeError, ValueError, ProblemError) as e:
                raise DatasetError(f"{path}:{i}: not a solutions row written by ctrl-synth ({e})") from None
    return out
