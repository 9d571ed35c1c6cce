"""The SGLang rollout engine (GPU only): the Engine protocol over SGLang's offline ``sglang.Engine``.

This is the only module that imports sglang, and it does so inside ``SGLangEngine.__init__``, so
importing this file costs nothing on a machine without it.

How the protocol maps onto SGLang 0.5.23:

- ``generate``: each prompt is sent ``n`` times with ``n=1`` (rather than SGLang's own ``n``), which
  pins the output order to prompt-major without relying on how SGLang orders parallel samples;
  SGLang's radix cache still prefills a shared prompt once. Token ids and log-probs come together
  from ``meta_info["output_token_logprobs"]`` ((logprob, token_id, text) triples), which SGLang
  computes as log_softmax(logits / T) before top-k / top-p, the convention of fastcrit.types.Rollout.
  With ``SamplingParams.seed`` set, request ``k`` gets ``sampling_seed = seed + k``.
- ``sleep``: ``release_memory_occupation`` of the KV cache, CUDA graphs and weights (the engine is
  started with ``enable_memory_saver=True``).
- ``wake``: resumes the weights only. The KV cache and CUDA graphs are resumed by the next
  ``generate``, after ``load_weights`` has run, which keeps the peak lower while the trainer's
  gathered tensors are still alive (resume weights, sync, then resume the KV cache).
- ``load_weights``: tensors are regrouped into buckets of about ``weight_bucket_mb`` (512 MiB by
  default; one call per tensor is slow) and each bucket goes through ``update_weights_from_tensor``
  without flushing; the prefix cache is flushed once, before the next generate. A bucket stays
  referenced until SGLang has returned from consuming it.

Not covered: tensor parallelism across processes that each hold a shard (every rank here passes full
tensors), stop strings (only stop token ids), and bit-for-bit agreement with the native engine
(different kernels; the GPU test compares within a tolerance).
"""
from __future__ import annotations

import os
import warnings
from typing import Iterable

import torch

from fastcrit.types import Rollout, SamplingParams

_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


