"""TRL's GRPOTrainer on one setting of bench_trl.py, run in TRL's own environment (not fastcrit's).

Called by bench_trl.py as ``PEER_PYTHON benchmarks/_trl_peer.py --spec SPEC.json --out OUT.json``;
SPEC holds the model directory, the prompts (chat messages) and answers, and every setting. The
reward is fastcrit's own ``reverse`` rule, imported from this checkout (it needs no more than the
standard library). OUT gets the wall time of every optimizer step and TRL's logged metrics; the peak resident set
comes from _peak.py, which bench_trl.py runs this script under (as it runs fastcrit).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    with open(args.spec) as f:
        spec = json.load(f)
    import torch

    torch.set_num_threads(spec["threads"])
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    sys.path.insert(0, ROOT)
    # the task's own score (standard library only): fastcrit.reward's package imports the kernels,
    # which TRL's environment does not have
    from fastcrit.data.tasks import reverse_reward

    def reward(prompts, completions, answer, **_):
        return [reverse_reward(c[0]["content"] if isinstance(c, list) else c, a) for c, a in zip(completions, answer)]

    class Clock(TrainerCallback):
        def __init__(self):
            self.ends: list[float] = []

        def on_step_begin(self, args, state, control, **kw):
            if not self.ends:
                self.ends.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kw):
            self.ends.append(time.perf_counter())

    s = spec["settings"]
    data = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": p}], "answer": a} for p, a in zip(spec["prompts"], spec["answers"])]
    )
    per_update = s["prompts_per_step"] * s["n"] // s["updates_per_step"]
    cfg = GRPOConfig(
        output_dir=spec["workdir"],
        use_cpu=True,
        bf16=s.get("dtype") == "bfloat16",
        seed=s["seed"],
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        max_steps=s["steps"] * s["updates_per_step"],
        per_device_train_batch_size=per_update,
        steps_per_generation=s["updates_per_step"],
        num_generations=s["n"],
        num_iterations=1,
        max_completion_length=s["max_new_tokens"],
        temperature=s["temperature"],
        top_p=1.0,
        top_k=0,
        beta=s["kl_coef"],
        loss_type="dapo",
        scale_rewards="group",
        epsilon=0.2,
        learning_rate=s["lr"],
        lr_scheduler_type="constant",
        weight_decay=0.0,
        adam_beta1=0.9,
        adam_beta2=0.999,
        adam_epsilon=1e-8,
        max_grad_norm=s["grad_clip"],
        optim="adamw_torch",
        dataloader_num_workers=0,
        remove_unused_columns=False,
        gradient_checkpointing=s["gradient_checkpointing"],
    )
    tok = AutoTokenizer.from_pretrained(spec["model"])
    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32)
    clock = Clock()
    trainer = GRPOTrainer(
        model=model, reward_funcs=reward, args=cfg, train_dataset=data, processing_class=tok, callbacks=[clock]
    )
    trainer.train()
    steps = [b - a for a, b in zip(clock.ends, clock.ends[1:])]
    logs = [h for h in trainer.state.log_history if "loss" in h or "reward" in h]
    with open(args.out, "w") as f:
        json.dump(
            {"update_s": steps, "logs": logs, "trl": __import__("trl").__version__, "torch": torch.__version__}, f
        )


if __name__ == "__main__":
    main()
