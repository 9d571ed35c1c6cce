"""`fastcrit plan`: the device memory each phase of a run needs on every GPU, from the models'
``config.json`` and the resolved config alone (no weights, no GPU), before anyone rents a node.

Every figure is a sum of named terms, each the size of something fastcrit allocates (the code that
allocates it is named beside each term). What the plan counts:

- trainable models (policy, PPO's critic, a refreshed reward model): fp32 master shards (4 B per
  parameter / world), AdamW's two fp32 moments (8 B), fp32 gradient shards (4 B) while they exist
  (an update; freed before generation);
- frozen models (reference, reward model): shards in ``model.dtype``;
- during a forward or backward: the gathered root (embeddings, final norm, lm_head) and two
  gathered decoder layers in the compute dtype (the one running and the one FSDP2 prefetches);
- activations of one micro-batch (``activation_bytes_per_token``), the fused log-prob kernel's
  buffers, the end of a backward's fp32 reduce-scatter of the root's gradients;
- engines: SGLang's static share of the device (``mem_fraction_static``: weights and KV cache) plus
  an estimate of its CUDA graphs, or the native engine's weights, fused copies and KV cache;
- CUDA contexts (outside torch's allocator): the trainer process's, NCCL's with several ranks, one
  per SGLang scheduler process.

What it does not: fragmentation of the caching allocator (reserved above allocated: the margin
``FIT_MARGIN`` stands for it), host memory beyond loading, and models or kernels it does not know
(other attention implementations, MoE routing buffers). A phase fits when its peak leaves
``FIT_MARGIN`` of the device free.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field

from fastcrit.config_values import recompute_old_logprobs, reward_model_path
from fastcrit.registry import recipe

GIB = float(1 << 30)
FIT_MARGIN = 0.05  # share of the device kept free for fragmentation and what the plan does not see
CUDA_CONTEXT_GIB = 0.6  # one process's CUDA context with torch's kernels loaded lazily (H100, CUDA 12-13)
NCCL_GIB = 0.5  # NCCL's buffers and its own context share in a multi-rank process group
SGLANG_GRAPHS_GIB = 1.0  # an SGLang engine's CUDA graphs and activation workspace, outside its static share
LOGPROB_CHUNK_BYTES = 512 << 20  # fastcrit_kernels' GPU chunk of d_logits (logprobs.GPU_CHUNK_BYTES)
SHIPPED = os.path.join(os.path.dirname(os.path.dirname(__file__)), "models", "configs")
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass
class ModelShape:
    """What the plan needs of a decoder-only model, counted on a weightless (meta) copy."""

    source: str  # the config it was read from
    params: int  # every parameter once (tied embeddings count once)
    root_params: int  # not in a decoder layer: embeddings, final norm, lm_head (FSDP2's root group)
    layer_params: int  # the largest decoder layer
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    model_type: str = ""
    note: str = ""  # how the config was found, when not at the path the run names

    @property
    def kv_bytes_per_token(self) -> int:
        """Elements of keys and values one token adds to a KV cache, over all layers."""
        return self.layers * 2 * self.kv_heads * self.head_dim

    @property
    def fused_params(self) -> int:
        """The native engine's fused q/k/v and gate/up copies (fastcrit.rollout.decode.fuse_weights)."""
        per = (
            self.hidden * (self.heads * self.head_dim + 2 * self.kv_heads * self.head_dim)
            + 2 * self.hidden * self.intermediate
        )
        return self.layers * per


def find_model_config(path: str, what: str) -> tuple[str, str]:
    """(config.json path, note) for ``path``: a model directory, a config .json file, or, where the
    path does not exist, the shipped config of the model its last component names (e.g.
    /models/Qwen2.5-Coder-7B-Instruct), with a note saying so. Raises ValueError naming ``what``."""
    if os.path.isdir(path) and os.path.isfile(os.path.join(path, "config.json")):
        return os.path.join(path, "config.json"), ""
    if os.path.isfile(path) and path.endswith(".json"):
        return path, ""
    shipped = os.path.join(SHIPPED, os.path.basename(os.path.normpath(path)).lower() + ".json")
    if not os.path.exists(path) and os.path.isfile(shipped):
        return shipped, (
            f"{what} {path} is not on this machine: planned with the published config of "
            f"{os.path.basename(os.path.normpath(path))} that fastcrit ships"
        )
    known = ", ".join(sorted(f[:-5] for f in os.listdir(SHIPPED) if f.endswith(".json")))
    raise ValueError(
        f"{what}={path!r}: no config.json there. Give a local model directory or a "
        f"config.json file (--set {what}=...); configs shipped for planning: {known}"
    )


