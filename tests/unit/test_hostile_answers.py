"""Hostile answers a model may emit, graded the way rewards (``grade``) and consensus
(``answers_equivalent``) grade them: in the main thread, in a thread pool and in worker processes.

Each must come back False or ungraded (None: out of CPU time twice), never True, never raise and
never hang; in the main thread each within a hard bound.  The summary printed at the end of every
pytest run gives each mode's number of checks, ungraded checks, hangs and worst time.
"""

from __future__ import annotations

import multiprocessing
import time
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

from noisy_student_assets.core import grading
from noisy_student_assets.core._math_verify_worker import ATTEMPTS
from noisy_student_assets.core.grading import TIMEOUT_S, answers_equivalent, grade

GOLD = "7/3"  # no hostile answer holds it, so a True is a grading error
BOUND_S = 5 * ATTEMPTS * TIMEOUT_S + 10.0
"""A main-thread check past this counts as hung: its CPU bound on each attempt, plus starting a fresh helper after
each (about 0.4 s idle), on a machine loaded enough to stretch a CPU second into five. With two test workers and a
training run on 2 cores, a check outran the former bound of one wall second a CPU second, plus 7 s (11 s)."""
HANG_S = 60.0
"""Past this a check in a pool counts as hung (threads first wait for the helper they share)."""

HOSTILE = {
    "power tower": "9^{9^{9^{9}}}",
    "huge power": "10^{10^{10}}",
    "factorial of 1e8": "(10^{8})!",
    "nested factorials": "((99!)!)!",
    "1 MB of text": "x" * 1_000_000,
    "1 MB number": "7" * 1_000_000,
    "1 MB of braces": "{" * 500_000 + "}" * 500_000,
    "nested 15 deep": "(" * 15 + "1" + ")" * 15,
    "nested 200 deep": "{" * 200 + "1" + "}" * 200,
    "unbalanced braces": "\\frac{1}{{{2}",
    "division by zero": "\\frac{1}{0}",
    "unfinished frac": "\\frac{",
    "unfinished root": "\\sqrt[",
    "unclosed environment": "\\begin{cases} 1 & x",
    "matrix": "\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}",
    "integral": "\\int_0^{\\infty} e^{-x^{2}} dx",
    "divergent sum": "\\sum_{n=1}^{\\infty} n",
    "limit": "\\lim_{x \\to 0} \\frac{\\sin x}{x^{3}}",
    "chained relation": "a = b = c",
    "lonely carets": "^^^^_{_{}}",
    "backslashes": "\\\\\\\\\\\\",
    "dollars": "$$$$$$",
    "nested boxes": "\\boxed{\\boxed{\\boxed{}}}",
    "long text command": "\\text{" + "a" * 900 + "}",
    "undefined command": "\\foo{\\bar{1}}",
    "float overflow": "1e308*1e308",
    "nan": "nan",
    "infinity": "\\infty",
    "complex infinity": "zoo",
    "full-width digits": "\uff12\uff12",
    "arabic-indic digit": "\u0663",
    "emoji": "\U0001f642",
    "zero-width space": "1\u200b9",
    "right-to-left override": "\u202e5",
    "nul and bell": "\x00\x07\x08",
    "ansi escape": "\x1b[31m5\x1b[0m",
    "lone surrogate-like escape": "\\ud800",
    "newlines": "\n" * 10_000,
}


def _checks() -> list[tuple[str, str, object, tuple]]:
    """(name, path, function, args): each answer as consensus compares it and as a whole response."""
    return [
        check
        for name, answer in HOSTILE.items()
        for check in ((name, "consensus", answers_equivalent, (GOLD, answer)), (name, "reward", grade, (answer, GOLD)))
    ]


def _timed(function, args) -> tuple[object, float]:
    started = time.monotonic()
    return function(*args), time.monotonic() - started


def _grade_all(pool: Executor | None) -> dict[tuple[str, str], tuple[object, float]]:
    grading.clear_cache()  # every mode grades cold: a cached verdict would hide a slow check
    if pool is None:
        return {(name, path): _timed(function, args) for name, path, function, args in _checks()}
    futures = {(name, path): pool.submit(_timed, function, args) for name, path, function, args in _checks()}
    results = {}
    for key, future in futures.items():
        try:
            results[key] = future.result(timeout=HANG_S)
        except FutureTimeout:
            results[key] = ("hung", HANG_S)
    return results


def _summarize(mode: str, results: dict, run_summary) -> None:
    hung = [key for key, (verdict, _) in results.items() if verdict == "hung"]
    ungraded = [key for key, (verdict, _) in results.items() if verdict is None]
    (worst_name, worst_path), (_, worst_s) = max(results.items(), key=lambda item: item[1][1])
    run_summary(
        f"hostile answers, {mode}: {len(results)} checks of {len(HOSTILE)} answers, {len(ungraded)} ungraded, "
        f"{len(hung)} hung, worst {worst_s:.2f} s ({worst_name}, {worst_path})"
    )
    assert hung == []
    assert {key: verdict for key, (verdict, _) in results.items() if verdict not in (False, None)} == {}


def test_hostile_answers_in_the_main_thread(run_summary) -> None:
    results = _grade_all(None)
    _summarize("main thread", results, run_summary)
    assert {key: seconds for key, (_, seconds) in results.items() if seconds > BOUND_S} == {}


def test_hostile_answers_in_a_thread_pool(run_summary) -> None:
    with ThreadPoolExecutor(max_workers=4) as pool:
        # A thread's time includes waiting for the one grading helper its process's threads share.
        _summarize("4 threads", _grade_all(pool), run_summary)


def test_hostile_answers_in_worker_processes(run_summary) -> None:
    with ProcessPoolExecutor(max_workers=2, mp_context=multiprocessing.get_context("spawn")) as pool:
        _summarize("2 spawned processes", _grade_all(pool), run_summary)
