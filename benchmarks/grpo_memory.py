"""A GRPO process's time and peak memory: SmolLM2 GRPO-trained on the CPU profile's task at the student's settings,
each variant in a process of its own (a process tree's peak is its own), with the seconds and peak of each phase of
the step and the tokens the loss computed.

    .venv/bin/python -m benchmarks.grpo_memory    # writes benchmarks/results/grpo_memory.json and .md

The variants differ in who samples the groups (`grpo.rollouts`: TRL's transformers generation, or the project's vLLM
engine) and in how the loss lays out a step's completions (`grpo.shared_prefix`: each group's prompt once, or each
completion with its prompt as TRL does); all at the student's 4 micro-batches a step. TRL's own generation and loss
(`rollouts trl, shared_prefix false`) is plain TRL at equal settings, the baseline of the ratios. Each runs twice:
from the base model with the round's completion cap, as labeled RL's early steps sample (long completions), and
with completions capped at `LATE_COMPLETION_CAP` tokens, the length of the one-line answers labeled RL's late steps
sample. The phases are TRL's own methods, timed per step: `_generate` (sampling the groups) and `_compute_loss` (the
loss forward); the rest of a step is the rewards, the backward pass and the optimizer step. A phase's memory figure
is the resident high-water mark of the process and its children (vLLM's engine processes) while in it: memory that
torch freed but the allocator kept counts. The first step's generation includes the vLLM engine's start, so a
variant's steady figures are the means of the steps after the first.

Then two arms' trainings at once: the CPU default (`DEFAULT`) in two processes started together, each on one
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
PLAIN_TRL = {"rollouts": "trl", "shared_prefix": False}
UNSHARED = {"rollouts": "vllm", "shared_prefix": False}
DEFAULT = {"rollouts": "vllm", "shared_prefix": True}
VARIANTS = (PLAIN_TRL, UNSHARED, DEFAULT)
LATE_COMPLETION_CAP = 16
"""Completion tokens at most in the late-steps runs: labeled RL's late steps answer in a line."""
PHASES = ("generation", "loss forward", "rewards + backward + optimizer")
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

    process, phase, peaks, seconds = psutil.Process(), ["load"], {}, {"generation": [], "loss forward": []}

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
                seconds[name].append((self.state.global_step, time.perf_counter() - started))

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
    return step_figures(result.log_history, seconds, settings.completions_per_step) | {
        "settings": update,
        "cpu_threads": cpu_threads,
        "max_completion_length": settings.max_completion_length,
        "completions_per_step": settings.completions_per_step,
        "seconds_per_step": result.metrics["seconds_per_step"],
        "peak_rss_gib": max(peaks.values()) / 2**30,
        "peak_rss_gib_by_phase": {name: peak / 2**30 for name, peak in peaks.items()},
    }