def model_shape(path: str, what: str = "model.path", value_head: bool = False) -> ModelShape:
    """The shape of the model at ``path`` (see ``find_model_config``), counted on the meta device;
    ``value_head``: the model as a critic / reward model (lm_head replaced by a 1-output score)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg_path, note = find_model_config(path, what)
    with open(cfg_path) as f:
        raw = json.load(f)
    if "model_type" not in raw:
        raise ValueError(f"{cfg_path}: no model_type; not a Hugging Face config")
    config = AutoConfig.for_model(**raw)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    base = getattr(model, model.base_model_prefix)
    layers = list(getattr(base, "layers", []))
    if not layers:
        raise ValueError(
            f"{cfg_path}: {type(model).__name__} has no decoder `layers`; fastcrit plans decoder-only models"
        )
    total = sum(p.numel() for p in model.parameters())
    per_layer = [sum(p.numel() for p in layer.parameters()) for layer in layers]
    hidden = config.hidden_size
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    tied = bool(getattr(config, "tie_word_embeddings", False))
    vocab = config.vocab_size
    if value_head:  # a score head (hidden -> 1) in place of the lm_head
        total += hidden - (0 if tied else vocab * hidden)
    return ModelShape(
        source=cfg_path,
        params=total,
        root_params=total - sum(per_layer),
        layer_params=max(per_layer),
        layers=len(layers),
        hidden=hidden,
        intermediate=getattr(config, "intermediate_size", 4 * hidden),
        heads=heads,
        kv_heads=getattr(config, "num_key_value_heads", None) or heads,
        head_dim=head_dim,
        vocab=vocab,
        tied=tied,
        model_type=config.model_type,
        note=note,
    )


LIGER_MODELS = ("qwen2", "llama")  # the architectures fastcrit.models.liger patches


def activation_bytes_per_token(m: ModelShape, compute_bytes: int, checkpointing: bool, liger: bool = True) -> float:
    """Bytes a training forward keeps per token for the backward, one micro-batch, plus the working
    set of the layer whose backward runs (one layer's activations and their gradients).

    Per layer, what autograd saves with SDPA / flash attention and Liger's RMSNorm and SwiGLU (the
    CUDA path): the norm inputs (2 H), the q/k/v and MLP inputs (2 H), rotated q and k, v (H +
    2 kv d), the attention output and o_proj's input (2 H), gate, up and down's input (3 I): 7 H +
    2 kv d + 3 I elements. Without Liger, Hugging Face's RMSNorm keeps an fp32 copy of its input
    (4 H bytes more per norm) and its SwiGLU keeps silu(gate) for the product (I elements more).
    With checkpointing a layer keeps its input (H) and one layer at a time is recomputed. The last
    layers' outputs (final norm, the log-prob kernel's input) add 2 H. benchmarks/gpu_realsize.py
    checks this sum against the update's peak on a GPU (Qwen2.5-1.5B's shape, 16k tokens per
    micro-batch, Liger off), with checkpointing and without: benchmarks/README.md, "On a GPU"."""
    layer = compute_bytes * (7 * m.hidden + 2 * m.kv_heads * m.head_dim + 3 * m.intermediate)
    if not liger:
        layer += 2 * 4 * m.hidden + compute_bytes * m.intermediate
    kept = m.layers * (compute_bytes * m.hidden if checkpointing else layer)
    working = 2 * layer  # the recomputed (or kept) layer and its gradients
    return float(kept + working + compute_bytes * 2 * m.hidden)


def forward_bytes_per_token(m: ModelShape, compute_bytes: int) -> float:
    """A forward without gradients: the largest layer working set (gate, up and their product, a few
    hidden-size tensors) and the final hidden states."""
    return float(compute_bytes * (3 * m.intermediate + 5 * m.hidden))


@dataclass
class Phase:
    name: str
    terms: dict[str, float] = field(default_factory=dict)  # label -> bytes (device memory)

    @property
    def total(self) -> float:
        return sum(self.terms.values())


@dataclass
class Plan:
    phases: list[Phase]
    capacity_gib: float
    world: int
    notes: list[str]
    host_load_gib: float  # host memory while the models load (all ranks of the node together)
    fixes: dict[str, list[str]]  # phase -> keys that would lower it
    train_tokens: int = 0  # tokens of a training micro-batch (its activation terms)
    forward_tokens: int = 0  # tokens of a forward-only micro-batch

    def peak(self) -> Phase:
        return max(self.phases, key=lambda p: p.total)

    def fits(self) -> bool:
        return self.peak().total / GIB <= self.capacity_gib * (1 - FIT_MARGIN)

    def over(self) -> list[Phase]:
        return [p for p in self.phases if p.total / GIB > self.capacity_gib * (1 - FIT_MARGIN)]

    def to_dict(self) -> dict:
        return {
            "capacity_gib": self.capacity_gib,
            "world": self.world,
            "fits": self.fits(),
            "margin": FIT_MARGIN,
            "host_load_gib": self.host_load_gib,
            "notes": self.notes,
            "phases": {
                p.name: {"total_gib": p.total / GIB, "terms_gib": {k: v / GIB for k, v in p.terms.items()}}
                for p in self.phases
            },
            "fixes": self.fixes,
        }


def _seq(cfg, prompt_len: int | None = None) -> int:
    return (prompt_len if prompt_len is not None else cfg.data.max_prompt_len) + cfg.rollout.max_new_tokens


def micro_tokens(cfg, forward_only: bool, prompt_len: int | None = None) -> int:
    """The tokens of one micro-batch: the token budget when set (padded rows x longest row <= it),
    else rows x the longest possible row."""
    t = cfg.trainer
    if t.max_tokens_per_micro_batch > 0:
        return t.max_tokens_per_micro_batch
    rows = t.forward_micro_batch_size if forward_only else t.micro_batch_size
    return rows * _seq(cfg, prompt_len)


def _engine_terms(
    label: str,
    rollout,
    shape: ModelShape,
    dtype_bytes: int,
    capacity: float,
    prompts: int,
    prompt_len: int,
    generating: bool = True,
) -> dict[str, float]:
    """An awake engine's device memory: SGLang's static share (weights + KV cache, held while
    awake) and its graphs, or the native engine's weights and fused copies, and while it generates
    (``generating``) the KV cache and logits of one generate chunk (freed when the call returns)."""
    if rollout.engine == "sglang":
        return {
            f"{label}: weights + KV cache (SGLang, "
            f"{rollout.mem_fraction_static:g} of the device)": rollout.mem_fraction_static * capacity,
            f"{label}: CUDA graphs, workspace (estimate)": SGLANG_GRAPHS_GIB * GIB,
        }
    n = max(1, rollout.n)
    max_batch = int(rollout.engine_args.get("max_batch", 256))
    per_chunk = max(1, min(prompts, max_batch // n))
    rows = per_chunk * n
    kv = shape.kv_bytes_per_token * dtype_bytes * (per_chunk * prompt_len + rows * rollout.max_new_tokens)
    weights = {
        f"{label}: weights (native engine)": dtype_bytes * shape.params,
        f"{label}: fused q/k/v, gate/up copies": dtype_bytes * shape.fused_params,
    }
    if not generating:
        return weights
    return {
        **weights,
        f"{label}: KV cache, {rows} rows": kv,
        f"{label}: logits and sampling": 4.0 * 4 * rows * shape.vocab
        + dtype_bytes * per_chunk * prompt_len * (3 * shape.intermediate + 4 * shape.hidden),
    }


def _train_terms(
    prefix: str, m: ModelShape, cfg, world: int, compute: int, tokens: int, lm_head: bool, checkpointing: bool
) -> tuple[dict[str, float], dict[str, float]]:
    liger = cfg.model.liger and m.model_type in LIGER_MODELS
    """(terms at the start of the backward, terms at its end) of one micro-batch's forward +
    backward of a trainable model: gradients, gathered parameters, activations, the log-prob
    kernel (``lm_head``), the root's fp32 reduce-scatter."""
    gathered = compute * (m.root_params + 2 * m.layer_params) if (world > 1 or compute != 4) else 0.0
    common = {
        f"{prefix} gradients (fp32 shards)": 4.0 * m.params / world,
        f"{prefix} gathered root + 2 layers": gathered,
    }
    start = dict(common)
    start[f"{prefix} activations, {tokens} tokens/micro-batch{' (checkpointed)' if checkpointing else ''}"] = (
        tokens * activation_bytes_per_token(m, compute, checkpointing, liger)
    )
    if lm_head:  # fastcrit_kernels.fused_logprobs' backward: d_logits chunk, d_hidden (fp32), d_lm_head
        start[f"{prefix} log-prob kernel"] = (
            min(LOGPROB_CHUNK_BYTES, compute * tokens * m.vocab)
            + 4.0 * tokens * m.hidden
            + compute * m.vocab * m.hidden
        )
    end = dict(common)
    if world > 1 or compute != 4:  # FSDP2 casts the root's gradients to fp32 for the reduce-scatter
        end[f"{prefix} root gradients + fp32 reduce-scatter"] = (compute + 4.0) * m.root_params
    return start, end


