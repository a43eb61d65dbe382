"""Round 1's GRPO student of `make run` trained again on 1 and on 2 torchrun processes (gloo), each as a payload of
the `subprocess` launcher, at the same compute: wall time of each, their `compute.json`, the student's checks and
whether the lake's one-process labeled-only control passes `compute_matched` against it.

    make run    # first: the lake with round 1's pseudo-labels and labeled-only control
    .venv/bin/python benchmarks/training_processes.py [LAKE]    # writes benchmarks/results/training_processes.json

Each run trains on a copy of the lake (its own index, so nothing is read back), in an ephemeral Dagster instance.
On a machine of C cores each of N ranks gets C/N torch threads: on 2 cores, two ranks of one thread do the work one
rank of two threads did, plus gloo's all-reduce, so no speed-up is expected there; the point is the matched compute.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ARM = "default"
PROCESSES = (1, 2)


def train_student(lake_root: Path, processes: int) -> dict:
    import dagster as dg

    from noisy_student_assets.core import layout
    from noisy_student_assets.core.training.compute import MATCHED_FIELDS, read_compute
    from noisy_student_assets.defs.checks import COMPUTE_MATCHED
    from noisy_student_assets.defs.grid import evaluate_checks, materialize_selection
    from noisy_student_assets.defs.partitions import ARMS
    from resources import lake_resources
    from resources.data_lake import INDEX_DIR_NAME, DataLake
    from resources.launchers import StageLauncher

    copy = Path(tempfile.mkdtemp(prefix=f"noisy-student-{processes}-processes-")) / "lake"
    shutil.copytree(lake_root, copy, ignore=shutil.ignore_patterns(".dagster", INDEX_DIR_NAME, "mlflow*"))
    lake = DataLake(root=str(copy))
    student = layout.round_asset(1, layout.STUDENT)
    control = dg.AssetKey(layout.round_asset(1, layout.control_checkpoint(layout.LABELED_ONLY)))
    resources = lake_resources(lake, launcher=StageLauncher(kind="subprocess"))
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(ARMS.name, [ARM])
        started = time.perf_counter()
        result = materialize_selection(
            ["/".join(student)],
            partition=ARM,
            instance=instance,
            resources=resources,
            run_config={"ops": {"__".join(student): {"config": {"grpo": {"processes": processes}}}}},
        )
        wall = time.perf_counter() - started
        assert result.success, f"training on {processes} processes failed"
        # The labeled-only control's check, against the new student (it is a check of the control's asset).
        matched = evaluate_checks(
            [dg.AssetCheckKey(control, COMPUTE_MATCHED)], partition=ARM, instance=instance, resources=resources
        )
    (event,) = result.get_asset_materialization_events()
    metadata = event.step_materialization_data.materialization.metadata
    checks = {
        check.check_name: check.passed
        for check in [*result.get_asset_check_evaluations(), *matched.get_asset_check_evaluations()]
    }
    compute = read_compute(lake.artifact_dir(dg.AssetKey(student), ARM)).own
    shutil.rmtree(copy.parent)
    return {
        "processes": processes,
        "materialization_seconds": wall,
        "training_seconds": metadata["training_seconds"].value,
        "payload_stage_seconds": metadata["payload/finished_at"].value - metadata["payload/started_at"].value,
        "compute": {field: getattr(compute, field) for field in MATCHED_FIELDS},
        "checks": checks,
    }


def main(lake_root: Path) -> None:
    import subprocess

    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    runs = [train_student(lake_root, processes) for processes in PROCESSES]
    results = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "commit": commit,
        "cores": os.cpu_count(),
        "lake": str(lake_root),
        "runs": runs,
    }
    (REPO / "benchmarks" / "results" / "training_processes.json").write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":  # payloads spawn vLLM and torchrun processes
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / "data_lake")
