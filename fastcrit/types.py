"""The data that crosses rooms, with documented shapes.

Layout follows verl's so that formulas read the same: a sequence is a left-padded prompt followed
by a right-padded response. ``B`` is the number of samples (prompts x n), ``P`` the padded prompt
length, ``R`` the padded response length.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

# The greedy rule, the one place it is written: a temperature below this samples greedily (argmax),
# and its log-probs are scored at temperature 1. SGLang 0.5.23 does the same (sampling_params.py:42
# `_SAMPLING_EPS = 1e-6`; :245 `0 <= temperature < _SAMPLING_EPS` becomes temperature 1, top_k 1).
GREEDY_BELOW = 1e-6


def is_greedy(temperature: float) -> bool:
    """True when ``temperature`` means argmax decoding (0 <= T < GREEDY_BELOW)."""
    return 0.0 <= temperature < GREEDY_BELOW


def scoring_temperature(temperature: float) -> float:
    """The temperature log-probs are computed at: ``temperature`` itself, or 1 when it is greedy."""
    return 1.0 if is_greedy(temperature) else float(temperature)


@dataclass
class SamplingParams:
    """How the rollout engine samples. Mirrors SGLang's sampling_params keys."""

    n: int = 1  # samples per prompt; the n samples share one prefill
    max_new_tokens: int = 64
    temperature: float = 1.0  # below GREEDY_BELOW (0 included) means greedy
    top_p: float = 1.0
    top_k: int = -1  # -1 = off
    stop_token_ids: list[int] = field(default_factory=list)  # EOS is always a stop token
    # Sample k (= prompt i x n + j) of a call draws from seed + k alone; seed + k must stay below
    # 2**63 for SGLang (an int64), the native engine reads it mod 2**64.
    seed: int | None = None
    # Stop strings (the native engine needs a tokenizer for them): a sample stops at the token whose
    # decoded text completes one, with finish_reason "stop"; output_ids keep that token, and cutting
    # the text at the string is the caller's (fastcrit.rollout.openai_api does it).
    stop: list[str] = field(default_factory=list)
    # Penalties on the logits before the temperature, as OpenAI / vLLM / SGLang define them:
    # logit -= frequency_penalty * count + presence_penalty * (count > 0) over the tokens generated
    # so far; repetition_penalty (1 = off) divides a positive logit and multiplies a negative one of
    # every token seen in the prompt or the output so far (CTRL's rule, as vLLM and HF apply it).
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] = field(default_factory=dict)  # token id -> added to its logit
    top_logprobs: int = 0  # > 0: each Rollout carries the top that-many (token, log-prob) per position

    def key(self) -> tuple:
        """A hashable tuple of every field (requests with equal keys can share one generate call)."""
        return (
            self.n,
            self.max_new_tokens,
            self.temperature,
            self.top_p,
            self.top_k,
            tuple(self.stop_token_ids),
            self.seed,
            tuple(self.stop),
            self.presence_penalty,
            self.frequency_penalty,
            self.repetition_penalty,
            tuple(sorted(self.logit_bias.items())),
            self.top_logprobs,
        )

    def shapes_logits(self) -> bool:
        """True when a penalty or a bias changes the logits before sampling."""
        return bool(
            self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0 or self.logit_bias
        )


@dataclass
class Rollout:
    """One generated sample.

    ``logprobs[i]`` is log_softmax(logits / temperature)[output_ids[i]] before top-k / top-p, the
    convention SGLang uses and the trainer reproduces (a greedy temperature, see ``is_greedy``, is
    scored at temperature 1).
    """

    prompt_index: int  # index of the prompt in the generate() call; samples of one prompt share it
    prompt_ids: list[int]
    output_ids: list[int]  # includes the stop token when one ended the sample
    logprobs: list[float]  # len == len(output_ids)
    finish_reason: str  # "stop" (EOS / stop token / stop string) or "length" (max_new_tokens); nothing else
    # With SamplingParams.top_logprobs = k > 0: per position, the k most likely (token id, log-prob)
    # pairs of the same distribution ``logprobs`` reads, most likely first; else None.
    top_logprobs: list[list[tuple[int, float]]] | None = None


