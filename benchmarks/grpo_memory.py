"""A GRPO process's time and peak memory: SmolLM2 GRPO-trained on the CPU profile's task at the student's settings,
each variant in a process of its own (a process tree's peak is its own), with the peak of each phase of the step.

    .venv/bin/python -m benchmarks.grpo_memory    # writes benchmarks/results/grpo_memory.json

The variants differ in how a step's completions reach the loss (`grpo.gradient_accumulation_steps`, the
micro-batches), whether activations are recomputed (`grpo.gradient_checkpointing`) and who samples the groups
(`grpo.rollouts`: TRL's transformers generation, or the vLLM engine through the step's LoRA adapter). The phases are
TRL's own: `_generate` (sampling the groups, timed per step) and `_compute_loss` (the loss forward); the rest of a
step is the backward pass and the optimizer step. A phase's figure is the resident high-water mark of the process
and its children (vLLM's engine processes) while in it: memory that torch freed but the allocator kept counts, so a
step's generation starts at the level the previous step's backward left. The first step's generation includes the
vLLM engine's start, so a variant's steady step is the mean of the steps after the first.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULT = REPO / "benchmarks" / "results" / "grpo_memory.json"
VARIANTS = (
    {"gradient_accumulation_steps": 1, "rollouts": "trl"},
    {"gradient_accumulation_steps": 4, "rollouts": "trl"},
    {"gradient_accumulation_steps": 4, "gradient_checkpointing": True, "rollouts": "trl"},
    {"gradient_accumulation_steps": 4, "rollouts": "vllm"},
)
STEPS = 4
RSS_SAMPLE_S = 0.02


def measure(update: dict, base_dir: Path) -> dict:
    """Train `STEPS` GRPO steps with the student's settings and `update` in this process; its peak RSS per phase."""
    import psutil
    import trl

    from benchmarks.run import tree_rss
    from noisy_student_assets.core.problems import load_problems
    from noisy_student_assets.core.prompts import DEFAULT_SYSTEM_PROMPT
    from noisy_student_assets.core.settings import ProblemPoolSettings, ProblemSplitSettings, StudentSettings
    from noisy_student_assets.core.training.base import TrainingRun
    from noisy_student_assets.core.training.grpo import build_training_dataset, train_grpo

    process, phase, peaks, generation_seconds = psutil.Process(), ["load"], {}, []

    def sample() -> None:
        while True:
            peaks[phase[0]] = max(peaks.get(phase[0], 0), tree_rss(process))
            time.sleep(RSS_SAMPLE_S)

    def entering(name: str, method: str, after: str) -> None:
        original = getattr(trl.GRPOTrainer, method)

        def timed(self, *args, **kwargs):
            phase[0], started = name, time.perf_counter()
            try:
                return original(self, *args, **kwargs)
            finally:
                phase[0] = after
                if name == "generation":
                    generation_seconds.append(time.perf_counter() - started)

        setattr(trl.GRPOTrainer, method, timed)

    entering("generation", "_generate", "rewards")
    entering("loss forward", "_compute_loss", "backward + optimizer")
    threading.Thread(target=sample, daemon=True).start()
    problems = load_problems(**ProblemPoolSettings().resolved_source.load_kwargs())
    dataset = build_training_dataset(problems.head(ProblemSplitSettings().n_labeled), None, DEFAULT_SYSTEM_PROMPT)
    settings = StudentSettings().grpo.model_copy(update={"max_steps": STEPS, "save_steps": 0, **update})
    work = Path(tempfile.mkdtemp(prefix="grpo-memory-"))
    result = train_grpo(base_dir, dataset, settings, work / "merged", TrainingRun(work / "work"))
    lengths = [entry["completions/mean_length"] for entry in result.log_history if "completions/mean_length" in entry]
    step_seconds = [entry["step_time"] for entry in result.log_history if "step_time" in entry]
    tokens = sum(lengths[1:]) * settings.completions_per_step
    return {
        "settings": update,
        "max_completion_length": settings.max_completion_length,
        "completions_per_step": settings.completions_per_step,
        "mean_completion_length": sum(lengths) / len(lengths),
        "seconds_per_step": result.metrics["seconds_per_step"],
        "step_seconds": step_seconds,
        "generation_seconds": generation_seconds,
        "steady_seconds_per_step": sum(step_seconds[1:]) / len(step_seconds[1:]),
        "steady_generation_seconds_per_step": sum(generation_seconds[1:]) / len(generation_seconds[1:]),
        "steady_generation_tokens_per_second": tokens / sum(generation_seconds[1:]),
        "peak_rss_gib": max(peaks.values()) / 2**30,
        "peak_rss_gib_by_phase": {name: peak / 2**30 for name, peak in peaks.items()},
    }


def base_model(root: Path) -> Path:
    from noisy_student_assets.core.checkpoints import materialize_checkpoint, smollm2_gguf_path

    base_dir = root / "smollm2"
    materialize_checkpoint(str(smollm2_gguf_path()), base_dir)
    return base_dir


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="grpo-memory-base-"))
    base_dir = base_model(root)
    runs = []
    for update in VARIANTS:
        out = subprocess.run(
            [sys.executable, "-m", "benchmarks.grpo_memory", str(base_dir), json.dumps(update)],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        runs.append(json.loads(out.strip().splitlines()[-1]))
        print(json.dumps(runs[-1]), flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    load = os.getloadavg()
    results = {"date": time.strftime("%Y-%m-%d %H:%M"), "commit": commit.stdout.strip(), "cores": os.cpu_count()}
    results |= {"load_average_at_end": load, "runs": runs}
    RESULT.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":  # each variant is a process of its own
    if len(sys.argv) == 3:
        print(json.dumps(measure(json.loads(sys.argv[2]), Path(sys.argv[1]))))
    else:
        main()
