"""The SGLang rollout engine (GPU only): the Engine protocol over SGLang's offline ``sglang.Engine``.

Every SGLang call below was checked against SGLang 0.5.23's source (the version the ``gpu`` extra
pins); docs/gpu.md lists each call, the source line it was checked against, and what has run.

This is the only module that imports sglang, and it does so inside ``SGLangEngine.__init__``, so
importing this file costs nothing on a machine without it. The pure pieces (``request_params``,
``to_rollout``, ``finish_reason``, ``check_success``, ``buckets``, ``sglang_mem_fraction``,
``WeightLedger``, ``nccl_env``, ``keep_signal``) never touch sglang and are tested on CPU.

How the protocol maps onto SGLang:

- ``generate``: each prompt is sent ``n`` times with ``n=1`` (rather than SGLang's own ``n``), which
  pins the output order to prompt-major; SGLang's radix cache still prefills a shared prompt once.
  Token ids and log-probs come together from ``meta_info["output_token_logprobs"]`` ((logprob,
  token_id, text) triples), log_softmax(logits / T) before top-k / top-p, the convention of
  fastcrit.types.Rollout. The stop ids sent are the model's EOS set (``fastcrit.models.hf.eos_token_ids``,
  which the native engine stops on too) plus ``params.stop_token_ids``: started with
  ``skip_tokenizer_init`` SGLang knows no tokenizer EOS. An ``abort`` finish raises.
- seeds: SGLang reads ``sampling_seed`` only when the engine runs with
  ``enable_deterministic_inference`` (set it in ``rollout.engine_args``); then request ``k`` gets
  ``sampling_seed = seed + k``. Otherwise the seed is not sent, and the engine warns once that
  sampling is not reproducible.
- ``sleep``: ``release_memory_occupation`` of the KV cache, CUDA graphs and weights (the engine is
  started with ``enable_memory_saver=True``).
- ``wake``: resumes the weights' memory only. SGLang keeps no CPU copy of the weights (unless
  ``enable_weights_cpu_backup``), so until ``load_weights`` has carried every weight again the
  memory holds garbage: ``generate`` refuses until then (``WeightLedger``). The KV cache and CUDA
  graphs are resumed by the next ``generate``, after the weights are loaded, which keeps the peak
  lower while the trainer's gathered tensors are still alive.
- ``load_weights``: one SGLang weight-update session (``begin_weight_update``, then
  ``update_weights_from_tensor`` per bucket of about ``weight_bucket_mb`` without flushing, then
  ``end_weight_update``); SGLang refuses an update outside a session. The prefix cache is flushed
  once, before the next generate. A bucket stays referenced until SGLang has returned from it.
- Every SGLang response that carries a success flag goes through ``check_success``: a False raises.
- memory: ``rollout.mem_fraction_static`` is the share of the whole device the engine may hold
  (weights + KV cache). SGLang's own ``mem_fraction_static`` is a share of the memory free when it
  starts, so the engine converts one into the other (``sglang_mem_fraction``) and refuses a share
  that no longer fits beside what the trainer holds.

Not covered: tensor parallelism across training processes (``tp_size > 1`` with ``trainer.nproc > 1``
would start overlapping engines; the config refuses it), ``logit_bias`` and ``top_logprobs``
(refused; stop strings and penalties are sent as SGLang's own keys, untested on a GPU here), and
bit-for-bit agreement with the native engine (different kernels; the GPU test compares within a
tolerance).
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import warnings
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from fastcrit.types import Rollout, SamplingParams

_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}

# sglang.Engine arguments the engine sets itself; rollout.engine_args may not override them.
_OWN_ARGS = {
    "model_path": "model.path",
    "dtype": "model.dtype",
    "tp_size": "rollout.tp_size",
    "base_gpu_id": "the trainer's device",
    "mem_fraction_static": "rollout.mem_fraction_static",
    "skip_tokenizer_init": "nothing (the engine sends and reads token ids only)",
    "enable_memory_saver": "nothing (sleep / wake need it)",
}


# ---------------------------------------------------------------------------------------- pure pieces


def request_params(
    params: SamplingParams, count: int, stop_ids: Iterable[int], deterministic: bool
) -> dict | list[dict]:
    """SGLang ``sampling_params`` for ``count`` requests of one sample each (``n=1``).

    ``stop_token_ids`` = ``stop_ids`` (the model's EOS set) | ``params.stop_token_ids``. A seed
    becomes ``sampling_seed = seed + k`` for request ``k`` (one list entry per request) only when
    ``deterministic``: SGLang ignores it otherwise. Without a seed, one dict serves the whole batch.
    The temperature is sent as it is: SGLang applies the same greedy rule as fastcrit.types.is_greedy.
    """
    base: dict[str, Any] = {
        "n": 1,
        "max_new_tokens": int(params.max_new_tokens),
        "temperature": float(params.temperature),
        "top_p": float(params.top_p),
        "top_k": int(params.top_k),
        "stop_token_ids": sorted({int(t) for t in stop_ids} | {int(t) for t in params.stop_token_ids}),
    }
    # SGLang's own keys for stop strings and penalties (sampling/sampling_params.py), sent only when
    # set so that an unset one leaves SGLang's default
    if params.stop:
        base["stop"] = list(params.stop)
    for name, off in (("presence_penalty", 0.0), ("frequency_penalty", 0.0), ("repetition_penalty", 1.0)):
        if getattr(params, name) != off:
            base[name] = float(getattr(params, name))
    if params.logit_bias or params.top_logprobs:
        raise ValueError(
            "SamplingParams.logit_bias and top_logprobs are not forwarded to SGLang by this engine; "
            "the native engine implements them"
        )
    if params.seed is None or not deterministic:
        return base
    seed = int(params.seed)
    if not (0 <= seed and seed + count - 1 < 2**63):
        # SGLang refuses a sampling_seed outside int64 (0.5.23 sampling/sampling_params.py:302-312)
        # and would fail the whole batch; say which seed did it instead.
        raise ValueError(
            f"seed {seed} + request index (up to {count - 1}) must stay in [0, 2**63): "
            "SGLang holds sampling_seed in an int64"
        )
    return [{**base, "sampling_seed": seed + k} for k in range(count)]


def finish_reason(meta: dict) -> str:
    """``"stop"`` or ``"length"`` from an output's ``meta_info``; anything else raises.

    SGLang reports ``{"type": "stop" | "length" | "abort", ...}``; an aborted request (its message
    says why, e.g. the scheduler ran out of memory or the request was cancelled) is not a sample.
    """
    fr = meta.get("finish_reason")
    kind = fr.get("type") if isinstance(fr, dict) else fr
    if kind in ("stop", "length"):
        return kind
    if kind == "abort":
        msg = fr.get("message") if isinstance(fr, dict) else None
        raise RuntimeError(f"SGLang aborted a request: {msg or 'no message'} ({fr!r})")
    raise RuntimeError(f"SGLang returned an output that did not finish: finish_reason={fr!r}")


def to_rollout(prompt_index: int, prompt_ids: list[int], out: dict) -> Rollout:
    """One SGLang output (``return_logprob=True``) as a Rollout; token ids and log-probs come from
    the same (logprob, token_id, text) triples, checked against ``output_ids`` when present."""
    meta = out["meta_info"]
    triples = meta["output_token_logprobs"]
    ids = [int(t[1]) for t in triples]
    if "output_ids" in out and list(out["output_ids"]) != ids:
        raise RuntimeError(
            f"SGLang output for prompt {prompt_index}: output_ids ({len(out['output_ids'])} "
            f"tokens) and output_token_logprobs ({len(ids)} tokens) disagree"
        )
    return Rollout(
        prompt_index=prompt_index,
        prompt_ids=list(prompt_ids),
        output_ids=ids,
        logprobs=[float(t[0]) for t in triples],
        finish_reason=finish_reason(meta),
    )


def check_success(result: Any, what: str) -> str:
    """Raise RuntimeError when an SGLang response's success flag is False; return its message.

    ``result`` is a ``(success, message)`` tuple (``begin_weight_update``, ``end_weight_update``,
    ``update_weights_from_tensor``) or an object with ``.success`` and ``.message`` (``flush_cache``
    returns a FlushCacheReqOutput). Anything else is a TypeError: the API changed under us.
    """
    if isinstance(result, tuple) and len(result) >= 2 and isinstance(result[0], bool):
        ok, msg = result[0], result[1]
    elif hasattr(result, "success"):
        ok, msg = result.success, getattr(result, "message", "")
    else:
        raise TypeError(
            f"SGLang {what}: expected a (success, message) pair or an object with .success, "
            f"got {type(result).__name__} {result!r}"
        )
    if not isinstance(ok, bool):
        raise TypeError(f"SGLang {what}: success flag {ok!r} is not a bool")
    if not ok:
        raise RuntimeError(f"SGLang {what} failed: {msg}")
    return str(msg)


def buckets(named: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Group tensors into lists of about ``bucket_bytes`` (a tensor larger than that is a bucket of
    its own; each tensor in exactly one bucket, order kept). Lazy: a bucket is built only when the
    previous one has been consumed."""
    if bucket_bytes < 1:
        raise ValueError(f"buckets: bucket_bytes={bucket_bytes} must be >= 1")
    cur: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, t in named:
        nbytes = t.numel() * t.element_size()
        if cur and size + nbytes > bucket_bytes:
            yield cur
            cur, size = [], 0
        cur.append((name, t))
        size += nbytes
    if cur:
        yield cur


def sglang_mem_fraction(share_of_device: float, free_bytes: int, total_bytes: int) -> float:
    """SGLang's ``mem_fraction_static`` that gives the engine ``share_of_device`` of the whole device.

    SGLang sizes its static memory (weights + KV cache) as ``mem_fraction_static`` times the memory
    free when it starts (0.5.23 mem_cache/kv_cache_configurator.py:2990-3010: KV budget = free after
    loading - free before loading * (1 - mem_fraction_static)). Started beside a trainer that already
    holds memory, the same number would give it less; so ask for share * total / free. The rest of
    the free memory is SGLang's headroom for activations and CUDA graphs. Raises when the share does
    not fit in what is free.
    """
    if not 0.0 < share_of_device < 1.0:
        raise ValueError(f"rollout.mem_fraction_static={share_of_device} must be in (0, 1)")
    want, free = share_of_device * total_bytes, float(free_bytes)
    if want >= free:
        gib = 1 << 30
        raise RuntimeError(
            f"rollout.mem_fraction_static={share_of_device} asks for {want / gib:.1f} GiB of the device's "
            f"{total_bytes / gib:.1f} GiB, but only {free / gib:.1f} GiB is free (the trainer or another "
            "engine holds the rest): lower rollout.mem_fraction_static, or shard the trainer over more "
            "processes"
        )
    return want / free


class WeightLedger:
    """Whether the engine's weights hold values, so that generate never reads released memory.

    After ``woke()`` (weights resumed without a CPU backup) the weights are invalid until
    ``loaded()`` calls since then have carried every name any earlier load carried (the trainer's
    sync sends the full set each time), and at least one load; a ``failed()`` update (SGLang leaves
    the weights partly updated) invalidates them the same way. With ``restores_on_wake`` (SGLang's
    ``enable_weights_cpu_backup``) a wake keeps them valid. Not covered: a first load that carries
    only part of the model, then a wake, then a load of that same part — the ledger only knows the
    names it has seen.
    """

    def __init__(self, restores_on_wake: bool = False):
        self.restores_on_wake = restores_on_wake
        self.known: set[str] = set()
        self.since_wake: set[str] = set()
        self.valid = True

    def woke(self) -> None:
        if not self.restores_on_wake:
            self.valid, self.since_wake = False, set()

    def failed(self) -> None:
        self.valid, self.since_wake = False, set()

    def loaded(self, names: Iterable[str]) -> None:
        names = set(names)
        self.known |= names
        self.since_wake |= names
        if not self.valid and self.since_wake and self.since_wake >= self.known:
            self.valid = True

    def missing(self) -> list[str]:
        return sorted(self.known - self.since_wake)


def nccl_env(engine_args: dict, environ: dict) -> dict[str, str]:
    """The NCCL variables ``sglang.Engine(**engine_args)`` will set in its process, those that
    ``environ`` (the process environment) does not hold yet: export them in every rank before its
    process group starts, so the trainer's NCCL communicators and the engine's see the same values.

    ``sglang.Engine`` sets them in its constructor (0.5.23 entrypoints/engine.py:1878-1914,
    ``_set_envs_and_config``, called at :1155): ``NCCL_CUMEM_ENABLE = int(enable_symm_mem or
    kv_shard_symmetric_scratch)`` when unset or with ``enable_symm_mem``; ``NCCL_NVLS_ENABLE =
    int(enable_nccl_nvls or enable_symm_mem)`` when unset or with either flag. That happens only in
    a rank that builds an engine, and after the rank's first NCCL collective (the SFT warm start and
    the trainer run first), which reads its settings once. ``kv_shard_symmetric_scratch`` needs
    ``enable_memory_saver`` off, and this engine always turns it on, so it is False here. A value the
    user set is kept; where SGLang would overwrite it (``enable_symm_mem`` / ``enable_nccl_nvls``
    asking for another value), that contradiction raises ValueError. Not mirrored: SGLang's
    multi-node MNNVL default (:1884-1886, engines spanning nodes) and the MoE ``deepep_v2`` backend's
    (arg_groups/moe_hook.py:400-402); fastcrit's engines live on one rank's devices."""
    symm = bool(engine_args.get("enable_symm_mem", False))
    nvls = bool(engine_args.get("enable_nccl_nvls", False))
    wanted = {}
    if "NCCL_CUMEM_ENABLE" not in environ or symm:
        wanted["NCCL_CUMEM_ENABLE"] = str(int(symm))
    if "NCCL_NVLS_ENABLE" not in environ or nvls or symm:
        wanted["NCCL_NVLS_ENABLE"] = str(int(nvls or symm))
    for key, value in wanted.items():
        if key in environ and environ[key] != value:
            flags = "enable_symm_mem" if key == "NCCL_CUMEM_ENABLE" else "enable_nccl_nvls / enable_symm_mem"
            raise ValueError(
                f"the environment has {key}={environ[key]}, but SGLang sets {key}={value} with "
                f"engine_args {flags} (0.5.23 entrypoints/engine.py:1897-1914); unset it or "
                "drop that engine argument"
            )
    return {k: v for k, v in wanted.items() if k not in environ}


def keep_signal(loop: asyncio.AbstractEventLoop, sig: int, handler) -> None:
    """Take ``sig`` back from an asyncio ``loop`` that registered its own handler for it
    (``loop.add_signal_handler``) and give it to ``handler`` (what ``signal.getsignal`` returned
    before). ``remove_signal_handler`` alone would leave the signal's default action."""
    loop.remove_signal_handler(sig)
    signal.signal(sig, handler)


def engine_tensor(name: str, t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A full tensor on ``device`` for SGLang (CUDA IPC hands it over without a copy); a sharded
    DTensor is refused: gathering is a collective, which stays in train/."""
    if hasattr(t, "full_tensor"):  # a DTensor, told apart without torch.distributed
        raise TypeError(
            f"SGLangEngine.load_weights: {name!r} is a sharded DTensor; the engine takes full "
            "tensors (gather them in train/, e.g. with "
            "fastcrit.train.policy.full_named_tensors, on every rank)"
        )
    t = t.detach()
    return t if t.device == device else t.to(device, non_blocking=True)


# ---------------------------------------------------------------------------------------- the engine


class SGLangEngine:
    """``rollout`` (fastcrit.config.RolloutConfig, its defaults when None) gives tp_size,
    mem_fraction_static, weight_bucket_mb and engine_args (extra ``sglang.Engine`` arguments, by
    their ServerArgs names, e.g. ``enable_deterministic_inference``); ``engine_kwargs`` are added on
    top of ``rollout.engine_args``."""

    def __init__(
        self,
        model_path: str,
        rollout=None,
        *,
        dtype: str | torch.dtype = "bfloat16",
        device: str | torch.device = "cuda",
        seed: int = 0,
        load_format: str = "auto",
        attention_backend: str | None = None,
        disable_cuda_graph: bool = False,
        **engine_kwargs,
    ):
        from fastcrit.config import RolloutConfig
        from fastcrit.models.hf import model_eos_token_ids, parse_dtype, resolve_model_path

        rollout = rollout or RolloutConfig()
        extra = {**rollout.engine_args, **engine_kwargs}
        for key in extra:
            if key in _OWN_ARGS:
                raise ValueError(f"rollout.engine_args: {key!r} is set by the engine; use {_OWN_ARGS[key]}")
        try:
            import sglang
        except ImportError as exc:
            raise ImportError(
                "rollout.engine=sglang needs the sglang package (pip install 'fastcrit[gpu]'); "
                "on a machine without a GPU use rollout.engine=native"
            ) from exc
        if not torch.cuda.is_available():
            raise RuntimeError(
                "rollout.engine=sglang needs a CUDA GPU; this machine has none (use rollout.engine=native)"
            )
        device = torch.device(device)
        if device.type != "cuda":
            raise ValueError(f"SGLangEngine: device must be a CUDA device, got {device}")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        if rollout.weight_bucket_mb < 1:
            raise ValueError(f"SGLangEngine: weight_bucket_mb={rollout.weight_bucket_mb} must be >= 1")
        if device.index + rollout.tp_size > torch.cuda.device_count():
            raise ValueError(
                f"rollout.tp_size={rollout.tp_size} from GPU {device.index} needs GPUs "
                f"{device.index}..{device.index + rollout.tp_size - 1}; this machine has "
                f"{torch.cuda.device_count()}"
            )
        if "expandable_segments:True" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""):
            warnings.warn(
                "PYTORCH_CUDA_ALLOC_CONF has expandable_segments:True, which interferes with "
                "SGLang's memory saver (sleep / wake); unset it for colocated training",
                stacklevel=1,
            )
        path = resolve_model_path(model_path)
        self._stop_ids = model_eos_token_ids(path)
        # Blocks this process caches but no longer uses count as used in SGLang's processes.
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info(device)
        kwargs = dict(
            model_path=path,
            dtype=_DTYPE_NAMES[parse_dtype(dtype)],
            tp_size=rollout.tp_size,
            base_gpu_id=device.index,
            mem_fraction_static=sglang_mem_fraction(rollout.mem_fraction_static, free, total),
            enable_memory_saver=True,
            random_seed=seed,
            load_format=load_format,
            skip_tokenizer_init=True,  # we send and receive token ids only
            disable_cuda_graph=disable_cuda_graph,
            log_level="error",
        )
        if attention_backend is not None:
            kwargs["attention_backend"] = attention_backend
        kwargs.update(extra)
        self._deterministic = bool(kwargs.get("enable_deterministic_inference", False))
        self._ledger = WeightLedger(restores_on_wake=bool(kwargs.get("enable_weights_cpu_backup", False)))
        sigterm = signal.getsignal(signal.SIGTERM)
        self._engine = sglang.Engine(**kwargs)
        # SGLang's TokenizerManager, which runs in this process, takes SIGTERM over when its event loop
        # starts (at the first engine call: 0.5.23 managers/tokenizer_manager.py:2440-2463) and on it
        # shuts the engine down and exits the process (:3508-3571). The trainer decides what SIGTERM
        # does (finish the step, save: fastcrit.train.preempt), so start that loop now, on the
        # engine's own event loop, and give SIGTERM back.
        tm = self._engine.tokenizer_manager

        async def _start_handle_loop():
            tm.auto_create_handle_loop()

        if tm is not None and threading.current_thread() is threading.main_thread():
            self._engine.loop.run_until_complete(_start_handle_loop())
            keep_signal(self._engine.loop, signal.SIGTERM, sigterm)
        self._bucket_bytes = rollout.weight_bucket_mb << 20
        self.device = device
        self._asleep = False
        self._kv_released = False
        self._needs_flush = False
        self._closed = False
        self._warned_seed = False

    # ------------------------------------------------------------------ Engine protocol

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Rollout]:
        self._check("generate")
        if self._asleep:
            raise RuntimeError("SGLangEngine.generate: the engine is asleep; call wake() first")
        if params.n < 1 or params.max_new_tokens < 1:
            raise ValueError(f"SamplingParams: n={params.n} and max_new_tokens={params.max_new_tokens} must be >= 1")
        for i, p in enumerate(prompts):
            if len(p) == 0:
                raise ValueError(f"prompt {i} is empty; a prompt needs at least one token")
        if not prompts:
            return []
        if not self._ledger.valid:
            missing = self._ledger.missing()
            raise RuntimeError(
                "SGLangEngine.generate: the weights were released by sleep() and wake() gave back their memory "
                "without their values (SGLang keeps no CPU copy unless rollout.engine_args has "
                "enable_weights_cpu_backup: true); load the full set with load_weights first"
                + (f" (not loaded since: {missing[:5]}{' ...' if len(missing) > 5 else ''})" if missing else "")
            )
        if self._kv_released:
            # the weight sync's buckets are cached blocks of this process's allocator now, which
            # the scheduler process (where SGLang resumes) cannot use
            torch.cuda.empty_cache()
            self._engine.resume_memory_occupation(tags=["kv_cache", "cuda_graph"])  # returns None
            self._kv_released = False
        if self._needs_flush:
            check_success(self._engine.flush_cache(), "flush_cache")
            self._needs_flush = False
        if params.seed is not None and not self._deterministic and not self._warned_seed:
            warnings.warn(
                "SamplingParams.seed is ignored: SGLang reads sampling_seed only with "
                "enable_deterministic_inference (set rollout.engine_args.enable_deterministic_inference"
                "=true, slower); this run's samples are not reproducible",
                stacklevel=1,
            )
            self._warned_seed = True
        ids = [list(p) for p in prompts for _ in range(params.n)]
        sampling = request_params(params, len(ids), self._stop_ids, self._deterministic)
        outs = self._engine.generate(input_ids=ids, sampling_params=sampling, return_logprob=True)
        if len(outs) != len(ids):
            raise RuntimeError(f"SGLang returned {len(outs)} outputs for {len(ids)} requests")
        return [to_rollout(k // params.n, ids[k], out) for k, out in enumerate(outs)]

    def sleep(self) -> None:
        self._check("sleep")
        if self._asleep:
            return
        tags = ["weights"] if self._kv_released else ["kv_cache", "weights", "cuda_graph"]
        self._engine.release_memory_occupation(tags=tags)  # returns None
        self._asleep = self._kv_released = True

    def wake(self) -> None:
        self._check("wake")
        if not self._asleep:
            return
        torch.cuda.empty_cache()  # as in generate: the scheduler cannot use this process's cached blocks
        self._engine.resume_memory_occupation(tags=["weights"])  # returns None
        self._ledger.woke()
        self._asleep = False

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """One weight-update session over all of ``named_tensors`` (pass the full set after a wake).

        On any failure the session is closed, the weights count as invalid until a full load, and
        the error is raised."""
        self._check("load_weights")
        if self._asleep:
            raise RuntimeError("SGLangEngine.load_weights: the engine is asleep; call wake() first")
        check_success(self._engine.begin_weight_update(), "begin_weight_update")
        names: set[str] = set()
        try:
            on_device = (engine_tensor(n, t, self.device) for n, t in named_tensors)
            for bucket in buckets(on_device, self._bucket_bytes):
                torch.cuda.synchronize(self.device)  # the copies must land before another process reads them
                check_success(
                    self._engine.update_weights_from_tensor(bucket, flush_cache=False), "update_weights_from_tensor"
                )
                names.update(n for n, _ in bucket)
        except BaseException:
            self._ledger.failed()
            try:
                self._engine.end_weight_update()  # close the session; the first error is the one to report
            except Exception:
                pass
            raise
        check_success(self._engine.end_weight_update(), "end_weight_update")
        self._ledger.loaded(names)
        self._needs_flush = True

    def close(self) -> None:
        if not self._closed:
            self._engine.shutdown()
            self._closed = True

    # ------------------------------------------------------------------ internals

    def _check(self, what: str) -> None:
        if self._closed:
            raise RuntimeError(f"SGLangEngine.{what}: the engine is closed")
