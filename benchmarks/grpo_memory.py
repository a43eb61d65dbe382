"""A GRPO process's time and peak memory: SmolLM2 GRPO-trained on the CPU profile's task at the student's settings,
each variant in a process of its own (a process tree's peak is its own), with the peak of each phase of the step.

    .venv/bin/python -m benchmarks.grpo_memory    # writes benchmarks/results/grpo_memory.json and .md

The variants differ in how a step's completions reach the loss (`grpo.gradient_accumulation_steps`, the
micro-batches), whether activations are recomputed (`grpo.gradient_checkpointing`) and who samples the groups
(`grpo.rollouts`: TRL's transformers generation, or the vLLM engine through the step's LoRA adapter). The phases are
TRL's own: `_generate` (sampling the groups, timed per step) and `_compute_loss` (the loss forward); the rest of a
step is the backward pass and the optimizer step. A phase's figure is the resident high-water mark of the process
and its children (vLLM's engine processes) while in it: memory that torch freed but the allocator kept counts, so a
step's generation starts at the level the previous step's backward left. The first step's generation includes the
vLLM engine's start, so a variant's steady step is the mean of the steps after the first.

Then two arms' trainings at once: the CPU default (the last variant) in two processes started together, each on one
thread (`compute.cpu_threads: 1`, as `grid run --parallel-arms 2` gives every heavy stage), their wall time and the
peak of both process trees together, against the same training run one after the other (twice the measured run's
wall time, the single process's peak).
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


def measure(update: dict, base_dir: Path, cpu_threads: int) -> dict:
    """Train `STEPS` GRPO steps with the student's settings and `update` in this process, on `cpu_threads` threads (0:
    one per core); its peak RSS per phase."""
    import psutil
    import trl

    from benchmarks.run import tree_rss
    from noisy_student_assets.core.problems import load_problems
    from noisy_student_assets.core.prompts import DEFAULT_SYSTEM_PROMPT
    from noisy_student_assets.core.settings import (
        ComputeSettings,
        ProblemPoolSettings,
        ProblemSplitSettings,
        StudentSettings,
    )
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
    ComputeSettings(cpu_threads=cpu_threads).apply_threads()
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
        "cpu_threads": cpu_threads,
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


def child(base_dir: Path, update: dict, cpu_threads: int = 0) -> subprocess.Popen:
    """A process that runs `measure` and prints its result as its last line."""
    arguments = [str(base_dir), json.dumps(update), str(cpu_threads)]
    command = [sys.executable, "-m", "benchmarks.grpo_memory", *arguments]
    return subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, text=True)


def finished(process: subprocess.Popen, started: float) -> dict:
    """`process`'s measurement, with its wall time since `started`."""
    out, _ = process.communicate()
    if process.returncode:
        raise RuntimeError(f"a GRPO measurement failed (exit {process.returncode})")
    return json.loads(out.strip().splitlines()[-1]) | {"wall_seconds": time.perf_counter() - started}


def two_at_once(base_dir: Path, update: dict, alone: dict) -> dict:
    """Two processes of `update` on one thread each, started together, against `alone` (the same run at the
    default threads) twice in a row: wall seconds and the peak resident memory of everything running."""
    import psutil

    from benchmarks.run import tree_rss

    peak, done = [0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], tree_rss(psutil.Process()))
            time.sleep(RSS_SAMPLE_S)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.perf_counter()
    runs = [finished(process, started) for process in [child(base_dir, update, 1), child(base_dir, update, 1)]]
    done.set()
    sampler.join()
    return {
        "settings": update,
        "together": {"wall_seconds": max(run["wall_seconds"] for run in runs), "peak_rss_gib": peak[0] / 2**30},
        "one_after_another": {"wall_seconds": 2 * alone["wall_seconds"], "peak_rss_gib": alone["peak_rss_gib"]},
        "runs": runs,
    }


def markdown(results: dict) -> str:
    """The variants' table and the two-arms line, as docs/benchmark.md shows them."""
    lines = [
        f"`python -m benchmarks.grpo_memory`, {results['date']} UTC, commit {results['commit']}, "
        f"{results['cores']} cores: {STEPS} GRPO steps of SmolLM2 at the student's CPU settings per variant.",
        "",
        "| variant | steady s/step | generation s/step | tokens/s in generation | first step s | peak GiB |",
        "|---|---|---|---|---|---|",
    ]
    for run in results["runs"]:
        name = ", ".join(f"{key} {value}" for key, value in run["settings"].items())
        lines.append(
            f"| {name} | {run['steady_seconds_per_step']:.1f} | {run['steady_generation_seconds_per_step']:.1f} | "
            f"{run['steady_generation_tokens_per_second']:.0f} | {run['step_seconds'][0]:.1f} | "
            f"{run['peak_rss_gib']:.2f} |"
        )
    trl, vllm = results["runs"][1], results["runs"][-1]
    lines += [
        "",
        f"vLLM rollouts against TRL's own generation at the same micro-batches: steady step "
        f"{vllm['steady_seconds_per_step'] / trl['steady_seconds_per_step']:.2f}, generation "
        f"{vllm['steady_generation_seconds_per_step'] / trl['steady_generation_seconds_per_step']:.2f}, peak memory "
        f"{vllm['peak_rss_gib'] / trl['peak_rss_gib']:.2f}.",
    ]
    pair = results["two_arms"]
    together, serial = pair["together"], pair["one_after_another"]
    lines += [
        "",
        "| two arms' trainings | wall s | peak GiB (all processes) |",
        "|---|---|---|",
        f"| one after another (twice one run) | {serial['wall_seconds']:.0f} | {serial['peak_rss_gib']:.2f} |",
        f"| at once, one thread each | {together['wall_seconds']:.0f} | {together['peak_rss_gib']:.2f} |",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="grpo-memory-base-"))
    base_dir = base_model(root)
    runs = []
    for update in VARIANTS:
        started = time.perf_counter()
        runs.append(finished(child(base_dir, update), started))
        print(json.dumps(runs[-1]), flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    results = {"date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "commit": commit.stdout.strip()}
    results |= {"cores": os.cpu_count(), "runs": runs, "two_arms": two_at_once(base_dir, VARIANTS[-1], runs[-1])}
    results["load_average_at_end"] = os.getloadavg()
    RESULT.write_text(json.dumps(results, indent=2) + "\n")
    RESULT.with_suffix(".md").write_text(markdown(results))
    print(markdown(results))


if __name__ == "__main__":  # each variant is a process of its own
    if len(sys.argv) == 4:
        print(json.dumps(measure(json.loads(sys.argv[2]), Path(sys.argv[1]), int(sys.argv[3]))))
    else:
        main()
