"""A materialization that stops at a chosen point, for a test to SIGKILL it there (tests/integration/test_crashes.py).

`python -m tests.killed_run <fault> <lake root> <ready file> <model dir>` runs the real assets on the lake; at the
fault it writes `<ready file>` and waits forever, as a process does in the instant it is killed:

- `generations-write`: half of the generations' parquet file written;
- `sampling`: one shard of samples saved, the next one half written;
- `checkpoint-save`: half of the trained checkpoint's safetensors file written;
- `training`: the first resumable TRL checkpoint of labeled RL (GRPO) saved, the second step under way;
- `trl-checkpoint-save`: labeled RL's second TRL checkpoint half saved (its adapter written, half of its optimizer
  state, no trainer state), the first one whole (`tests/payload_faults`' `hang-in-checkpoint-save`, in this
  process);
- `training-sft`, `training-dpo`: the same in round 1's student trained in that mode (on a lake whose
  teacher answers, `sevens_lake_copy`: a random model's samples agree on nothing to train on);
- `payload-training`: labeled RL trained by a payload process (`subprocess` launcher) that saved its first TRL
  checkpoint and hangs there (`tests/payload_faults`): killing this process leaves the payload running.

`kill_at` (for the tests) runs this until the fault and SIGKILLs it there.

Only where the process stops is arranged here; what it has written is the pipeline's own doing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import polars as pl

from noisy_student_assets.core import layout
from noisy_student_assets.core.sampling import SampleShards
from resources.data_lake import DataLake
from tests.faults import fault_environment
from tests.lakes import materialize
from tests.tiny_configs import TINY_GRPO, op, round_names, tiny_config, with_op_config

TRAINING_STEPS = 3
ARM = "a"
STUDENT_MODE_FAULTS = {"training-sft": "sft", "training-dpo": "dpo"}
PAYLOAD_FAULT = "payload-training"
TRL_SAVE_FAULT = "trl-checkpoint-save"
FAULTS = (
    "generations-write",
    "sampling",
    "checkpoint-save",
    "training",
    TRL_SAVE_FAULT,
    *STUDENT_MODE_FAULTS,
    PAYLOAD_FAULT,
)
FAULT_TIMEOUT_S = 600
REPO = Path(__file__).resolve().parents[1]


def materialization(fault: str, model_dir: str) -> tuple[list[str], dict, str]:
    """Selection, run config and arm that each fault interrupts (the test re-runs the same)."""
    config = tiny_config(Path(model_dir))
    if fault in ("generations-write", "sampling"):
        return round_names(1, layout.GENERATIONS, layout.PSEUDO_LABELS, layout.STUDENT), config, ARM
    grpo = TINY_GRPO | {"max_steps": TRAINING_STEPS, "save_steps": 1}
    if fault in STUDENT_MODE_FAULTS:
        student = op(layout.round_prefix(1), layout.STUDENT)
        config = with_op_config(config, student, mode=STUDENT_MODE_FAULTS[fault], grpo=grpo)
        return round_names(1, layout.GENERATIONS, layout.PSEUDO_LABELS, layout.STUDENT), config, ARM
    return [layout.LABELED_RL], with_op_config(config, layout.LABELED_RL, grpo=grpo), ARM


def _stop_here(ready: Path) -> None:
    ready.write_text("stopped")
    threading.Event().wait()


def _half_write(path: Path, data: bytes, ready: Path) -> None:
    Path(path).write_bytes(data[: len(data) // 2])
    _stop_here(ready)


def arrange(fault: str, ready: Path) -> None:
    if fault == "generations-write":
        write_parquet = pl.DataFrame.write_parquet

        def stop_in_generations(frame, file, *args, **kwargs):
            if (
                Path(file).name != layout.TABLE_FILE_NAME or "sample_index" not in frame.columns
            ):  # not the generations table
                return write_parquet(frame, file, *args, **kwargs)
            scratch = Path(str(file) + ".whole")
            write_parquet(frame, scratch, *args, **kwargs)
            _half_write(Path(file), scratch.read_bytes(), ready)

        pl.DataFrame.write_parquet = stop_in_generations
    elif fault == "sampling":
        save_shard = SampleShards.write

        def stop_in_second_shard(shards, table):
            if list(shards.directory.glob("shard-*.parquet")):
                table.write_parquet(shards.directory / "in-flight.parquet.tmp")
                _stop_here(ready)
            save_shard(shards, table)

        SampleShards.write = stop_in_second_shard
    elif fault == "checkpoint-save":
        import safetensors.torch
        import transformers.modeling_utils

        def stop_in_weights(tensors, filename, metadata=None):
            if "/.staging/" not in str(filename):  # TRL's resumable checkpoints go to the work dir
                return safetensors.torch.save_file(tensors, filename, metadata=metadata)
            _half_write(Path(filename), safetensors.torch.save(tensors, metadata=metadata), ready)

        transformers.modeling_utils.safe_save_file = stop_in_weights
    elif fault == PAYLOAD_FAULT:  # the payload processes this one starts inherit the fault
        os.environ |= fault_environment("hang-after-checkpoint", ready)
    elif fault == TRL_SAVE_FAULT:
        pass  # this process started with the fault (`kill_at`)
    elif fault == "training" or fault in STUDENT_MODE_FAULTS:
        import trl

        trainer_class = {"training": trl.GRPOTrainer, "training-sft": trl.SFTTrainer, "training-dpo": trl.DPOTrainer}[
            fault
        ]
        save_checkpoint = trainer_class._save_checkpoint

        def stop_after_first_checkpoint(trainer, model, trial):
            save_checkpoint(trainer, model, trial)
            if trainer.state.global_step == 1:
                _stop_here(ready)

        trainer_class._save_checkpoint = stop_after_first_checkpoint
    else:
        raise SystemExit(f"unknown fault {fault!r}; expected one of {', '.join(FAULTS)}")


def kill_at(fault: str, lake: DataLake, model_dir: Path) -> None:
    """Run this module until it reaches `fault`, then SIGKILL its whole process group."""
    ready = lake.root_path.parent / f"{fault}.ready"
    log = lake.root_path.parent / f"{fault}.log"
    with log.open("wb") as out:
        child = subprocess.Popen(
            [sys.executable, "-m", "tests.killed_run", fault, lake.root, str(ready), str(model_dir)],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=os.environ | fault_environment("hang-in-checkpoint-save", ready) if fault == TRL_SAVE_FAULT else None,
        )
    try:
        deadline = time.monotonic() + FAULT_TIMEOUT_S
        while not ready.exists():
            assert child.poll() is None, f"exited {child.returncode} before its fault:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"did not reach its fault in {FAULT_TIMEOUT_S} s"
            time.sleep(0.2)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
        child.wait()
    assert child.returncode == -signal.SIGKILL


def main(fault: str, lake_root: str, ready: str, model_dir: str) -> None:
    arrange(fault, Path(ready))
    materialize(
        DataLake(root=lake_root),
        *materialization(fault, model_dir),
        launcher="subprocess" if fault == PAYLOAD_FAULT else "inprocess",
    )
    raise SystemExit(f"{fault}: the run finished without reaching its fault")


if __name__ == "__main__":
    main(*sys.argv[1:])
