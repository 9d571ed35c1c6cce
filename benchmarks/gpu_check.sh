#!/usr/bin/env bash
# fastcrit on one CUDA GPU, in one call: what a machine without a GPU cannot run.
#
#   bash benchmarks/gpu_check.sh                  # every step
#   STEPS="tests grpo" bash benchmarks/gpu_check.sh
#
# Steps: env (GPU, versions), realsize (GRPO on a Qwen2.5-1.5B-architecture model with random bf16
# weights: FSDP2, activation checkpointing, the CUDA-graph engine; `fastcrit plan`'s prediction
# beside each phase's measured peak, tokens/s/GPU, sync s/GiB, and a second process allocating what
# the trainer gave back: benchmarks/gpu_realsize.py), tests (the kernel tests with the compiled Triton kernels, the gpu-marked
# engine and Liger tests), kernels (fused linear loss and fused log-probs against naive and three plain
# GEMMs, fp32 and bf16 at H 896 and 3584, and Liger's fused GRPO loss), generate (native engine, eager and CUDA-graph decode, against HF generate),
# grpo (a short GRPO run of configs/cpu/grpo.yaml on the GPU: bf16 mixed precision through FSDP2 on
# NCCL, Liger patches, CUDA-graph rollout), grpo_fp32 (a shorter fp32 run: the plain module with
# torch's fused AdamW on CUDA, exact-fp32 log-probs through the torch path), ppo (configs/cpu/ppo.yaml's reward model, then a short
# PPO run with the value critic, both bf16 on the GPU), recipes (PACS, RARO and CTRL, fp32, 10 steps each;
# CTRL needs the demo's coder, synthesis and critic SFT under runs/). They run in the order of what matters most, each under
# its own time limit and all under DEADLINE seconds (default 480: a step gets what is left, none
# starts with under 15 s); its exit code and time are printed at the end. Everything a step prints goes to $OUT/gpu_check.log (default
# runs/gpu_check), with the benchmarks' CSV rows and the run's metrics beside it.
#
# It uses the python3 on PATH as it is (torch with CUDA, triton, transformers, tokenizers,
# safetensors, pyyaml, numba, pytest, pytest-xdist; liger-kernel for the Liger checks) with the source
# tree on PYTHONPATH: nothing is installed, except that CTRL's sandbox workers (which start without
# PYTHONPATH) get a path file in site-packages where fastcrit is not installed. SGLang and flash-attn are not used.
set -u
OUT=${OUT:-runs/gpu_check}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export PYTHONPATH="$PWD:$PWD/kernels${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export FASTCRIT_CACHE=${FASTCRIT_CACHE:-/tmp/fastcrit_cache}
PY=${PY:-python3}
STEPS=${STEPS:-env realsize tests grpo grpo_fp32 recipes ppo kernels generate}
DEADLINE=${DEADLINE:-480}
LOG="$OUT/gpu_check.log"
RUN=/tmp/fastcrit_gpu_grpo
PPO=/tmp/fastcrit_gpu_ppo
summary=()
CSVS="bench_ppo fused_logprobs bench_generate"
declare -A before  # rows each results CSV had at the start: the rows after them are this run's
for f in $CSVS; do before[$f]=$(cat "benchmarks/results/$f.csv" 2>/dev/null | wc -l); done

step() {  # step NAME LIMIT_S CMD...: run, log, keep the tail for the end
  local name=$1 limit=$2 t0=$SECONDS rc
  shift 2
  if ((DEADLINE - SECONDS < 15)); then
    summary+=("$(printf '%-28s skipped: the deadline' "$name")")
    return
  fi
  ((limit > DEADLINE - SECONDS)) && limit=$((DEADLINE - SECONDS))
  echo "=== $name (limit ${limit}s): $*" | tee -a "$LOG"
  timeout "$limit" "$@" >"$OUT/.step" 2>&1
  rc=$?
  cat "$OUT/.step" >>"$LOG"
  tail -n "${TAIL:-12}" "$OUT/.step" | cut -c1-220
  summary+=("$(printf '%-28s rc=%-3s %4ss' "$name" "$rc" "$((SECONDS - t0))")")
}

has() { [[ " $STEPS " == *" $1 "* ]]; }

# Liger's patches where liger-kernel is installed; the runs go on without them where it is not
LIGER=$("$PY" -c "import importlib.util; print('true' if importlib.util.find_spec('liger_kernel') else 'false')" 2>/dev/null || echo false)

