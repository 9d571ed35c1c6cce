"""Load and save Hugging Face causal LMs from local directories (no hub).

A model is named by a *spec*: either a local directory holding a Hugging Face causal LM
(``config.json`` + weights + tokenizer files), or ``tiny`` / ``tiny:<key>=<value>,...`` for the tiny
local Qwen2 model of tiny.py (built once and cached, e.g. ``tiny:hidden=64,layers=2,seed=1``).
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from collections.abc import Mapping

import torch

from fastcrit.models.dtypes import DTYPES, parse_dtype  # callers import parse_dtype from here too
from fastcrit.models.tiny import TinySettings, ensure_tiny_model


def _parse_tiny_options(spec: str) -> dict:
    _, _, rest = spec.partition(":")
    fields = TinySettings.__dataclass_fields__
    opts: dict = {}
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or key not in fields:
            raise ValueError(
                f"model spec {spec!r}: bad option {item!r}; expected key=value with key in {sorted(fields)}"
            )
        if fields[key].type in ("bool", bool):
            if value.strip().lower() not in ("true", "false", "1", "0"):
                raise ValueError(f"model spec {spec!r}: {key} must be true or false, got {value!r}")
            opts[key] = value.strip().lower() in ("true", "1")
        else:
            try:
                opts[key] = int(value)
            except ValueError:
                raise ValueError(f"model spec {spec!r}: {key} must be an integer, got {value!r}") from None
    return opts


def model_spec(model) -> str:
    """A model config's spec (``fastcrit.config.ModelConfig``: ``path`` and ``tiny``): its path, or
    the full ``tiny:...`` spec of its tiny settings when the path is ``tiny``."""
    if model.path == "tiny":
        opts = ",".join(
            f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in dataclasses.asdict(model.tiny).items()
        )
        return f"tiny:{opts}"
    return model.path


def resolve_model_path(spec: str | os.PathLike) -> str:
    """Turn a model spec into a local directory, building the tiny model if the spec asks for it."""
    spec = os.fspath(spec)
    if spec == "tiny" or spec.startswith("tiny:"):
        return ensure_tiny_model(**_parse_tiny_options(spec))
    path = os.path.abspath(os.path.expanduser(spec))
    if not os.path.isdir(path):
        raise FileNotFoundError(
            f"model path {path!r} does not exist or is not a directory "
            "(use a local Hugging Face model directory, or 'tiny' for the built-in tiny model)"
        )
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise FileNotFoundError(f"model path {path!r} is not a Hugging Face model directory: it has no config.json")
    return path


def load_model(
    spec: str | os.PathLike,
    dtype: str | torch.dtype = "float32",
    device: str | torch.device = "cpu",
    attn_implementation: str | None = None,
    meta: bool = False,
):
    """Load a causal LM from a spec (see module docstring) in ``dtype`` on ``device``, in eval mode.
    ``meta``: the architecture alone, its weights on the meta device (nothing read or allocated),
    for a rank whose shards come from another rank's copy."""
    from transformers import AutoConfig, AutoModelForCausalLM

    kwargs = {"dtype": parse_dtype(dtype), "local_files_only": True}
    path = resolve_model_path(spec)
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    if meta:
        config = AutoConfig.from_pretrained(path, local_files_only=True)
        extra = {"attn_implementation": attn_implementation} if attn_implementation else {}
        # dtype= as from_pretrained takes it: the weights in it, buffers such as the rotary
        # frequencies in the dtype the model gives them (fp32), as on the rank that reads them
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(config, dtype=parse_dtype(dtype), **extra).eval()
    try:
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    except (OSError, ValueError) as exc:
        raise RuntimeError(f"could not load a causal LM from {path!r}: {exc}") from exc
    return model.to(device).eval()


# What flash_attn_2_problem's message ends with: the two ways out.
FLASH_ATTN_2_FIX = (
    "install flash-attn 2 after the gpu extra, built against the torch it installed: "
    "pip install flash-attn --no-build-isolation; or set trainer.pack_sequences=false"
)
FLASH_ATTN_2_MIN = "2.3.3"  # Transformers' is_flash_attn_2_available refuses older releases