class SGLangEngine:
    """``rollout`` (fastcrit.config.RolloutConfig, its defaults when None) gives tp_size,
    mem_fraction_static and weight_bucket_mb; ``engine_kwargs`` go to ``sglang.Engine`` as they are."""

    def __init__(self, model_path: str, rollout=None, *, dtype: str | torch.dtype = "bfloat16",
                 device: str | torch.device = "cuda", seed: int = 0, load_format: str = "auto",
                 attention_backend: str | None = None, disable_cuda_graph: bool = False, **engine_kwargs):
        from fastcrit.config import RolloutConfig
        from fastcrit.models.hf import parse_dtype, resolve_model_path

        rollout = rollout or RolloutConfig()
        tp_size, weight_bucket_mb = rollout.tp_size, rollout.weight_bucket_mb
        mem_fraction_static = rollout.mem_fraction_static

        try:
            import sglang
        except ImportError as exc:
            raise ImportError("rollout.engine=sglang needs the sglang package (pip install 'fastcrit[gpu]'); "
                              "on a machine without a GPU use rollout.engine=native") from exc
        if not torch.cuda.is_available():
            raise RuntimeError("rollout.engine=sglang needs a CUDA GPU; this machine has none "
                               "(use rollout.engine=native)")
        device = torch.device(device)
        if device.type != "cuda":
            raise ValueError(f"SGLangEngine: device must be a CUDA device, got {device}")
        if weight_bucket_mb < 1:
            raise ValueError(f"SGLangEngine: weight_bucket_mb={weight_bucket_mb} must be >= 1")
        if "expandable_segments:True" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""):
            warnings.warn("PYTORCH_CUDA_ALLOC_CONF has expandable_segments:True, which interferes with "
                          "SGLang's memory saver (sleep / wake); unset it for colocated training")
        path = resolve_model_path(model_path)
        kwargs = dict(
            model_path=path,
            dtype=_DTYPE_NAMES[parse_dtype(dtype)],
            tp_size=tp_size,
            base_gpu_id=device.index if device.index is not None else torch.cuda.current_device(),
            mem_fraction_static=mem_fraction_static,
            enable_memory_saver=True,
            random_seed=seed,
            load_format=load_format,
            skip_tokenizer_init=True,  # we send and receive token ids only
            disable_cuda_graph=disable_cuda_graph,
            log_level="error",
        )
        if attention_backend is not None:
            kwargs["attention_backend"] = attention_backend
        kwargs.update(engine_kwargs)
        self._engine = sglang.Engine(**kwargs)
        self._bucket_bytes = weight_bucket_mb << 20
        self.device = device
        self._asleep = False
        self._kv_released = False
        self._needs_flush = False
        self._closed = False

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
        if self._kv_released:
            self._engine.resume_memory_occupation(tags=["kv_cache", "cuda_graph"])
            self._kv_released = False
        if self._needs_flush:
            self._engine.flush_cache()
            self._needs_flush = False
        ids = [list(p) for p in prompts for _ in range(params.n)]
        base = {"n": 1, "max_new_tokens": params.max_new_tokens, "temperature": params.temperature,
                "top_p": params.top_p, "top_k": params.top_k, "stop_token_ids": list(params.stop_token_ids)}
        if params.seed is None:
            sampling = base
        else:
            sampling = [{**base, "sampling_seed": int(params.seed) + k} for k in range(len(ids))]
        outs = self._engine.generate(input_ids=ids, sampling_params=sampling, return_logprob=True)
        if len(outs) != len(ids):
            raise RuntimeError(f"SGLang returned {len(outs)} outputs for {len(ids)} requests")
        rollouts = []
        for k, out in enumerate(outs):
            meta = out["meta_info"]
            triples = meta["output_token_logprobs"]
            finish = meta.get("finish_reason") or {}
            kind = finish.get("type") if isinstance(finish, dict) else str(finish)
            rollouts.append(Rollout(
                prompt_index=k // params.n, prompt_ids=ids[k],
                output_ids=[int(t[1]) for t in triples], logprobs=[float(t[0]) for t in triples],
                finish_reason="length" if kind == "length" else "stop"))
        return rollouts

    def sleep(self) -> None:
        self._check("sleep")
        if self._asleep:
            return
        tags = ["weights"] if self._kv_released else ["kv_cache", "weights", "cuda_graph"]
        self._engine.release_memory_occupation(tags=tags)
        self._asleep = self._kv_released = True

    def wake(self) -> None:
        self._check("wake")
        if not self._asleep:
            return
        self._engine.resume_memory_occupation(tags=["weights"])
        self._asleep = False

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        self._check("load_weights")
        if self._asleep:
            raise RuntimeError("SGLangEngine.load_weights: the engine is asleep; call wake() first")
        bucket: list[tuple[str, torch.Tensor]] = []
        size = 0
        for name, t in named_tensors:
            if hasattr(t, "full_tensor"):  # a DTensor: gathering it is a collective, which stays in train/
                raise TypeError(f"SGLangEngine.load_weights: {name!r} is a sharded DTensor; the engine takes "
                                "full tensors (gather them in train/, e.g. with "
                                "fastcrit.train.policy.full_named_tensors, on every rank)")
            t = t.detach()
            if t.device.type != "cuda":  # CUDA IPC hands the tensor over without a copy
                t = t.to(self.device, non_blocking=True)
            nbytes = t.numel() * t.element_size()
            if bucket and size + nbytes > self._bucket_bytes:
                self._push(bucket)
                bucket, size = [], 0
            bucket.append((name, t))
            size += nbytes
        if bucket:
            self._push(bucket)

    def close(self) -> None:
        if not self._closed:
            self._engine.shutdown()
            self._closed = True

    # ------------------------------------------------------------------ internals

    def _push(self, bucket: list[tuple[str, torch.Tensor]]) -> None:
        torch.cuda.synchronize(self.device)  # the copies above must land before another process reads them
        self._engine.update_weights_from_tensor(bucket, flush_cache=False)
        self._needs_flush = True

    def _check(self, what: str) -> None:
        if self._closed:
            raise RuntimeError(f"SGLangEngine.{what}: the engine is closed")