if has env; then
  step gpu 20 nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv
  step versions 60 "$PY" -c "
import torch, triton, transformers
print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__,
      'transformers', transformers.__version__, torch.cuda.get_device_name(0))
try:
    import liger_kernel, importlib.metadata as m; print('liger-kernel', m.version('liger-kernel'))
except ImportError as e:
    print('liger-kernel missing:', e)
from fastcrit.models.hf import resolve_model_path
for spec in ('tiny', 'tiny:hidden=64,layers=2,heads=2,kv_heads=1,intermediate=128'):
    print(spec, '->', resolve_model_path(spec))  # built once here, before pytest's workers race for it
"
fi

if has realsize; then  # a Qwen2.5-1.5B-architecture model: the plan against measured memory
  TAIL=30 step realsize "${REALSIZE_LIMIT:-300}" "$PY" benchmarks/gpu_realsize.py --out "$OUT"
fi

if has tests; then
  TAIL=6 step tests_kernels 240 "$PY" -m pytest -q -ra -p no:cacheprovider -n 8 tests/kernels
  TAIL=8 step tests_engine_liger 120 "$PY" -m pytest -q -ra -p no:cacheprovider -n 4 \
    tests/rollout/test_native.py tests/models/test_liger.py tests/train/test_memory.py \
    tests/train/test_actor.py::test_a_plain_module_steps_with_fused_adamw_like_foreach
fi

if has grpo; then
  rm -rf "$RUN"
  TAIL=15 step grpo_bf16_fsdp2_cudagraph 180 "$PY" -m fastcrit.cli train configs/cpu/grpo.yaml \
    --set trainer.device=cuda --set model.dtype=bfloat16 --set model.liger=$LIGER --set rollout.engine_args.cuda_graph=true \
    --set trainer.total_steps=30 --set trainer.eval_every=15 --set trainer.save_every=30 \
    --set "trainer.output_dir=$RUN"
  for f in metrics.jsonl summary.json; do [ -f "$RUN/$f" ] && cp "$RUN/$f" "$OUT/grpo_$f"; done
fi

if has grpo_fp32; then
  rm -rf "$RUN"_fp32
  TAIL=10 step grpo_fp32_plain_fused_adamw 120 "$PY" -m fastcrit.cli train configs/cpu/grpo.yaml \
    --set trainer.device=cuda --set trainer.total_steps=10 --set trainer.eval_every=10 \
    --set trainer.save_every=10 --set "trainer.output_dir=$RUN"_fp32
  for f in metrics.jsonl summary.json; do [ -f "$RUN"_fp32/$f ] && cp "$RUN"_fp32/$f "$OUT/grpo_fp32_$f"; done
fi

if has recipes; then  # the other recipes on the GPU (fp32): a few steps each, start and end evaluated
  gpu=(--set trainer.device=cuda --set trainer.total_steps=10 --set trainer.save_every=10 --set trainer.eval_every=10)
  RECIPES=${RECIPES:-pacs raro ctrl}
  for algo in pacs raro; do
    [[ " $RECIPES " == *" $algo "* ]] || continue
    rm -rf "/tmp/fastcrit_gpu_$algo"
    TAIL=8 step "${algo}_fp32" 120 "$PY" -m fastcrit.cli train "configs/cpu/$algo.yaml" "${gpu[@]}" \
      --set "trainer.output_dir=/tmp/fastcrit_gpu_$algo"
    [ -f "/tmp/fastcrit_gpu_$algo/summary.json" ] && cp "/tmp/fastcrit_gpu_$algo/summary.json" "$OUT/${algo}_summary.json"
  done
  # CTRL needs the demo's coder (runs/cpu-coder/final) and, to skip stage 1 and the critic's SFT,
  # runs/cpu-ctrl/{synth,sft}: carry them from a machine that ran `make ctrl-demo`
  # CTRL's sandbox refuses to run without its native jail: carry fastcrit/sandbox/_native/bin or
  # let cmake build it here
  jail=fastcrit/sandbox/_native/bin/fastcrit-jail
  if [[ " $RECIPES " == *" ctrl "* ]] && [ ! -x "$jail" ] && command -v cmake >/dev/null; then
    cmake -S . -B /tmp/fastcrit_native -DCMAKE_BUILD_TYPE=Release >/dev/null &&
      cmake --build /tmp/fastcrit_native -j 4 >/dev/null &&
      cmake --install /tmp/fastcrit_native --prefix fastcrit/sandbox/_native >/dev/null
  fi
  if [[ " $RECIPES " != *" ctrl "* ]]; then
    :
  elif [ -f runs/cpu-coder/final/COMPLETE ]; then
    # the sandbox's workers start with a scrubbed environment (no PYTHONPATH): where fastcrit is not
    # installed, a path file in the interpreter's site-packages lets them import it
    if ! env -i PATH=/usr/bin:/bin "$(command -v "$PY")" -c "import fastcrit.sandbox.workers" 2>/dev/null; then
      sp=$("$PY" -c "import site; print(site.getsitepackages()[0])")
      echo "$PWD" >"$sp/fastcrit_src.pth" && echo "added $sp/fastcrit_src.pth -> $PWD" | tee -a "$LOG"
    fi
    rm -rf /tmp/fastcrit_gpu_ctrl
    TAIL=10 step ctrl_fp32 150 "$PY" -m fastcrit.cli train configs/cpu/ctrl.yaml "${gpu[@]}" \
      --set data.val_size=100 --set ctrl.synth_dir=runs/cpu-ctrl/synth --set sft.output_dir=runs/cpu-ctrl/sft \
      --set trainer.output_dir=/tmp/fastcrit_gpu_ctrl
    [ -f /tmp/fastcrit_gpu_ctrl/summary.json ] && cp /tmp/fastcrit_gpu_ctrl/summary.json "$OUT/ctrl_summary.json"
  else
    summary+=("$(printf '%-28s skipped: no runs/cpu-coder/final (run make ctrl-demo first)' ctrl_fp32)")
  fi
