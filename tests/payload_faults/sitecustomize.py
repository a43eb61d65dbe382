"""Faults for the payload tests, injected into the payload processes the launcher starts (this directory goes on
their PYTHONPATH, and Python imports `sitecustomize` at start-up). `NOISY_STUDENT_PAYLOAD_FAULT` names one:

- `nonfinite`: every training step's gradients are NaN (`tests/poison.py`): the step guard stops training;
- `kill-after-checkpoint`: a training process SIGKILLs itself once it saved checkpoint-1, on the first attempt only
  (a retry finds checkpoint-1 and resumes); `kill-rank-1-after-checkpoint`: the same, in torchrun's rank 1 alone;
- `hang-after-checkpoint`: a training process that saved checkpoint-1 on its first attempt writes the file
  `NOISY_STUDENT_PAYLOAD_READY` names and waits forever, a payload still at work when its Dagster process is killed;
- `hang-in-checkpoint-save`: a training process that saved checkpoint-1 whole writes checkpoint-2's weights and half
  of its optimizer state (no trainer state yet), writes the ready file and waits forever, on its first attempt: a
  process killed while TRL saves; `kill-in-checkpoint-save`: the same, SIGKILLing itself there;
- `kill-after-shard`: an evaluation SIGKILLs itself once it saved its first shard of completions, on the first attempt;
- `hang-after-shard`: sampling or an evaluation that saved its first shard starts a worker process and hangs with it
  (`tests/hangs.py`), on the first attempt.
"""

import importlib.abc
import importlib.machinery
import os
import signal
import sys

FAULT = os.environ.get("NOISY_STUDENT_PAYLOAD_FAULT", "")


def _kill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _hang(saying: str = "checkpoint-1 saved") -> None:
    import threading
    from pathlib import Path

    Path(os.environ["NOISY_STUDENT_PAYLOAD_READY"]).write_text(saying)
    threading.Event().wait()


def _stopped_in_second_save(trainer_class, stop) -> type:
    """`trainer_class` whose save of checkpoint-2 stops halfway through its optimizer state (`stop()`)."""
    save = trainer_class._save_optimizer_and_scheduler

    class StoppedInSave(trainer_class):
        def _save_optimizer_and_scheduler(self, output_dir):
            if self.state.global_step != 2:
                return save(self, output_dir)
            import io
            from pathlib import Path

            import torch

            state = io.BytesIO()
            torch.save(self.optimizer.state_dict(), state)
            Path(output_dir, "optimizer.pt").write_bytes(state.getvalue()[: len(state.getvalue()) // 2])
            stop()

    return StoppedInSave


IN_CHECKPOINT_SAVE = {
    "hang-in-checkpoint-save": lambda: _hang("checkpoint-2 half saved"),
    "kill-in-checkpoint-save": _kill_self,
}
AFTER_CHECKPOINT = {
    "kill-after-checkpoint": _kill_self,
    "kill-rank-1-after-checkpoint": _kill_self,
    "hang-after-checkpoint": _hang,
}


def _patch_fit(module) -> None:
    fit = module.fit

    def fit_with_fault(trainer_class, trainer_kwargs, *args, callbacks=None, work_dir, **kwargs):
        from pathlib import Path

        first_attempt = not list(Path(work_dir).glob("checkpoint-*"))
        if FAULT == "nonfinite":
            from tests.poison import PoisonGradients

            callbacks = [*(callbacks or []), PoisonGradients(set(range(1, 100)))]
        elif (
            FAULT in AFTER_CHECKPOINT
            and first_attempt
            and (FAULT != "kill-rank-1-after-checkpoint" or os.environ.get("RANK") == "1")
        ):
            save = trainer_class._save_checkpoint

            class StoppedAfterCheckpoint(trainer_class):
                def _save_checkpoint(self, model, trial):
                    save(self, model, trial)
                    if self.state.global_step == 1:
                        AFTER_CHECKPOINT[FAULT]()

            trainer_class = StoppedAfterCheckpoint
        elif FAULT in IN_CHECKPOINT_SAVE and first_attempt:
            trainer_class = _stopped_in_second_save(trainer_class, IN_CHECKPOINT_SAVE[FAULT])
        return fit(trainer_class, trainer_kwargs, *args, callbacks=callbacks, work_dir=work_dir, **kwargs)

    module.fit = fit_with_fault


def _patch_shards(module) -> None:
    write = module.SampleShards.write
    if FAULT == "hang-after-shard":
        from tests.hangs import hang_after_first_shard

        module.SampleShards.write = hang_after_first_shard(write)
        return
    first_attempt = {}

    def write_then_die(shards, table):
        first = first_attempt.setdefault(shards.directory, not list(shards.directory.glob("shard-*.parquet")))
        write(shards, table)
        if first:
            _kill_self()

    module.SampleShards.write = write_then_die


PATCHES = {"noisy_student_assets.core.training.base": _patch_fit, "noisy_student_assets.core.sampling": _patch_shards}
SHARD_FAULTS = ("kill-after-shard", "hang-after-shard")


class _PatchOnImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in PATCHES or (name.endswith("sampling") and FAULT not in SHARD_FAULTS):
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            PATCHES[name](module)

        spec.loader.exec_module = exec_and_patch
        return spec


if FAULT and "noisy_student_assets" not in sys.modules:
    sys.meta_path.insert(0, _PatchOnImport())