def flash_attn_2_problem() -> str | None:
    """Why ``attn_implementation="flash_attention_2"`` would not run here (a sentence ending with
    FLASH_ATTN_2_FIX), or None when it would.

    Decided as Transformers 5.19 and 5.24 decide (``utils/import_utils.py``
    ``is_flash_attn_2_available``: the ``flash_attn`` module must belong to the ``flash-attn``
    distribution, release >= 2.3.3), then by importing what Transformers imports for it
    (``modeling_flash_attention_utils._lazy_imports``: ``flash_attn.flash_attn_varlen_func``,
    ``flash_attn.bert_padding``). The import is what a look-up by name cannot replace: sglang
    0.5.23 installs flash-attn-4, which makes ``flash_attn`` a bare namespace holding only
    ``flash_attn.cute`` (``importlib.util.find_spec`` finds it), and a flash-attn built against
    another torch fails to load its extension (``undefined symbol``). Transformers would try the
    Hub's ``kernels-community/flash-attn2`` instead (sglang installs ``kernels``); fastcrit does not
    take that path, which needs the Hub at run time and has never run here.

    Does NOT check the device (flash-attn needs a CUDA GPU of compute capability >= 8.0) nor run a
    kernel. This probe is the one import of ``flash_attn`` outside rollout/ that the GPU engine
    wall allows (docs/architecture.md)."""
    from importlib import metadata

    from packaging.version import InvalidVersion, Version  # a dependency of transformers

    dists = sorted({d.lower().replace("_", "-") for d in metadata.packages_distributions().get("flash_attn", [])})
    if "flash-attn" not in dists:
        if "flash-attn-4" in dists:
            why = (
                "the flash_attn module here is flash-attn-4's (installed by sglang): a namespace with "
                "flash_attn.cute only, not flash-attn 2's functions"
            )
        elif dists:
            why = f"the flash_attn module here belongs to {', '.join(dists)}, not to flash-attn"
        else:
            why = "flash-attn is not installed"
        return f"{why}; {FLASH_ATTN_2_FIX}"
    version = metadata.version("flash-attn")
    try:
        recent = Version(version) >= Version(FLASH_ATTN_2_MIN)
    except InvalidVersion:  # Transformers refuses a version it cannot read too
        recent = False
    if not recent:
        return f"flash-attn {version}: Transformers loads {FLASH_ATTN_2_MIN} or newer only; {FLASH_ATTN_2_FIX}"
    try:
        varlen = importlib.import_module("flash_attn").flash_attn_varlen_func
        importlib.import_module("flash_attn.bert_padding")
    except Exception as exc:  # an extension built for another torch raises ImportError or OSError
        return (
            f"flash-attn {version} is installed but does not import ({type(exc).__name__}: {exc}); "
            f"if it was built against another torch, reinstall it with --force-reinstall "
            f"--no-cache-dir; {FLASH_ATTN_2_FIX}"
        )
    if not callable(varlen):
        return f"flash-attn {version}: flash_attn.flash_attn_varlen_func is not a function; {FLASH_ATTN_2_FIX}"
    return None


VALUE_HEAD_KINDS = ("ForTokenClassification", "ForSequenceClassification")


def _value_class(path: str, config, head: str | None):
    """The Auto class a value model of ``config`` loads as: the kind its directory was saved as,
    else (a causal LM) token classification, else sequence classification where the family has
    only that (Gemma 3, OLMo 2, MiniCPM3). Both are the backbone plus a ``score`` linear, which
    fastcrit.train.value runs on every position itself. ValueError for a family with neither."""
    from transformers import AutoModelForSequenceClassification, AutoModelForTokenClassification

    if head == "ForSequenceClassification":
        return AutoModelForSequenceClassification
    if head == "ForTokenClassification":
        return AutoModelForTokenClassification
    for cls in (AutoModelForTokenClassification, AutoModelForSequenceClassification):
        if type(config) in cls._model_mapping:
            return cls
    raise ValueError(
        f"{path!r}: Transformers has no token- or sequence-classification model for model_type "
        f"{config.model_type!r}, the backbone-plus-score form a value model (PPO's critic, a reward "
        "model) takes; use a critic of another family (ppo.critic_path)"
    )