fi

if has ppo; then
  rm -rf "$PPO"
  gpu=(--set trainer.device=cuda --set model.dtype=bfloat16 --set model.liger=$LIGER --set "trainer.output_dir=$PPO")
  TAIL=4 step ppo_reward_model 90 "$PY" -m fastcrit.cli rm configs/cpu/ppo.yaml "${gpu[@]}" --set rm.steps=40
  TAIL=12 step ppo_bf16_critic 120 "$PY" -m fastcrit.cli train configs/cpu/ppo.yaml "${gpu[@]}" \
    --set "reward.model_path=$PPO/rm/final" --set rollout.engine_args.cuda_graph=true \
    --set trainer.total_steps=20 --set trainer.eval_every=10 --set trainer.save_every=20
  [ -f "$PPO/summary.json" ] && cp "$PPO/summary.json" "$OUT/ppo_summary.json"
fi

if has kernels; then
  TAIL=6 step bench_ppo_fp32 90 "$PY" benchmarks/bench_ppo.py --lm-shape 16384,896,151936 --lm-repeats 10
  # bf16, also at 512 MiB (slow while each chunk's d_W product went through its own fp32 result: is
  # it still?), 2 GiB (the 16-bit default, asked for explicitly) and 8 GiB grad-in-forward chunks,
  # each also with the chunks' logits in bf16 (fused_gif_logits16*)
  TAIL=12 step bench_ppo_bf16 60 "$PY" benchmarks/bench_ppo.py --lm-only --lm-shape 16384,896,151936 \
    --lm-repeats 10 --lm-dtype bfloat16 --lm-chunks 512,2048,8192
  # Qwen2.5-7B's hidden size (each GEMM 4x the above)
  TAIL=10 step bench_ppo_bf16_h3584 90 "$PY" benchmarks/bench_ppo.py --lm-only --lm-shape 16384,3584,151936 \
    --lm-repeats 5 --lm-dtype bfloat16 --lm-chunks 8192
  TAIL=14 step bench_fused_logprobs 120 "$PY" benchmarks/bench_fused_logprobs.py --device cuda \
    --tokens 8192,32768 --impls naive,ours,ours_triton,ours_grpo,liger_grpo --no-plot
fi

if has generate; then
  TAIL=10 step bench_generate 120 "$PY" benchmarks/bench_generate.py
fi

for f in $CSVS; do
  csv="benchmarks/results/$f.csv"
  if [ -f "$csv" ] && (($(wc -l <"$csv") > before[$f])); then
    { head -n 1 "$csv"; tail -n +$((before[$f] + 1)) "$csv"; } >"$OUT/$f.csv"
  fi
done
rm -f "$OUT/.step"
echo "=== summary"
printf '%s\n' "${summary[@]}"