def step_figures(log_history: list[dict], seconds: dict[str, list[tuple[int, float]]], completions: int) -> dict:
    """Each step's seconds by phase (`seconds`: each timed call's step and seconds, a step's micro-batches summed),
    its completion lengths and the loss's token counts, and their means over the steps after the first."""
    from noisy_student_assets.core.training.shared_prefix import LOSS_TOKENS

    def logged(key: str) -> list[float]:
        return [entry[key] for entry in log_history if key in entry]

    steps = logged("step_time")
    by_phase = {
        name: [sum(s for step, s in calls if step == index) for index in range(len(steps))]
        for name, calls in seconds.items()
    }
    by_phase[PHASES[-1]] = [
        total - sum(phase[index] for phase in by_phase.values()) for index, total in enumerate(steps)
    ]
    lengths = logged("completions/mean_length")
    tokens = {name: logged(name) for name in LOSS_TOKENS}

    def steady(values: list[float]) -> float:
        return sum(values[1:]) / len(values[1:])

    return {
        "step_seconds": steps,
        "phase_seconds": by_phase,
        "mean_completion_length": sum(lengths) / len(lengths),
        "loss_tokens_per_step": tokens,
        "steady_seconds_per_step": steady(steps),
        "steady_phase_seconds": {name: steady(values) for name, values in by_phase.items()},
        "steady_loss_tokens_per_step": {name: steady(values) for name, values in tokens.items()},
        "steady_generation_tokens_per_second": sum(lengths[1:]) * completions / sum(by_phase["generation"][1:]),
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


def variant_name(settings: dict) -> str:
    return ", ".join(f"{key} {value}" for key, value in settings.items() if key != "max_completion_length")


def markdown(results: dict) -> str:
    """The variants' tables, the ratios against plain TRL and the two-arms line, as docs/benchmark.md shows them."""
    lines = [
        f"`python -m benchmarks.grpo_memory`, {results['date']} UTC, commit {results['commit']}, "
        f"{results['cores']} cores: {STEPS} GRPO steps of SmolLM2 at the student's CPU settings per variant (2 prompts "
        "x 8 completions a step, 4 micro-batches), steady figures over the steps after the first.",
    ]
    for stage, runs in results["stages"].items():
        cap = runs[0]["max_completion_length"]
        lines += [
            "",
            f"{STAGES[stage][0]} (completions of at most {cap} tokens):",
            "",
            "| variant | step s | generation s | loss forward s | rewards + backward + optimizer s | completion "
            "tokens | loss tokens computed | TRL's layout | peak GiB |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for run in runs:
            phases, tokens = run["steady_phase_seconds"], run["steady_loss_tokens_per_step"]
            lines.append(
                f"| {variant_name(run['settings'])} | {run['steady_seconds_per_step']:.1f} | "
                + " | ".join(f"{phases[name]:.1f}" for name in PHASES)
                + f" | {tokens['loss_tokens/completions']:.0f} | {tokens['loss_tokens/computed']:.0f} | "
                f"{tokens['loss_tokens/unshared']:.0f} | {run['peak_rss_gib']:.2f} |"
            )
        plain, unshared, default = (runs[VARIANTS.index(variant)] for variant in (PLAIN_TRL, UNSHARED, DEFAULT))
        lines += ["", ratios_line(plain, default, unshared)]
    pair = results["two_arms"]
    together, serial = pair["together"], pair["one_after_another"]
    lines += [
        "",
        f"Two arms' trainings of the default ({variant_name(pair['settings'])}):",
        "",
        "| two arms' trainings | wall s | peak GiB (all processes) |",
        "|---|---|---|",
        f"| one after another (twice one run) | {serial['wall_seconds']:.0f} | {serial['peak_rss_gib']:.2f} |",
        f"| at once, one thread each | {together['wall_seconds']:.0f} | {together['peak_rss_gib']:.2f} |",
    ]
    return "\n".join(lines) + "\n"


def ratios_line(plain: dict, default: dict, unshared: dict) -> str:
    """The default's steady step against plain TRL's, and the shared prefix's loss (forward, and forward plus
    backward) against the same sampler's without it."""

    def loss(run: dict, *names: str) -> float:
        return sum(run["steady_phase_seconds"][name] for name in names)

    forward, rest = PHASES[1], PHASES[2]
    step = default["steady_seconds_per_step"] / plain["steady_seconds_per_step"]
    computed = "loss_tokens/computed"
    tokens = default["steady_loss_tokens_per_step"][computed] / unshared["steady_loss_tokens_per_step"][computed]
    return (
        f"The default against plain TRL: steady step {step:.2f}, peak memory "
        f"{default['peak_rss_gib'] / plain['peak_rss_gib']:.2f}. The shared prefix against TRL's layout, both sampled "
        f"by vLLM: loss forward {loss(default, forward) / loss(unshared, forward):.2f}, loss forward + rewards + "
        f"backward + optimizer {loss(default, forward, rest) / loss(unshared, forward, rest):.2f}, tokens computed "
        f"{tokens:.2f}."
    )


STAGES = {
    "early": ("Labeled RL's early steps, from the base model", {}),
    "late": (
        f"Late steps' one-line answers, completions capped at {LATE_COMPLETION_CAP} tokens",
        {"max_completion_length": LATE_COMPLETION_CAP},
    ),
}
"""Each stage of labeled RL the variants run at: its title and its settings beside theirs."""


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="grpo-memory-base-"))
    base_dir = base_model(root)
    runs = {stage: [] for stage in STAGES}
    for stage, (_, cap) in STAGES.items():
        for update in VARIANTS:
            started = time.perf_counter()
            runs[stage].append(finished(child(base_dir, update | cap), started))
            print(json.dumps(runs[stage][-1]), flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    results = {"date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "commit": commit.stdout.strip()}
    alone = runs["early"][VARIANTS.index(DEFAULT)]
    results |= {"cores": os.cpu_count(), "stages": runs, "two_arms": two_at_once(base_dir, DEFAULT, alone)}
    results["load_average_at_end"] = os.getloadavg()
    RESULT.write_text(json.dumps(results, indent=2) + "\n")
    RESULT.with_suffix(".md").write_text(markdown(results))
    print(markdown(results))


if __name__ == "__main__":  # each variant is a process of its own
    if len(sys.argv) == 4:
        print(json.dumps(measure(json.loads(sys.argv[2]), Path(sys.argv[1]), int(sys.argv[3]))))
    else:
        main()