def _check_score(model, path: str) -> None:
    score = getattr(model, "score", None)
    if not isinstance(score, torch.nn.Linear) or score.out_features != 1:
        raise ValueError(
            f"{path!r}: {type(model).__name__} has no `score` linear to one output, the head a value "
            "model's values come from; use a critic of another family (ppo.critic_path)"
        )


def load_value_model(
    spec: str | os.PathLike,
    dtype: str | torch.dtype = "float32",
    device: str | torch.device = "cpu",
    meta: bool = False,
):
    """A backbone with a scalar head (hidden -> 1): a PPO critic or a reward model, verl's form.

    A directory saved with such a head (``*ForTokenClassification`` or ``*ForSequenceClassification``
    with one label: ours, or a TRL reward model) keeps its head; a causal LM gets a fresh one (the
    backbone's weights, ``lm_head`` dropped). The model comes back with dropout off, in eval mode,
    and with ``config.architectures`` naming its class, so that a saved copy loads back with
    ``transformers`` as the same kind of model. ``meta``: the architecture alone, as in
    ``load_model`` (its head's values then come from another rank).
    """
    from transformers import AutoConfig

    path = resolve_model_path(spec)
    config = AutoConfig.from_pretrained(path, local_files_only=True)
    archs = config.architectures or []
    head = next((k for a in archs for k in VALUE_HEAD_KINDS if a.endswith(k)), None)
    if head and config.num_labels != 1:
        raise ValueError(
            f"{path!r}: a {archs[0]} with {config.num_labels} labels is not a value model "
            "(one scalar per token is needed)"
        )
    config.num_labels, config.classifier_dropout = 1, 0.0
    cls = _value_class(path, config, head)
    if meta:
        with torch.device("meta"):
            model = cls.from_config(config, dtype=parse_dtype(dtype))
        _check_score(model, path)
        model.config.architectures = [type(model).__name__]
        model._fresh_value_head = head is None
        return model.eval()
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    if head is None:  # the missing head and the unused lm_head are expected: no load report
        hf_logging.set_verbosity_error()
    try:
        model = cls.from_pretrained(path, config=config, dtype=parse_dtype(dtype), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise RuntimeError(f"could not load a value model from {path!r}: {exc}") from exc
    finally:
        hf_logging.set_verbosity(level)
    _check_score(model, path)
    if head is None:  # a fresh head: small random weights, zero bias (values start near 0)
        with torch.no_grad():
            model.score.weight.normal_(0.0, 1.0 / (model.score.in_features + 1) ** 0.5)
            if model.score.bias is not None:
                model.score.bias.zero_()
    model.config.architectures = [type(model).__name__]
    model._fresh_value_head = head is None
    return model.to(device).eval()


def load_tokenizer(spec: str | os.PathLike):
    """Load the tokenizer that lives next to the model; pad falls back to EOS, padding is on the left."""
    from transformers import AutoTokenizer

    path = resolve_model_path(spec)
    try:
        tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise RuntimeError(f"could not load a tokenizer from {path!r}: {exc}") from exc
    if tok.eos_token_id is None:
        raise ValueError(f"tokenizer at {path!r} has no eos_token; generation could never stop")
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok


def eos_token_ids(*sources) -> list[int]:
    """The sorted union of the ``eos_token_id`` of each source (a tokenizer, a model config, a
    generation config; each names an int, a list of ints, or None).

    Both rollout engines stop on exactly this set. SGLang started with ``skip_tokenizer_init`` has no
    tokenizer, so it stops only on the config's and generation config's ids (SGLang 0.5.23
    configs/model_config.py:2190) and on the request's ``stop_token_ids`` (managers/schedule_batch.py:1856);
    the SGLang engine therefore sends this set as ``stop_token_ids``.
    """
    ids: set[int] = set()
    for source in sources:
        e = getattr(source, "eos_token_id", None) if source is not None else None
        if e is None:
            continue
        ids.update(int(x) for x in (e if isinstance(e, (list, tuple, set)) else [e]) if x is not None)
    return sorted(ids)


def model_eos_token_ids(spec: str | os.PathLike) -> list[int]:
    """``eos_token_ids`` of a model directory (tokenizer, config.json, generation_config.json when
    there is one), read without loading the weights."""
    from transformers import AutoConfig, GenerationConfig

    path = resolve_model_path(spec)
    config = AutoConfig.from_pretrained(path, local_files_only=True)
    try:
        generation = GenerationConfig.from_pretrained(path, local_files_only=True)
    except OSError:  # no generation_config.json
        generation = None
    return eos_token_ids(load_tokenizer(path), config, generation)


def _full(name: str, t: torch.Tensor) -> torch.Tensor:
    # Gathering a DTensor is a collective, which stays in train/; here it is refused, told apart
    # without importing torch.distributed. Everything else ends contiguous on CPU.
    if hasattr(t, "full_tensor"):
        raise TypeError(
            f"save_pretrained_safetensors: {name!r} is a sharded DTensor; pass full tensors "
            "(gather them in train/, e.g. with fastcrit.train.policy.full_named_tensors, "
            "on every rank, and let rank 0 write)"
        )
    return t.detach().to("cpu").contiguous()


def _meta_copy(config):
    """The model class of ``config`` (its ``architectures``, else a causal LM) on the meta device:
    what Transformers' weight conversions are looked up by, nothing allocated."""
    import transformers

    archs = getattr(config, "architectures", None) or []
    cls = getattr(transformers, archs[0], None) if archs else None
    if cls is None:
        cls = transformers.AutoModelForCausalLM
    with torch.device("meta"):
        return cls.from_config(config) if hasattr(cls, "from_config") else cls._from_config(config)


def weight_conversions(config_or_model) -> list[str]:
    """The conversions Transformers applies to this family's weights as it loads them (e.g. a
    MoE's per-expert weights fused into one tensor per layer; ``[]`` for most dense families and
    for Transformers 4.x): a model loaded here names and shapes those weights unlike its
    checkpoints do. Given a model (one already built, e.g. on the meta device), it is read as it
    is; given a config, a meta copy is built for the look-up."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import PrefixChange
    except ImportError:
        return []
    model = config_or_model if isinstance(config_or_model, torch.nn.Module) else _meta_copy(config_or_model)
    found = get_model_conversion_mapping(model, add_legacy=False)
    # a prefix change only says where a checkpoint's names may start; the names stay the same
    return [type(c).__name__ for c in found if not isinstance(c, PrefixChange)]


def _checkpoint_layout(config, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``tensors`` (the model's own names and shapes) in the layout the family's checkpoints use.
    Transformers 5 converts some families' weights as it loads them (``weight_conversions``: a
    MoE's per-expert ``experts.<i>.gate_proj`` / ``up_proj`` / ``down_proj`` into fused
    ``experts.gate_up_proj`` / ``down_proj``) and its ``save_pretrained`` converts them back; a
    directory written in the loaded layout is not what the family's other loaders (4.x, SGLang,
    vLLM) read. Transformers 4.x has no conversions: its layout is the checkpoint's."""
    try:
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:
        return tensors
    return dict(revert_weight_conversion(_meta_copy(config), dict(tensors)))


def save_pretrained_safetensors(
    model_or_state_dict, tokenizer, directory: str, config=None, generation_config=None
) -> str:
    """Write a Hugging Face directory (config, safetensors weights, tokenizer) that
    ``AutoModelForCausalLM.from_pretrained(directory)`` loads.

    ``model_or_state_dict`` is either a ``PreTrainedModel`` or a state dict with Hugging Face names
    holding full tensors. A sharded DTensor (FSDP2) is refused with a TypeError naming it, before
    anything is written: the gather is a collective, done in train/ (fastcrit.train.checkpoint
    gathers on every rank and lets rank 0 call this). With a state dict, ``config`` (a
    ``PretrainedConfig``) is required. Tied weights are written once, as transformers does.
    """
    from safetensors.torch import save_file

    if isinstance(model_or_state_dict, Mapping):
        if config is None:
            raise ValueError("save_pretrained_safetensors: a state dict needs the model's config")
        state = model_or_state_dict
    else:
        config = model_or_state_dict.config
        generation_config = generation_config or getattr(model_or_state_dict, "generation_config", None)
        state = model_or_state_dict.state_dict()
    full_state = {}
    for name, t in state.items():
        if name.endswith("rotary_emb.inv_freq"):
            continue
        if getattr(config, "tie_word_embeddings", False) and name == "lm_head.weight":
            continue
        full_state[name] = _full(name, t)
    tensors = {}
    seen: dict[int, str] = {}
    for name, full in _checkpoint_layout(config, full_state).items():
        full = full.contiguous()
        # safetensors refuses tensors that share storage; clone any alias.
        ptr = full.untyped_storage().data_ptr()
        if ptr in seen:
            full = full.clone()
        seen[full.untyped_storage().data_ptr()] = name
        tensors[name] = full
    os.makedirs(directory, exist_ok=True)
    config.save_pretrained(directory)
    if generation_config is not None:
        generation_config.save_pretrained(directory)
    save_file(tensors, os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
    if tokenizer is not None:
        tokenizer.save_pretrained(directory)
    make_portable(directory)
    return directory


def umask() -> int:
    """The process's umask, read without changing it where /proc says it (else set and restored)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def file_mode() -> int:
    """The mode a new file gets here: 0o666 less the umask."""
    return 0o666 & ~umask()


def share_files(root: str) -> None:
    """Give every file under ``root`` the mode of a normally created file (``file_mode``):
    safetensors >= 0.8.1 writes its file 0600, which a teammate in the user's group cannot read."""
    mode = file_mode()
    for dirpath, _, files in os.walk(root):
        for name in files:
            path = os.path.join(dirpath, name)
            if not os.path.islink(path):
                os.chmod(path, mode)


# 5.x writes a fast tokenizer built from tokenizer.json as this class, which 4.x does not know.
_V5_ONLY_TOKENIZER_CLASS = {"TokenizersBackend": "PreTrainedTokenizerFast"}


def _rewrite_json(path: str, fix) -> None:
    import json

    if not os.path.isfile(path):
        return
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if fix(data):
        with open(path, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2, sort_keys=True, ensure_ascii=False)
            f.write("\n")


def portable_config(config: dict) -> bool:
    """Make a config.json written by transformers 5 say the same rotary embedding to 4.x; True if
    it changed.

    5.x keeps the rotary settings only in ``rope_parameters`` ({rope_type, rope_theta, scaling
    keys}); 4.51-4.57 read top-level ``rope_theta`` (default 10000, silently) and ``rope_scaling``
    ({rope_type, factor, ...}, None for plain rope) and ignore ``rope_parameters``. So both are
    written from ``rope_parameters``: ``rope_theta`` (and ``partial_rotary_factor``) at the top,
    the rest as ``rope_scaling`` unless the type is ``default``. 5.x reads them back to the same
    ``rope_parameters`` (``RotaryEmbeddingConfigMixin.convert_rope_params_to_dict``: a
    ``rope_scaling`` replaces ``rope_parameters``, then the top-level ``rope_theta`` fills it in).
    Per-layer-type rope (a nested ``rope_parameters``, 5.x only) is left as it is: 4.x has no way
    to say it."""
    rope = config.get("rope_parameters")
    if not isinstance(rope, dict) or "rope_theta" not in rope:
        return False
    before = dict(config)
    config["rope_theta"] = rope["rope_theta"]
    if "partial_rotary_factor" in rope:
        config["partial_rotary_factor"] = rope["partial_rotary_factor"]
    scaling = {k: v for k, v in rope.items() if k not in ("rope_theta", "partial_rotary_factor")}
    config["rope_scaling"] = None if scaling.get("rope_type", "default") == "default" else scaling
    return config != before


def portable_tokenizer_config(config: dict) -> bool:
    """Make a tokenizer_config.json written by transformers 5 load in 4.x to the same tokenizer;
    True if it changed. 5.x writes the extra special tokens as a list ``extra_special_tokens``,
    which 4.x reads as a dict of named tokens (``AttributeError: 'list' object has no attribute
    'keys'``); their 4.x name, ``additional_special_tokens``, 5.x reads too. A tokenizer class 4.x
    does not know is replaced by the one it loads ``tokenizer.json`` into (5.x picks the model
    type's class either way)."""
    before = dict(config)
    extra = config.get("extra_special_tokens")
    if isinstance(extra, list):
        del config["extra_special_tokens"]
        names = list(config.get("additional_special_tokens") or [])
        config["additional_special_tokens"] = names + [t for t in extra if t not in names]
    cls = config.get("tokenizer_class")
    if cls in _V5_ONLY_TOKENIZER_CLASS:
        config["tokenizer_class"] = _V5_ONLY_TOKENIZER_CLASS[cls]
    return config != before


def make_portable(directory: str) -> str:
    """Make a Hugging Face directory written here load the same in transformers 4.51-4.57 and 5
    (``portable_config``, ``portable_tokenizer_config``) and readable as a normal file is
    (``share_files``). What this does NOT cover: the weights' dtype in 4.51-4.55, which read
    ``torch_dtype`` (5.x writes ``dtype``) and load fp32 unless told otherwise."""
    _rewrite_json(os.path.join(directory, "config.json"), portable_config)
    _rewrite_json(os.path.join(directory, "tokenizer_config.json"), portable_tokenizer_config)
    share_files(directory)
    return directory


def export_model(src: str | os.PathLike, out: str | os.PathLike, dtype: str | torch.dtype | None = None) -> str:
    """Copy the model of a Hugging Face directory (e.g. a checkpoint's ``step_<N>``) to ``out``
    alone: config, safetensors weights in ``dtype`` (default: the dtype its config.json names,
    else fp32), tokenizer and generation config, portable as ``make_portable`` makes them;
    nothing else of the directory (no optimizer state, no trainer state, no recipe files).
    A value model (a ``*ForTokenClassification`` / ``*ForSequenceClassification`` such as PPO's
    critic) is copied as one. ``out`` must not exist or be empty; it is written beside itself
    and renamed into place, so it never holds half an export. Returns ``out``."""
    import json
    import shutil
    import tempfile

    from transformers import AutoTokenizer

    path = resolve_model_path(src)
    out = os.path.abspath(os.fspath(out))
    if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
        raise ValueError(f"{out}: already exists and is not an empty directory")
    with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
        raw = json.load(f)
    if dtype is None:
        named = raw.get("dtype") or raw.get("torch_dtype")
        dtype = named if isinstance(named, str) and named in DTYPES else "float32"
    dt = parse_dtype(dtype)
    archs = raw.get("architectures") or []
    value = any(a.endswith(k) for a in archs for k in VALUE_HEAD_KINDS)
    model = load_value_model(path, dtype=dt) if value else load_model(path, dtype=dt)
    model.config.dtype = dt
    has_tokenizer = any(os.path.isfile(os.path.join(path, n)) for n in ("tokenizer.json", "tokenizer_config.json"))
    tok = AutoTokenizer.from_pretrained(path, local_files_only=True) if has_tokenizer else None
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.tmp-", dir=parent)
    try:
        save_pretrained_safetensors(model, tok, tmp)
        os.chmod(tmp, 0o777 & ~umask())  # a directory's normal mode (mkdtemp's is 0700)
        if os.path.isdir(out):
            os.rmdir(out)
        os.rename(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
