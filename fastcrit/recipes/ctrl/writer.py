"""CTRL stage 1's critique writers: who writes the critic's SFT targets (``ctrl.synth_writer``).

- ``model`` (the paper's): a writer model gets the problem, the solution and what running it showed
  (the failing test, the error, expected against actual output) as a hint it must not reveal, and
  writes an analysis, suggestions and a verdict. Its critique becomes the SFT target of the
  critic's own prompt, which has no hint. A critique is filtered, and counted by why, when its
  prompt does not fit (``too_long``), it has no verdict line (``no_verdict``), its verdict
  disagrees with the execution (``wrong_verdict``) or it gives the hint away (``leak``: it mentions
  the hint, quotes the failing test, or states the expected output; ``ctrl_prompts.leaks``).
- ``template``: ``fastcrit.data.critique.synthetic_critique`` fills a fixed text from the
  execution feedback and the reference solution; no model, nothing filtered (the CPU demo's tiny
  models cannot write critiques yet).

The writer is ``ctrl.synth_writer_endpoint`` (an OpenAI-compatible server, model
``ctrl.synth_writer_api_model``), else the local model ``ctrl.synth_writer_model`` ("" = the
critic's base model ``model.path``), on the proxy's engine settings and prompt limit; when that
is the model that writes the solutions, its engine is shared.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

from fastcrit.config import Config, ModelConfig
from fastcrit.data.critique import parse_judgment, synthetic_critique
from fastcrit.data.ctrl_prompts import clean_critique, critique_messages, hint_for, leaks, writer_messages
from fastcrit.models.hf import model_spec, resolve_model_path
from fastcrit.recipes.ctrl.rounds import Attempt
from fastcrit.recipes.ctrl.shared import http_chat, local_chat
from fastcrit.reward.code import extract_program
from fastcrit.types import is_greedy

FILTERS = ("too_long", "no_verdict", "wrong_verdict", "leak")


@dataclass
class Written:
    """A writer's critiques of some attempts: SFT rows kept, and how many were dropped and why."""

    rows: list[dict]
    filtered: collections.Counter = field(default_factory=collections.Counter)
    examples: dict = field(default_factory=dict)  # one dropped critique per reason (for the summary)


def critique_row(a: Attempt, critique: str, style: str, writer: str) -> dict:
    """The chat row [critic prompt (no hint) -> critique] of one attempt."""
    return {
        "messages": critique_messages(a.problem, a.solution, style) + [{"role": "assistant", "content": critique}],
        "problem_id": a.problem.id,
        "passed": a.passed,
        "writer": writer,
    }


def template_critiques(attempts: list[Attempt], style: str) -> Written:
    """The template writer: every attempt gets a critique, nothing is filtered."""
    rows = []
    for a in attempts:
        code, _ = extract_program(a.solution)
        refs = a.problem.solutions
        reference = extract_program(refs[0])[0] if refs else None
        rows.append(critique_row(a, synthetic_critique(a.passed, a.failures, code, reference), style, "template"))
    return Written(rows)


def model_critiques(
    writer,
    attempts: list[Attempt],
    *,
    style: str,
    max_new_tokens: int,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int = 0,
) -> Written:
    """The model writer: one critique per attempt, written from its execution feedback, then
    filtered (module docstring). Attempt j draws from ``seed + j`` when sampled."""
    hints = [hint_for(a.problem, a.passed, a.failures, a.failed_tests) for a in attempts]
    outs = writer.chat(
        [writer_messages(a.problem, a.solution, h, style) for a, h in zip(attempts, hints)],
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        seed=None if is_greedy(temperature) else seed,
        top_p=top_p,
    )
    out = Written([])
    for a, h, o in zip(attempts, hints, outs):
        text = clean_critique(o.text)
        why = verdict = None
        if o.finish_reason == "prompt_too_long":
            why = "too_long"
        else:
            verdict = parse_judgment(text)
            why = (
                "no_verdict"
                if verdict is None
                else "wrong_verdict"
                if verdict != a.passed
                else "leak"
                if leaks(text, h)
                else None
            )
        if why is None:
            out.rows.append(critique_row(a, text, style, "model"))
        else:
            out.filtered[why] += 1
            out.examples.setdefault(
                why,
                {
                    "problem_id": a.problem.id,
                    "critique": text[:400],
                    **({"leak": leaks(text, h)} if why == "leak" else {}),
                },
            )
    return out


def writer_model(cfg: Config) -> ModelConfig:
    c = cfg.ctrl
    if c.synth_writer_model:
        return ModelConfig(path=c.synth_writer_model, dtype=cfg.model.dtype, tiny=cfg.model.tiny)
    return cfg.model


def writer_name(cfg: Config) -> str:
    """What writes the critiques, found without loading it."""
    c = cfg.ctrl
    if c.synth_writer == "template":
        return "template"
    if c.synth_writer_endpoint:
        return f"{c.synth_writer_endpoint} ({c.synth_writer_api_model})"
    return resolve_model_path(model_spec(writer_model(cfg)))


def make_writer(cfg: Config, device, generator):
    """The model writer (``ctrl.synth_writer: model``): an endpoint, or a local model on the proxy's
    engine settings; the ``generator`` itself (returned as is, not to be closed twice) when it is
    the same model. None for the template writer. Returns (writer, owned)."""
    c = cfg.ctrl
    if c.synth_writer == "template":
        return None, False
    if c.synth_writer_endpoint:
        return http_chat(cfg, c.synth_writer_endpoint, c.synth_writer_api_model, "ctrl.synth_writer_api_model"), True
    if writer_name(cfg) == getattr(generator, "name", None):
        return generator, False
    return local_chat(writer_model(cfg), cfg.proxy.rollout, cfg.proxy.max_prompt_len, device, cfg.trainer.seed), True


def write_critiques(cfg: Config, writer, attempts: list[Attempt], seed: int) -> Written:
    """Stage 1's critiques of ``attempts`` by the configured writer."""
    c = cfg.ctrl
    if writer is None:
        return template_critiques(attempts, c.prompts)
    return model_critiques(
        writer,
        attempts,
        style=c.prompts,
        max_new_tokens=cfg.rollout.max_new_tokens,
        temperature=c.synth_writer_temperature,
        top_p=c.synth_writer_top_p,
        seed=seed,
    )
