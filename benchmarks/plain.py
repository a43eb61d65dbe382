"""The plain-library baselines of the framework's cost (`make benchmark`): what the round's sampling and training
stages do, written as a plain TRL / vLLM script would, without Dagster and without the project's training or
sampling code (`core/training`, `core/sampling`).

Only the inputs are the project's: the same checkpoint, the same problems in the same chat messages
(`prompts.build_messages`), the same settings, and the project's grader as the GRPO reward (grading is not the
framework overhead measured). Each function times what the project's stage timer covers: for GRPO, loading
the model through the saved merged checkpoint; for vLLM, loading the tokenizer and the engine through the
engine's shutdown.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import polars as pl

from noisy_student_assets.core.grading import answer_reward
from noisy_student_assets.core.prompts import build_messages

VLLM_CPU_ENV = {"VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
"""vLLM on CPU as the project runs it (a 2 GiB KV cache on a shared machine, every core computing): the plain
script gets the same engine, so that the ratio measures the code around it, not engine tuning."""


def plain_grpo(init_dir: Path, labeled: pl.DataFrame, pseudo_labeled: pl.DataFrame, grpo: dict, out_dir: Path) -> dict:
    """GRPO with LoRA from `init_dir` on the labeled problems (reward against `gold_answer`) and the pseudo-labeled
    ones (against `pseudo_label`), shuffled by the settings' seed as the project's student rows are; `grpo` is the
    student's GRPOSettings as a dict (the training asset's `grpo_settings` metadata). Saves the merged model into
    `out_dir`; returns its seconds and what it trained on."""
    import datasets
    import torch
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    rows = pl.concat(
        [
            labeled.select("problem_id", "prompt", pl.col("gold_answer").alias("target")),
            pseudo_labeled.select("problem_id", "prompt", pl.col("pseudo_label").alias("target")),
        ]
    ).sample(fraction=1.0, shuffle=True, seed=grpo["seed"])
    dataset = datasets.Dataset.from_list(
        [{"prompt": build_messages(row["prompt"]), "target": row["target"]} for row in rows.iter_rows(named=True)]
    )

    def reward(completions, target, **kwargs) -> list[float]:
        return [
            answer_reward(completion[-1]["content"], answer)
            for completion, answer in zip(completions, target, strict=True)
        ]

    completions_per_step = grpo["prompts_per_step"] * grpo["num_generations"]
    start = time.time()
    tokenizer = AutoTokenizer.from_pretrained(init_dir)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(init_dir, dtype=torch.float32)
    config = GRPOConfig(
        output_dir=str(out_dir.with_name(out_dir.name + "-trainer")),
        max_steps=grpo["max_steps"],
        per_device_train_batch_size=completions_per_step,
        learning_rate=grpo["learning_rate"],
        seed=grpo["seed"],
        num_generations=grpo["num_generations"],
        max_completion_length=grpo["max_completion_length"],
        temperature=grpo["temperature"],
        beta=grpo["beta"],
        epsilon=grpo["epsilon"],
        loss_type=grpo["loss_type"],
        scale_rewards=grpo["scale_rewards"],
        # TRL's defaults are a GPU's: bf16 and activation recomputation; the cpu profile trains in float32 without it.
        bf16=False,
        gradient_checkpointing=grpo["gradient_checkpointing"],
        use_cpu=True,
        save_strategy="no",
        logging_steps=1,  # each step's completion lengths, to count the tokens sampled
        report_to="none",
    )
    lora = LoraConfig(
        task_type="CAUSAL_LM",
        r=grpo["lora_r"],
        lora_alpha=grpo["lora_alpha"],
        target_modules=grpo["lora_target_modules"],
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=lora,
    )
    trainer.train()
    trainer.model.merge_and_unload().save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    seconds = time.time() - start
    lengths = [
        entry["completions/mean_length"] for entry in trainer.state.log_history if "completions/mean_length" in entry
    ]
    step_times = [entry["step_time"] for entry in trainer.state.log_history if "step_time" in entry]
    steps = trainer.state.global_step
    return {
        "seconds": seconds,
        "seconds_per_step": sum(step_times) / len(step_times),  # TRL's own step timer, as the project's step profile
        "optimizer_steps": steps,
        "prompts": steps * grpo["prompts_per_step"],
        "completions": steps * completions_per_step,
        "generated_tokens": round(sum(lengths) * completions_per_step),
        "train_rows": len(dataset),
        "gold_rows": labeled.height,
        "pseudo_rows": pseudo_labeled.height,
    }


def plain_vllm(
    checkpoint_dir: Path,
    prompts: list[str],
    *,
    n: int,
    temperature: float,
    top_p: float,
    max_tokens: int,
    seed: int,
    dtype: str,
) -> dict:
    """`n` samples of each problem in `prompts` from `checkpoint_dir`, with vLLM's chat API (the checkpoint's chat
    template) in one call, the engine seeded by `seed`; returns its seconds and what it generated."""
    for name, value in VLLM_CPU_ENV.items():
        os.environ.setdefault(name, value)
    from vllm import LLM, SamplingParams

    start = time.time()
    llm = LLM(model=str(checkpoint_dir), dtype=dtype, seed=seed, enforce_eager=True)
    params = SamplingParams(n=n, temperature=temperature, top_p=top_p, max_tokens=max_tokens)
    outputs = llm.chat([build_messages(prompt) for prompt in prompts], params, use_tqdm=False)
    llm.llm_engine.engine_core.shutdown()  # the engine's processes free their cores for what runs next
    seconds = time.time() - start
    completions = [completion for output in outputs for completion in output.outputs]
    return {
        "seconds": seconds,
        "problems": len(outputs),
        "completions": len(completions),
        "generated_tokens": sum(len(completion.token_ids) for completion in completions),
    }