def _larger(a: dict, b: dict) -> dict:
    return a if sum(a.values()) >= sum(b.values()) else b


CONTEXTS = "CUDA contexts (outside torch's allocator)"


def _resolve(model) -> str:
    """A ModelConfig's path, the tiny model's directory for ``tiny`` (built once, cached)."""
    if model.path != "tiny":
        return model.path
    from fastcrit.models.hf import model_spec, resolve_model_path

    return resolve_model_path(model_spec(model))


def make_plan(cfg, capacity_gib: float) -> Plan:
    """The plan of ``cfg`` for each of its ``trainer.nproc`` GPUs (all alike: one rank per GPU)."""
    a, t, r = cfg.algorithm, cfg.trainer, cfg.rollout
    world, cap = max(1, t.nproc), capacity_gib * GIB
    c = _DTYPE_BYTES[cfg.model.dtype]  # compute dtype of trainable models, storage of frozen ones
    notes: list[str] = []
    policy = model_shape(_resolve(cfg.model), "model.path")
    notes += [policy.note] if policy.note else []
    sglang = [r.engine == "sglang"]
    prompt_len = cfg.data.max_prompt_len
    spec = recipe(a.name)
    prompt_len += spec.answers_in_prompt * r.max_new_tokens  # e.g. RARO's critic reads two answers
    ckpt = t.gradient_checkpointing

    static: dict[str, float] = {
        "policy weights (fp32 shards)": 4.0 * policy.params / world,
        "policy optimizer (AdamW, fp32)": 8.0 * policy.params / world,
    }
    needs_ref = spec.needs_reference(cfg)
    if needs_ref:
        static["reference (shards)"] = c * policy.params / world
    critic = rm = proxy = None
    if spec.value_critic:
        critic = model_shape(cfg.ppo.critic_path or _resolve(cfg.model), "ppo.critic_path", value_head=True)
        static["critic weights + optimizer"] = 12.0 * critic.params / world
    if "model" in cfg.reward.name.split("+"):
        try:
            rm = model_shape(reward_model_path(cfg), "reward.model_path", value_head=True)
        except ValueError:
            rm = dataclasses.replace(
                policy, params=policy.params - (0 if policy.tied else policy.vocab * policy.hidden) + policy.hidden
            )
            notes.append(
                f"reward.model_path {reward_model_path(cfg)!r} has no config: planned as a reward "
                "model of the policy's size"
            )
        else:
            notes += [rm.note] if rm.note else []
        online = spec.online_reward_model and cfg.ppo.rm_refresh_every > 0
        static["reward model" + (" weights + optimizer" if online else " (shards)")] = (
            (12.0 if online else c) * rm.params / world
        )
    if spec.proxy and not cfg.proxy.endpoint:
        pm = cfg.proxy.model if cfg.proxy.model.path else cfg.model
        proxy = model_shape(_resolve(pm), "proxy.model.path")
        notes += [proxy.note] if proxy.note else []
        sglang.append(cfg.proxy.rollout.engine == "sglang")
    static[CONTEXTS] = (CUDA_CONTEXT_GIB + (NCCL_GIB if world > 1 else 0.0) + CUDA_CONTEXT_GIB * sum(sglang)) * GIB

    prompts = max(1, cfg.data.prompts_per_step // world)
    engine = _engine_terms("rollout engine", r, policy, c, cap, prompts, prompt_len)
    proxy_engine = {}
    if proxy is not None:
        pr = cfg.proxy.rollout
        proxy_engine = _engine_terms(
            "proxy engine", pr, proxy, _DTYPE_BYTES[pm.dtype], cap, prompts * r.n, cfg.proxy.max_prompt_len
        )
    train_tokens = micro_tokens(cfg, False, prompt_len)
    fwd_tokens = micro_tokens(cfg, True, prompt_len)

    def forward(prefix: str, m: ModelShape, nbytes: int, trainable: bool) -> dict[str, float]:
        # FSDP2 gathers where it shards: several ranks, or a trainable model in mixed precision;
        # a frozen model in one process is a plain module (fastcrit.train.actor.wrap_trainable)
        sharded = world > 1 or (trainable and nbytes != 4)
        gathered = nbytes * (m.root_params + 2 * m.layer_params) if sharded else 0.0
        return {
            f"{prefix} gathered root + 2 layers": gathered,
            f"{prefix} forward working set, {fwd_tokens} tokens": fwd_tokens * forward_bytes_per_token(m, nbytes),
        }

    phases = []
    if cfg.sft.steps > 0:
        sft_static = {k: v for k, v in static.items() if k.startswith("policy") or k == CONTEXTS}
        s0, s1 = _train_terms("sft:", policy, cfg, world, c, train_tokens, True, ckpt)
        phases.append(Phase("sft", {**sft_static, **_larger(s0, s1)}))
    phases.append(Phase("rollout", {**static, **engine}))
    # after the rollout: the engine is awake (SGLang keeps its KV cache; the native engine's went
    # with the generate call) and CTRL's proxy generates the revisions
    reward = {
        **static,
        **_engine_terms("rollout engine", r, policy, c, cap, prompts, prompt_len, generating=False),
        **proxy_engine,
    }
    if rm is not None:
        reward.update(forward("reward model:", rm, c, False))
    phases.append(Phase("reward", reward))
    from fastcrit.train.checkpoint import SAVE_BUCKET_BYTES

    if recompute_old_logprobs(cfg):
        phases.append(Phase("old_logprobs", {**static, **forward("policy:", policy, c, True)}))
    if needs_ref:
        phases.append(Phase("ref", {**static, **forward("reference:", policy, c, False)}))
    if critic is not None:
        phases.append(Phase("values", {**static, **forward("critic:", critic, c, True)}))
        k0, k1 = _train_terms("critic:", critic, cfg, world, c, train_tokens, False, ckpt)
        phases.append(Phase("critic", {**static, **_larger(k0, k1)}))
    u0, u1 = _train_terms("policy:", policy, cfg, world, c, train_tokens, True, ckpt)
    phases.append(Phase("update", {**static, **_larger(u0, u1)}))
    bucket = r.weight_bucket_mb << 20
    # both engines hold only their weights while they load: SGLang resumes its KV cache at the next
    # generate, the native engine rebuilds its fused copies there
    engine_weights = c * policy.params
    # a gathered bucket: this rank's piece, the all-gather's output and the full copies (~2.5
    # buckets); a sync adds the bucket the engine is loading
    phases.append(
        Phase(
            "sync",
            {
                **static,
                "rollout engine: weights": engine_weights,
                "gathered buckets (sync)": 3.5 * min(bucket, engine_weights),
            },
        )
    )
    phases.append(
        Phase(
            "save",
            {
                **static,
                "rollout engine: weights": engine_weights,
                "gathered buckets (save)": 2.5 * min(SAVE_BUCKET_BYTES, engine_weights),
            },
        )
    )
    phases.append(Phase("evaluation", {**static, **engine, **proxy_engine}))

    # rank 0 alone reads the trained and frozen models (the fp32 policy is the largest); each native
    # engine reads its own copy in its rank (SGLang loads straight onto its device)
    host = 4.0 * policy.params + (world * c * policy.params if r.engine == "native" else 0.0)
    plan = Plan(
        phases,
        capacity_gib,
        world,
        notes,
        host_load_gib=host / GIB,
        fixes={},
        train_tokens=train_tokens,
        forward_tokens=fwd_tokens,
    )
    for p in plan.over():
        plan.fixes[p.name] = _fixes(cfg, p, plan)
    return plan


def _fixes(cfg, phase: Phase, plan: Plan) -> list[str]:
    """Keys that would lower ``phase``'s peak, biggest lever first (a suggested value where the
    arithmetic gives one)."""
    t, out = cfg.trainer, []
    over = phase.total - plan.capacity_gib * (1 - FIT_MARGIN) * GIB
    acts = {k: v for k, v in phase.terms.items() if "activations" in k or "working set" in k}
    if acts:
        if not t.gradient_checkpointing and any("activations" in k for k in acts):
            out.append("trainer.gradient_checkpointing=true (each layer keeps only its input)")
        label, act = max(acts.items(), key=lambda kv: kv[1])
        tokens = plan.train_tokens if "activations" in label else plan.forward_tokens
        if act > over and tokens:
            budget = int(tokens * (act - over) / act) // 1024 * 1024
            if budget >= 1024:
                out.append(
                    f"trainer.max_tokens_per_micro_batch={budget} "
                    f"(now {t.max_tokens_per_micro_batch or 'rows x length'})"
                )
        if "forward working set" in " ".join(acts):
            out.append("trainer.logprob_micro_batch_size (fewer rows per forward-only pass)")
    for key, section in (("rollout engine", "rollout"), ("proxy engine", "proxy.rollout")):
        share = next((v for k, v in phase.terms.items() if k.startswith(key) and "SGLang" in k), 0.0)
        if share:
            frac = (share - over) / (plan.capacity_gib * GIB)
            if frac > 0.05:
                out.append(f"{section}.mem_fraction_static={frac:.2f} (a smaller KV cache: fewer rows decode at once)")
    if cfg.trainer.nproc < 8:
        out.append("trainer.nproc (more ranks: smaller shards of the weights and optimizer)")
    return out


def render(plan: Plan) -> str:
    """The plan as a table: one column per phase, one row per term (GiB), then the peak and the
    headroom; the notes, the host memory at load, and what to change where a phase does not fit."""
    names = [p.name for p in plan.phases]
    labels = list(dict.fromkeys(k for p in plan.phases for k in p.terms))
    width = max(len(x) for x in labels + ["total"]) + 2
    col = max(9, max(len(n) for n in names) + 1)
    head = f"{'GiB per GPU (' + str(plan.world) + ' GPUs alike)':<{width}}" + "".join(f"{n:>{col}}" for n in names)
    lines = [head, "-" * len(head)]
    for label in labels:
        cells = "".join(
            f"{p.terms[label] / GIB:>{col}.2f}" if label in p.terms else f"{'':>{col}}" for p in plan.phases
        )
        lines.append(f"{label:<{width}}{cells}")
    lines.append("-" * len(head))
    lines.append(f"{'total':<{width}}" + "".join(f"{p.total / GIB:>{col}.2f}" for p in plan.phases))
    lines.append(
        f"{'headroom (of ' + format(plan.capacity_gib, 'g') + ' GiB)':<{width}}"
        + "".join(f"{plan.capacity_gib - p.total / GIB:>{col}.2f}" for p in plan.phases)
    )
    peak = plan.peak()
    lines.append("")
    limit = plan.capacity_gib * (1 - FIT_MARGIN)  # what a phase may use: the device less the margin
    rule = f"{plan.capacity_gib:g} GiB less the {FIT_MARGIN:.0%} kept free"
    if plan.fits():
        verdict = f"fits: {limit - peak.total / GIB:.2f} GiB under the {limit:.1f} GiB a phase may use ({rule})"
    else:
        verdict = (
            f"DOES NOT FIT: {peak.total / GIB - limit:.2f} GiB over the {limit:.1f} GiB a phase may use "
            f"({rule}); over: {', '.join(p.name for p in plan.over())}"
        )
    lines.append(f"peak: {peak.total / GIB:.2f} GiB in {peak.name}; {verdict}")
    lines.append(
        f"host memory while the models load: {plan.host_load_gib:.1f} GiB (rank 0 reads each model "
        f"once, the largest the fp32 policy; the other ranks get their shards from it)"
    )
    lines += [f"note: {n}" for n in plan.notes]
    for name, keys in plan.fixes.items():
        lines.append(f"{name} does not fit; what would lower it: " + "; ".join(keys))
    return "\n".join(lines)


def device_capacity_gib(default: float = 80.0) -> float:
    """GPU 0's memory in GiB where CUDA is available, else ``default`` (an 80 GB-class GPU)."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(0).total_memory / GIB
    return default
