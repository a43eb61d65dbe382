"""Faults injected into payloads (tests/payload_faults/sitecustomize.py, the `fault` fixture of tests/conftest.py)
and what a test reads of them: a step's failures and retries, with the errors that caused them."""

from __future__ import annotations

import shutil
from pathlib import Path

import dagster as dg
import psutil

from resources.data_lake import INDEX_DIR_NAME, DataLake

FAULTS_DIR = Path(__file__).resolve().parent / "payload_faults"


def fault_environment(fault: str, ready: Path) -> dict[str, str]:
    """The environment of a process started with `fault` (`payload_faults/sitecustomize.py`), which writes `ready` where
    it stops."""
    return {
        "NOISY_STUDENT_PAYLOAD_FAULT": fault,
        "NOISY_STUDENT_PAYLOAD_READY": str(ready),
        "PYTHONPATH": str(FAULTS_DIR),
    }


def fresh(lake_copy) -> DataLake:
    """A lake of round 1's inputs that knows no earlier run to reuse: everything asked for is computed."""
    lake = lake_copy()
    shutil.rmtree(lake.root_path / INDEX_DIR_NAME, ignore_errors=True)
    return lake


def leftovers(marker: str) -> list[str]:
    """Processes this test's payloads started that still run (they carry the test's marker in their environment)."""
    found = []
    for process in psutil.process_iter(["pid", "ppid", "cmdline"]):
        command = " ".join(process.info["cmdline"] or [])
        try:
            marked = process.environ().get("NOISY_STUDENT_TEST_MARKER") == marker
        except psutil.Error:
            continue
        # Not this process's grader, nor its multiprocessing resource tracker (started by an in-process vLLM engine):
        # helpers of the test process that live as long as it does.
        own = process.info["ppid"] == psutil.Process().pid
        helper = "_math_verify_worker" in command or (own and "multiprocessing.resource_tracker" in command)
        if marked and process.pid != psutil.Process().pid and not helper:
            found.append(command)
    return found


def _chain(error) -> str:
    """An error's message with the errors that caused it (a retry or an exceeded retry names the step's own below)."""
    return error.message + (" <- " + _chain(error.cause) if error.cause else "")


def failures(result: dg.ExecuteInJobResult, step: str) -> list[str]:
    return [_chain(e.event_specific_data.error) for e in result.all_events if e.is_step_failure and e.step_key == step]


def retries(result: dg.ExecuteInJobResult, step: str) -> list[str]:
    return [
        _chain(e.event_specific_data.error)
        for e in result.all_events
        if e.event_type_value == "STEP_UP_FOR_RETRY" and e.step_key == step
    ]
