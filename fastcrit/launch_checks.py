"""What `fastcrit train / sft / rm / critique / gen / export` check before any rank starts or any
weights load: the data files, the output directory, the model directory's weights and the
policy's architecture. Each problem is a ConfigError naming the key, where it would otherwise
have surfaced inside a rank, minutes later, as a traceback."""

from __future__ import annotations

import os

from fastcrit.data.datasets import FILE_TYPES, DatasetError
from fastcrit.errors import ConfigError


def check_data(cfg, command: str) -> None:
    """Each data source the command will read names a file or a shipped task, checked before any
    model loads: a missing file found after the SFT warm start cost its minutes, and the error
    named the file but not the key."""
    from fastcrit.data.datasets import resolve_source

    keys = {"data.train": cfg.data.train, "data.val": cfg.data.val}
    if command == "sft" or (command == "train" and cfg.sft.steps > 0):
        keys["sft.data"] = cfg.sft.data  # "" for CTRL and RARO: their pre-stage writes it
    if command == "rm" and not cfg.rm.label_reward:
        keys["rm.data"] = cfg.rm.data
    for key, spec in keys.items():
        if not spec:
            continue
        try:
            path = resolve_source(spec, "test" if key == "data.val" else "train")
        except DatasetError as e:
            raise ConfigError(f"{key}: {e}") from None
        # What the loaders would refuse only when they read the file, after the warm start.
        if os.path.isdir(path):
            raise ConfigError(f"{key}: {path} is a directory; give a data file ({', '.join(FILE_TYPES)})")
        if not path.endswith(FILE_TYPES):
            raise ConfigError(f"{key}: {path}: expected a {', '.join(FILE_TYPES[:-1])} or {FILE_TYPES[-1]} file")
        if os.path.getsize(path) == 0:
            raise ConfigError(f"{key}: {path} is empty")
        if path.endswith(".json"):
            with open(path, "rb") as f:
                head = f.read(4096).decode("utf-8-sig", errors="replace").lstrip()
            if head and not head.startswith("["):
                raise ConfigError(
                    f"{key}: {path}: expected a JSON array of objects (or a .jsonl file, one object per line)"
                )
    _check_rows(cfg, command)


def _check_rows(cfg, command: str) -> None:
    """The rows the command will read through the shared loaders, read once here by the same
    loader with the same data.prompt_key / answer_key and data.strict: a file none of whose rows
    has the prompt key (or one that data.strict refuses) stopped the run only when a rank read it,
    after the model loaded and the SFT warm start ran. A recipe whose data are not prompt rows
    (``Recipe.prompt_rows``: CTRL's problem files) reads them itself, first thing."""
    from fastcrit.data.datasets import load_dataset, load_preferences
    from fastcrit.registry import recipe

    d = cfg.data
    reads = []  # (spec, the split a shipped task defaults to)
    if command == "sft" or (command == "train" and cfg.sft.steps > 0):
        reads.append((cfg.sft.data, "train"))  # "" where a pre-stage writes it
    if command == "train" and recipe(cfg.algorithm.name).prompt_rows:
        reads += [(d.train, "train"), (d.val, "test")]
    if command == "rm" and cfg.rm.label_reward:
        reads.append((d.train, "train"))
    # a DatasetError goes out as the ranks' would ("fastcrit: data error: <file>:<line>: ..."),
    # only sooner
    for spec, split in reads:
        if spec:
            load_dataset(spec, d.prompt_key, d.answer_key, split, strict=d.strict)
    if command == "rm" and not cfg.rm.label_reward and cfg.rm.data:
        load_preferences(cfg.rm.data, strict=d.strict)


def check_weights(spec: str, key: str) -> None:
    """A model directory holds weights: the meta-device checks read config.json alone, and a
    directory without weights failed only once a rank loaded it, with a traceback."""
    if spec == "tiny" or spec.startswith("tiny:") or not os.path.isdir(os.path.expanduser(spec)):
        return  # the tiny model is built on demand; a missing directory is reported by its loader
    names = os.listdir(os.path.expanduser(spec))
    if not any(n.endswith((".safetensors", ".bin", ".pt", ".pth")) for n in names):
        raise ConfigError(f"{key}: {spec} holds no weights (no *.safetensors or pytorch_model*.bin file)")


def check_output_dir(out: str, key: str) -> None:
    """The directory a run writes can be made and written, checked before any rank starts: a
    file in its place, a '~' (not expanded here: it would make a directory named '~'), a
    repository's root, or no permission otherwise stopped a rank with a traceback."""
    if out.startswith("~"):
        raise ConfigError(f"{key}: {out!r}: '~' is not expanded here; write the full path ({os.path.expanduser(out)})")
    if os.path.isdir(os.path.join(out, ".git")):
        raise ConfigError(
            f"{key}: {out!r} is a git repository's root; a run writes config.yaml, checkpoints/ and more "
            "there, so give it a directory of its own (e.g. runs/NAME)"
        )
    existing = os.path.abspath(out)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise ConfigError(f"{key}: {out!r}: {existing} is a file, not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"{key}: {out!r}: no permission to write in {existing}")


def check_model(cfg) -> None:
    """What the trainer needs of the policy's architecture, checked on the meta device (nothing
    read) before any rank starts: logits that are its hidden states times lm_head up to a constant
    factor (the fused log-probs; fastcrit.models.logit_head), and its decoder layers at
    ``<base model>.layers`` (FSDP2's units and the checkpointed blocks); a value critic
    (``ppo.critic_path``) that its family can build; with the SGLang engine, weights that load
    under the names SGLang reads (``weight_conversions``)."""
    from fastcrit.models.hf import load_model, load_value_model, model_spec, weight_conversions
    from fastcrit.models.logit_head import logit_scale
    from fastcrit.registry import recipe

    spec = model_spec(cfg.model)
    critic = cfg.ppo.critic_path or spec
    if recipe(cfg.algorithm.name).value_critic and not critic.startswith("tiny"):
        try:
            load_value_model(critic, meta=True)
        except (ValueError, OSError) as e:
            raise ConfigError(f"ppo.critic_path: {e}") from None
    if spec.startswith("tiny"):  # the built-in Qwen2
        return
    try:
        lm = load_model(spec, meta=True)
        logit_scale(lm)
    except (ValueError, OSError) as e:  # UnsupportedLogits; a missing or unreadable directory
        raise ConfigError(f"model.path: {e}") from None
    prefix = getattr(lm, "base_model_prefix", "")
    if not hasattr(getattr(lm, prefix, None), "layers"):
        raise ConfigError(
            f"model.path: {type(lm).__name__} keeps its decoder layers elsewhere than "
            f"{prefix or 'its base model'}.layers, where fastcrit finds the blocks it shards and "
            "checkpoints (Llama, Qwen, Mistral, Gemma, Phi-3 and most current families have them there)"
        )
    converted = weight_conversions(lm) if cfg.rollout.engine == "sglang" else []
    if converted:
        raise ConfigError(
            f"rollout.engine=sglang: Transformers converts {lm.config.model_type}'s weights as it loads "
            f"them ({', '.join(converted)}; a MoE's experts fused into one tensor per layer), so the "
            "trainer's weight sync would send names that SGLang's loader, which reads the checkpoint "
            "layout, skips without an error (0.5.23 models/qwen3_moe.py load_weights): the engine "
            "would keep sampling from the first weights. Use rollout.engine=native for this model"
        )