@dataclass
class RolloutBatch:
    """A batch ready for the trainer. All tensors on CPU until the trainer moves them."""

    prompts: torch.Tensor  # [B, P] long, left-padded with pad_id
    responses: torch.Tensor  # [B, R] long, right-padded with pad_id
    attention_mask: torch.Tensor  # [B, P + R] long, 1 on real prompt and response tokens
    response_mask: torch.Tensor  # [B, R] float, 1 on response tokens that count in the loss
    # [B, R] float32, the behaviour policy's log-probs that PPO's ratio divides by (0 on padding): the
    # engine's, or the trainer's recomputation of them (algorithm.recompute_old_logprobs)
    old_logprobs: torch.Tensor
    group_ids: torch.Tensor  # [B] long, samples of one prompt share an id
    scores: torch.Tensor | None = None  # [B] float32, sequence-level rewards
    ref_logprobs: torch.Tensor | None = None  # [B, R] float32
    advantages: torch.Tensor | None = None  # [B, R] float32
    values: torch.Tensor | None = None  # [B, R] float32, the critic's values at rollout time (PPO)
    returns: torch.Tensor | None = None  # [B, R] float32, the critic's targets (PPO)
    rollout_logprobs: torch.Tensor | None = None  # [B, R] float32, the engine's sampling log-probs
    roles: torch.Tensor | None = None  # [B] long, each row's role where one loss weighs roles (RARO: policy / critic)

    @property
    def input_ids(self) -> torch.Tensor:  # [B, P + R]
        return torch.cat([self.prompts, self.responses], dim=1)

    @property
    def position_ids(self) -> torch.Tensor:  # [B, P + R]; padding positions clamp to 0
        return (torch.cumsum(self.attention_mask, dim=1) - 1).clamp(min=0)

    def __len__(self) -> int:
        return self.prompts.shape[0]

    def trimmed(self) -> RolloutBatch:
        """The same rows without the columns that are padding in every row (the left of the
        prompts, the right of the responses; at least one response column stays). Positions come
        from the attention mask, so every real token keeps its position and its log-prob."""
        P, R = self.prompts.shape[1], self.responses.shape[1]
        on_p = self.attention_mask[:, :P].any(0).nonzero()
        p0 = int(on_p[0]) if len(on_p) else P
        on_r = self.attention_mask[:, P:].any(0).nonzero()
        r1 = max(1, int(on_r[-1]) + 1 if len(on_r) else 1)
        if p0 == 0 and r1 == R:
            return self
        out = {}
        for name in self.__dataclass_fields__:
            v = getattr(self, name)
            if name == "prompts":
                v = v[:, p0:]
            elif name == "attention_mask":
                v = torch.cat([v[:, p0:P], v[:, P : P + r1]], dim=1)
            elif isinstance(v, torch.Tensor) and v.dim() == 2 and v.shape[1] == R:
                v = v[:, :r1]
            out[name] = v
        return RolloutBatch(**out)

    @staticmethod
    def concat(batches: list[RolloutBatch]) -> RolloutBatch:
        """The rows of ``batches`` in order, re-padded to the widest prompt and response (prompts
        on the left, responses and every [B, R] field on the right, with zeros; ``pad_id`` is the
        first batch's pad, read from a padded slot of its prompts or responses, else 0)."""
        P = max(b.prompts.shape[1] for b in batches)
        R = max(b.responses.shape[1] for b in batches)
        fields: dict[str, list] = {name: [] for name in RolloutBatch.__dataclass_fields__}
        pad_id = 0
        for b in batches:
            bp, br = b.prompts.shape[1], b.responses.shape[1]
            dp, dr = P - bp, R - br
            off = b.attention_mask[:, :bp] == 0
            if off.any():
                pad_id = int(b.prompts[off][0])
            for name in fields:
                v = getattr(b, name)
                if name == "prompts":
                    v = torch.nn.functional.pad(v, (dp, 0), value=pad_id)
                elif name == "responses":
                    v = torch.nn.functional.pad(v, (0, dr), value=pad_id)
                elif name == "attention_mask":
                    v = torch.cat(
                        [torch.nn.functional.pad(v[:, :bp], (dp, 0)), torch.nn.functional.pad(v[:, bp:], (0, dr))],
                        dim=1,
                    )
                elif isinstance(v, torch.Tensor) and v.dim() == 2 and v.shape[1] == br:
                    v = torch.nn.functional.pad(v, (0, dr))
                fields[name].append(v)
        out = {}
        for name, vs in fields.items():
            if any(v is None for v in vs):
                if not all(v is None for v in vs):
                    raise ValueError(f"RolloutBatch.concat: {name} is set in some batches, not in all")
                out[name] = None
            else:
                out[name] = torch.cat(vs)
        return RolloutBatch(**out)

    def select(self, idx: torch.Tensor) -> RolloutBatch:
        """Rows ``idx`` (a [b] long tensor) of every tensor field."""
        out = {}
        for name in self.__dataclass_fields__:
            v = getattr(self, name)
            out[name] = v[idx] if isinstance(v, torch.Tensor) else v
        return RolloutBatch(**out)
