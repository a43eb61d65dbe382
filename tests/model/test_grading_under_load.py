"""Grading on a loaded machine: every reference solution of MATH-500 and GSM8K grades right while a real
sampling-and-GRPO run and CPU hogs compete for the cores (the helper's checks are bounded by CPU time)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import noisy_student_assets
from noisy_student_assets.core import grading

DATA = Path(noisy_student_assets.__file__).parent / "data"
ROOT = Path(noisy_student_assets.__file__).parents[1]
HOGS = 4
"""Busy loops beside the run, so that the grading helper waits for a core most of the time."""
DEADLINE_S = 600.0

# Samples from the model, then takes one GRPO step (which grades its own rewards), over and over, until killed.
LOAD = """
import itertools, sys, tempfile
from pathlib import Path
import polars as pl
from noisy_student_assets.core.sampling import SamplingSettings, generate
from noisy_student_assets.core.training.base import TrainingRun
from noisy_student_assets.core.training.grpo import build_training_dataset, train_grpo
from tests.training_data import SYSTEM_PROMPT, TINY_RUN, labeled_frame, pseudo_frame

model = Path(sys.argv[1])
problems = pl.DataFrame({"problem_id": ["a", "b"], "prompt": ["What is 3 + 4?", "What is 2 * 6?"]})
dataset = build_training_dataset(labeled_frame(), pseudo_frame(), SYSTEM_PROMPT)
for step in itertools.count():
    print("sampling", flush=True)
    decoding = SamplingSettings(n=4, temperature=1.0, max_new_tokens=32, seed=step)
    generate(model, problems, [decoding], backend="transformers")
    print("training", flush=True)
    with tempfile.TemporaryDirectory() as work:
        one_step = TINY_RUN.model_copy(update={"max_steps": 1})
        train_grpo(model, dataset, one_step, Path(work) / "out", TrainingRun(Path(work) / "work"))
"""


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.slow
def test_reference_solutions_grade_right_on_a_loaded_machine(
    sevens_model_dir: Path, tmp_path: Path, run_summary
) -> None:
    math500 = read_jsonl(DATA / "math500" / "test.jsonl")
    gsm8k = [
        (row["answer"], row["answer"].rsplit("####", 1)[1].strip()) for row in read_jsonl(DATA / "gsm8k" / "test.jsonl")
    ]
    log = tmp_path / "load.log"
    with log.open("w") as stderr:
        load = subprocess.Popen(
            [sys.executable, "-c", LOAD, str(sevens_model_dir)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env=os.environ | {"PYTHONPATH": str(ROOT)},
        )
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(HOGS)]
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(load.stdout), daemon=True)
    reader.start()
    passes, load_averages, training_before = [], [], False
    started = time.monotonic()
    try:
        # Grade everything, each pass cold and on a fresh helper, until a whole pass ran beside the training.
        while not passes or not training_before:
            assert time.monotonic() - started < DEADLINE_S, "the run did not reach its training step"
            training_before = "training\n" in lines
            grading.clear_cache()
            grading._worker.close()  # its startup and warm-up run under the load too
            math500_right = sum(grading.grade(row["solution"], row["answer"]) is True for row in math500)
            gsm8k_right = sum(grading.grade(solution, gold) is True for solution, gold in gsm8k)
            passes.append((math500_right, gsm8k_right))
            load_averages.append(os.getloadavg()[0])
            assert load.poll() is None, f"the run stopped:\n{log.read_text()[-3000:]}"
    finally:
        for process in [load, *hogs]:
            process.kill()
            process.wait()
        reader.join()
    run_summary(
        f"grading under load: MATH-500 and GSM8K right per pass {passes} (of {len(math500)}, {len(gsm8k)}), "
        f"{len(passes)} passes in {time.monotonic() - started:.0f} s beside sampling, a GRPO step and {HOGS} busy "
        "loops, "
        f"1-min load average {min(load_averages):.1f} to {max(load_averages):.1f}"
    )
    assert passes and set(passes) == {(500, 1319)}
