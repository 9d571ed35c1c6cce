"""The tiny local Qwen2 model: the CPU default when there is no hub.

``build_tiny_model`` trains the tokenizer (see tokenizer.py), builds a randomly initialised
``Qwen2ForCausalLM`` of the requested size and saves both as an ordinary Hugging Face directory
(``config.json``, ``model.safetensors``, tokenizer files), so everything downstream treats it like
any other local model. ``ensure_tiny_model`` builds it once per setting into a cache directory and
reuses it; the directory name carries a hash of the settings and of the tokenizer corpus, so a
changed task file gives a new model instead of a stale one.

The weights are a deterministic function of the settings and the seed (torch's CPU generator is
forked and seeded for the build, the caller's RNG state is untouched).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass

from fastcrit.models.tokenizer import SPECIAL_TOKENS, corpus_hash, default_corpus, train_tokenizer

# Bump when the build recipe changes in a way that changes the files it writes.
_FORMAT_VERSION = 1


@dataclass
class TinySettings:
    """The tiny model's size and seed; every default lives here (the config's ``model.tiny`` is
    this class)."""

    hidden: int = 128
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 512
    vocab_size: int = 512  # tokenizer vocabulary (bytes + merges + special tokens)
    max_positions: int = 2048
    tie_word_embeddings: bool = False
    seed: int = 0

    def validate(self) -> None:
        for name in ("hidden", "layers", "heads", "kv_heads", "intermediate", "max_positions"):
            if getattr(self, name) < 1:
                raise ValueError(f"tiny model: {name}={getattr(self, name)} must be >= 1")
        if self.vocab_size < 256 + len(SPECIAL_TOKENS):
            raise ValueError(
                f"tiny model: vocab_size={self.vocab_size} must be >= {256 + len(SPECIAL_TOKENS)} "
                f"(256 bytes + {len(SPECIAL_TOKENS)} special tokens)"
            )
        if self.seed < 0:
            raise ValueError(f"tiny model: seed={self.seed} must be >= 0")
        if self.hidden % self.heads:
            raise ValueError(f"tiny model: hidden={self.hidden} is not a multiple of heads={self.heads}")
        if self.heads % self.kv_heads:
            raise ValueError(f"tiny model: heads={self.heads} is not a multiple of kv_heads={self.kv_heads}")
        if (self.hidden // self.heads) % 2:
            raise ValueError(
                f"tiny model: head size hidden/heads={self.hidden // self.heads} must be even (rotary embeddings)"
            )


def build_tiny_model(directory: str, *, corpus: list[str] | None = None, **settings) -> str:
    """Build the tiny model and its tokenizer and save them to ``directory``; return the path.

    ``settings`` are TinySettings fields (their defaults apply to the ones left out).
    """
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    s = TinySettings(**settings)
    s.validate()
    hidden, vocab_size = s.hidden, s.vocab_size
    tokenizer = train_tokenizer(vocab_size, corpus)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=s.intermediate,
        num_hidden_layers=s.layers,
        num_attention_heads=s.heads,
        num_key_value_heads=s.kv_heads,
        max_position_embeddings=s.max_positions,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=s.tie_word_embeddings,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        use_cache=True,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(s.seed)
        model = Qwen2ForCausalLM(config).to(torch.float32)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, do_sample=False
    )
    os.makedirs(directory, exist_ok=True)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    with open(os.path.join(directory, "fastcrit_tiny.json"), "w") as f:
        json.dump({"settings": asdict(s), "format_version": _FORMAT_VERSION}, f, indent=1)
    return directory


def default_cache_root() -> str:
    root = os.environ.get("FASTCRIT_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "fastcrit")
    return root


def tiny_model_dir(settings: TinySettings, corpus: list[str]) -> str:
    key = json.dumps({"s": asdict(settings), "corpus": corpus_hash(corpus), "v": _FORMAT_VERSION}, sort_keys=True)
    return os.path.join(default_cache_root(), "tiny-qwen2-" + hashlib.sha256(key.encode()).hexdigest()[:12])


def _complete(directory: str) -> bool:
    return all(
        os.path.exists(os.path.join(directory, f))
        for f in ("config.json", "model.safetensors", "tokenizer.json", "fastcrit_tiny.json")
    )


def ensure_tiny_model(directory: str | None = None, **settings) -> str:
    """Return a directory holding the tiny model for ``settings``, building it on first use.

    With ``directory=None`` the model lives in ``$FASTCRIT_CACHE`` (default ``~/.cache/fastcrit``)
    under a name hashed from the settings and the tokenizer corpus. The build goes to a temporary
    sibling directory that is renamed into place, so a crash or a concurrent builder never leaves a
    half-written model behind (the loser of a race discards its copy).
    """
    unknown = set(settings) - set(TinySettings.__dataclass_fields__)
    if unknown:
        raise ValueError(
            f"tiny model: unknown option(s) {sorted(unknown)}; known: {sorted(TinySettings.__dataclass_fields__)}"
        )
    s = TinySettings(**settings)
    s.validate()
    corpus = default_corpus()
    if directory is None:
        directory = tiny_model_dir(s, corpus)
    directory = os.path.abspath(os.path.expanduser(directory))
    if _complete(directory):
        return directory
    parent = os.path.dirname(directory)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=os.path.basename(directory) + ".tmp-", dir=parent)
    try:
        build_tiny_model(tmp, corpus=corpus, **asdict(s))
        try:
            os.rename(tmp, directory)
        except OSError:
            if not _complete(directory):  # an empty or broken leftover: replace it
                shutil.rmtree(directory, ignore_errors=True)
                os.rename(tmp, directory)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return directory


def build_from_config(
    directory: str,
    config_json: str,
    *,
    dtype: str = "bfloat16",
    device: str = "cpu",
    seed: int = 0,
    overrides: dict | None = None,
) -> str:
    """A randomly initialised causal LM of the architecture in ``config_json`` (e.g. a published
    model's config.json: its real size, for memory and speed measurements where no weights can be
    downloaded), with the local tokenizer, saved in ``dtype`` as a Hugging Face directory.

    The model keeps its own vocabulary size (its embeddings and lm_head are the real size); the
    tokenizer's ids are a small prefix of it, and the config's BOS / EOS / pad ids become the
    tokenizer's. Generated ids past the tokenizer decode to nothing. ``overrides``: config keys to
    change (e.g. a smaller model for a dry run). Initialised on ``device`` (a GPU builds a 1.5B
    model in seconds)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    from fastcrit.models.dtypes import parse_dtype

    with open(config_json) as f:
        raw = json.load(f)
    raw.update(overrides or {})
    tokenizer = train_tokenizer(TinySettings.vocab_size, default_corpus())
    if raw["vocab_size"] < len(tokenizer):
        raise ValueError(
            f"{config_json}: vocab_size {raw['vocab_size']} is smaller than the local tokenizer's {len(tokenizer)} ids"
        )
    raw.update(bos_token_id=None, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    config = AutoConfig.for_model(**raw)
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config).to(parse_dtype(dtype))
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, do_sample=False
    )
    os.makedirs(directory, exist_ok=True)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory
