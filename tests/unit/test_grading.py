"""Answer extraction, math-verify grading and its CPU-time bound, with the real math-verify."""

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

import noisy_student_assets
from noisy_student_assets.core import grading
from noisy_student_assets.core.grading import (
    MAX_NESTING,
    answer_reward,
    answers_equivalent,
    extract_answer,
    format_reward,
    grade,
    is_gradable,
    is_literal_arithmetic,
    unevaluated,
)

DATA = Path(noisy_student_assets.__file__).parent / "data"
HANG_GUARD_S = 30.0
ROOT_OF_ONE = "\\sqrt{1}"  # the gold of the slow checks: against a plain number, a power tower is refused unparsed


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("She makes 9 * 2 = $18 a day.\n#### 18", "18"),
        ("#### 1,000\n", "1,000"),
        ("First \\boxed{1}, then \\boxed{2}.", "2"),
        ("$\\boxed{\\frac{\\sqrt{3}}{2}}$", "\\frac{\\sqrt{3}}{2}"),
        ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),
        ("so the answer is \\boxed 5.", "5"),
        ("\\fbox{7}", "7"),
        ("The answer is $\\boxed{5}$.", "5"),
        ("<think>2 + 2 = 4</think> <answer> 4 </answer>", "4"),
        ("<answer>The answer is \\boxed{3}.</answer>", "3"),
        ("<answer>1</answer> wait, no: <answer>2</answer>", "2"),
        ("<think>16 + 1 = 17</think> <answer>17", "17"),  # stop string "</answer>" cut off
        ("<answer> $12$. </answer>", "12"),
        ("\\boxed{1} <answer>2</answer>", "2"),
        ("#### 1\n so \\boxed{2}", "2"),
        ("She had 3 apples, so 1,000 - 3 = 997 are left.", "997"),
        ("The temperature is -4.5 degrees.", "-4.5"),
        ("the total is 1,000", "1000"),
        ("the probability is 3/4.", "3/4"),
        ("5-3", "3"),
        ("no numbers here", None),
        ("", None),
        ("<answer></answer>", None),
        ("\\boxed{}", None),
        (None, None),
    ],
)
def test_extract_answer(response, expected):
    assert extract_answer(response) == expected


@pytest.mark.parametrize(
    ("gold", "answer"),
    [
        ("1,000", "1000"),
        ("\\frac12", "0.5"),
        ("$18.00", "18"),
        ("\\$18.00", "18"),
        ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3, \\pi/2)"),
        ("\\text{(C)}", "C"),
        ("10\\%", "10"),
        ("\\frac{14}{3}", "4\\frac{2}{3}"),
        ("3\\sqrt{13}", "\\sqrt{117}"),
        ("1,2", "2,1"),
        ("1/2", "\\frac{1}{2}"),
        ("x=5", "5"),
    ],
)
def test_equivalent_forms(gold, answer):
    assert answers_equivalent(gold, answer)
    assert grade(f"So the answer is $\\boxed{{{answer}}}$.", gold)


@pytest.mark.parametrize(
    ("response", "gold", "expected"),
    [
        ("It costs $18.00 in total.", "18", True),
        ("#### 1,000", "1000", True),
        ("<answer>0.5</answer>", "\\frac{1}{2}", True),
        ("\\boxed{4}", "so it is \\boxed{4}.", True),  # a gold solution is reduced to its answer
        ("#### 4", "Add them.\n#### 4", True),
        ("\\boxed{5}", "6", False),
        ("\\boxed{1/2}", "1/3", False),
        ("#### 17", "18", False),
        ("\\boxed{x+1}", "x-1", False),
    ],
)
def test_grade(response, gold, expected):
    assert grade(response, gold) is expected
    assert answer_reward(response, gold) == float(expected)


@pytest.mark.parametrize(
    ("gold", "answer"),
    [
        ("3300", "60 * 55"),  # what products' seed 1 learned to answer (docs/results.md)
        ("3300", "60 \\times 55"),
        ("3300", "60\\,\\times\\,55"),
        ("3300", "\\left(60\\right) \\cdot \\left(55\\right)"),
        ("3300", "60 ⋅ 55"),
        ("3300", "(60)(55)"),
        ("3300", "6600:2"),
        ("14", "7 - 2 + 9"),
        ("2000", "2 \\times 10^3"),
        ("1024", "2^{10}"),
        ("1200000", "1.2 \\times 10^{6}"),
        ("60", "120/2"),
        ("60", "\\frac{120}{2}"),
        ("60", "120 \\over 2"),
        ("60", "\\sqrt{3600}"),
        ("60.0", "120/2"),  # an integral decimal is an integer
        ("10", "\\binom{5}{2}"),
        ("120", "5!"),
        ("2", "17 \\mod 5"),
        ("1", "\\cos 0"),
        ("0.5", "0.25 + 0.25"),
        ("0.5", "\\sqrt{0.25}"),
        ("3300", "60 * 55 = 3300"),  # the box holds the answer, not the working
        ("3300", "60(55)"),
        ("3025", "55\\text{}^{2}"),  # a power behind an empty "unit"
        ("3300", "10\\text{}^{\\log_{10}(60)+\\log_{10}(55)}"),
    ],
)
def test_an_unevaluated_expression_is_not_a_numeric_answer(gold, answer):
    assert unevaluated(gold, answer)
    assert answers_equivalent(gold, answer) is False
    assert answers_equivalent(answer, gold) is False  # the vote compares answers both ways round
    assert grade(f"\\boxed{{{answer}}}", gold) is False


@pytest.mark.parametrize(
    ("number", "answer"),
    [
        ("3300", "3300"),
        ("-5", "-5"),
        ("1,000", "1000"),
        ("3300", "3,300.00"),
        ("18", "18.00"),
        ("18", "{18}"),
        ("5", "x=5"),
        ("5", "x = 5"),
        ("18", "\\$18"),
        ("1000", "\\$1,000.00"),
        ("25", "25\\%"),
        ("18", "18 \\text{ dollars}"),
        ("864", "864 \\mbox{ inches}^2"),
        ("5", "5\\textrm{ cm}^2"),
        ("5", "5\\ {\\rm cm}^2"),
        ("5", "5\\text{ cm}^{\\text{2}}"),
        ("90", "90^{\\circ}"),
        ("90", "90^\\circ"),
        ("90", "90^{\\circ}\\text{C}"),
        ("0.5", "1/2"),
        ("0.5", "\\frac{1}{2}"),
        ("3.5", "7/2"),
        ("3.5", "3\\frac{1}{2}"),
        ("0.35625", ".35625"),
        ("52", "52_8"),
        ("4210", "4210_{5}"),  # MATH-500 golds
        ("18", "\\textbf{18}"),
        ("18", "\\mathbf{18}"),
        ("18", "+18"),
        ("18", "(18)"),
        ("18", "\\left(18\\right)"),
        ("1000", "1{,}000"),
        ("-0.5", "\\frac{-1}{2}"),
        ("18", "\\text{Total} = 18"),
        ("18", "x = 18 \\text{ cm}"),
    ],
)
def test_final_forms_are_not_unevaluated(number, answer):
    assert not unevaluated(number, answer)
    assert answers_equivalent(number, answer)


@pytest.mark.parametrize(
    ("answer", "restated"),
    [
        ("60 * 55", True),
        ("7 - 2 + 9", True),
        ("(60)(55)", True),
        ("60 \\times 55", True),
        ("$12 \\div 4$", True),
        ("60 − 55", True),
        ("60(55)", True),
        ("60{\\times}55", True),
        ("60 \\mathbin{\\times} 55", True),
        ("2^{3}+1", True),
        ("\\frac{1}{2} + \\frac{1}{4}", True),
        ("60\\times55\\text{ cm}", True),
        ("3/4", False),
        ("2^{10}", False),
        ("-5", False),
        ("1,000", False),
        ("\\frac{1}{2}", False),
        ("x+1", False),
        ("3 + 2i", False),
        ("1-\\sqrt{2}", False),
        ("12", False),
        ("(3,-4)", False),
        ("(-1)^{2}", False),
        ("(18)", False),
        ("\\pm 2", False),
        ("1\\frac{4}{5}", False),
        ("137 \\frac{1}{2}", False),
        (None, False),
    ],
)
def test_literal_arithmetic_is_a_restated_question_and_never_gradable(answer, restated):
    assert is_literal_arithmetic(answer) is restated
    if answer is not None:
        assert is_gradable(answer) is not restated


@pytest.mark.parametrize(
    ("response", "gold"),
    [(None, "1"), ("\\boxed{1}", None), ("", "1"), ("\\boxed{1}", ""), ("\\boxed{}", ""), ("no answer", "1")],
)
def test_missing_response_or_gold_is_wrong(response, gold):
    assert grade(response, gold) is False


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("so \\boxed{5}", 1.0),
        ("<think>...</think> <answer>5</answer>", 1.0),
        ("#### 5", 1.0),
        ("\\boxed{wrong but formatted}", 1.0),
        ("the answer is 5", 0.0),
        ("\\boxed{}", 0.0),
        ("<answer> </answer>", 0.0),
        ("", 0.0),
        (None, 0.0),
    ],
)
def test_format_reward(response, expected):
    assert format_reward(response) == expected


@pytest.mark.parametrize(("answer", "expected"), [("1/2", True), ("", False), (None, False), ("1" * 2000, False)])
def test_is_gradable(answer, expected):
    assert is_gradable(answer) is expected


def test_extraction_of_a_megabyte_is_fast():
    megabyte = "{" * 500_000 + "1 " * 250_000
    started = time.perf_counter()
    for text in (megabyte, "\\boxed{" + megabyte, " " * 1_000_000 + "x", "1,111" * 200_000, "####" * 250_000):
        extract_answer(text)
    assert time.perf_counter() - started < HANG_GUARD_S  # a quadratic scan of 1 MB would take far longer


@pytest.mark.parametrize(
    ("response", "gold", "verdict"),
    [
        ("\\boxed{9^{9^{9^{9}}}}", ROOT_OF_ONE, None),  # out of CPU time on both attempts: ungraded
        ("\\boxed{(10^{8})!}", ROOT_OF_ONE, None),
        ("x" * 1_000_000, "1", False),
        ("7" * 1_000_000, "7", False),
        ("\\boxed{" + "{" * 500_000 + "}" * 500_000, "1", False),
        ("\\boxed{" + "(" * MAX_NESTING + "1" + ")" * MAX_NESTING + "}", "2", False),  # at the nesting cap: parsed
        ("\\boxed{" + "{" * 100 + "1" + "}" * 100 + "}", "1", False),  # over it: rejected unparsed
    ],
    ids=["power-tower", "factorial", "1MB-text", "1MB-number", "1MB-braces", "nested-at-cap", "nested-100"],
)
def test_pathological_inputs_are_wrong_or_ungraded_not_hung(response, gold, verdict):
    started = time.monotonic()
    assert grade(response, gold) is verdict
    assert time.monotonic() - started < HANG_GUARD_S


def test_bound_holds_in_a_thread():
    # math-verify itself raises outside the main thread: its timeouts use signal.alarm.
    results = []
    checks = [("\\boxed{9^{9^{9^{8}}}}", ROOT_OF_ONE), ("\\boxed{1/2}", "0.5")]
    thread = threading.Thread(target=lambda: results.extend(grade(*check) for check in checks))
    thread.start()
    thread.join(HANG_GUARD_S)
    assert results == [None, True]


def test_bound_holds_in_a_thread_pool():
    responses = ["\\boxed{9^{9^{9^{7}}}}", "\\boxed{2}", "\\boxed{7^{7^{7^{7}}}}", "#### 2.0"]
    with ThreadPoolExecutor(max_workers=4) as pool:
        assert list(pool.map(lambda r: grade(r, "x=2"), responses, timeout=HANG_GUARD_S)) == [None, True, None, True]


def test_a_check_out_of_cpu_time_is_ungraded_and_its_worker_replaced():
    assert grade("\\boxed{\\frac{6}{18}}", "1/3")  # a pair no other test grades: a cached verdict would start no helper
    hung_worker = helper_pids()
    assert grade("\\boxed{9^{9^{9^{6}}}}", ROOT_OF_ONE, timeout_s=0.2) is None
    assert hung_worker and not hung_worker & helper_pids(), "the worker that ran out of time was killed"
    assert grade("\\boxed{\\frac{1}{4}}", "0.25")
    assert helper_pids(), "a fresh worker serves the next check"
    assert not any(psutil.pid_exists(pid) for pid in hung_worker), "the killed worker was reaped, not left a zombie"


def helper_pids() -> set[int]:
    pids = set()
    for child in psutil.Process().children():
        try:
            if any("_math_verify_worker" in arg for arg in child.cmdline()):
                pids.add(child.pid)
        except psutil.Error:  # other tests' exited subprocesses (zombies) have no command line
            continue
    return pids


# Each test's slow answer is its own, so that no cached verdict answers it.
@pytest.mark.parametrize(("start_method", "slow_answer"), [("fork", "9^{9^{9^{5}}}"), ("spawn", "8^{8^{8^{8}}}")])
def test_bound_holds_in_worker_processes(start_method, slow_answer):
    assert grade("\\boxed{6}", "6")
    helpers = helper_pids()
    context = multiprocessing.get_context(start_method)
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        checks = [
            pool.submit(answers_equivalent, ROOT_OF_ONE, slow_answer, timeout_s=0.2),
            pool.submit(grade, "#### 8", "8"),
        ]
        assert [check.result(timeout=HANG_GUARD_S) for check in checks] == [None, True]
    # The child killed a helper of its own: a forked child must not use or kill its parent's.
    assert helper_pids() == helpers
    assert grade("\\boxed{6}", "6.0")


@contextmanager
def starved_helpers(runs_s: float = 0.02, stops_s: float = 0.5) -> Iterator[None]:
    """Every grading helper of this process gets the CPU for ``runs_s`` of each ``runs_s + stops_s``
    (SIGSTOP/SIGCONT): a helper descheduled on a loaded machine, its checks slowed some 25 times."""
    done = threading.Event()

    def starve() -> None:
        while not done.is_set():
            stopped = helper_pids()
            for pid in stopped:
                os.kill(pid, signal.SIGSTOP)
            if stopped:  # else look again soon, to catch a helper as it starts
                done.wait(stops_s)
            for pid in stopped:
                os.kill(pid, signal.SIGCONT)  # a killed helper is a zombie until reaped: the signal is lost
            time.sleep(runs_s)

    starver = threading.Thread(target=starve, daemon=True)
    starver.start()
    try:
        yield
    finally:
        done.set()
        starver.join()


def test_a_starved_warm_up_or_check_grades_right():
    grading.clear_cache()
    grading._worker.close()  # the next check starts a helper, whose warm-up parses "1"
    checks = [("1", "1"), ("3\\sqrt{13}", "\\sqrt{117}")]  # the second spends a tenth of a CPU second
    with starved_helpers():
        assert [answers_equivalent(*check) for check in checks] == [True, True], (
            "CPU time bounds a check, not wall time"
        )
    assert [answers_equivalent(*check) for check in checks] == [True, True]


def test_a_stopped_check_is_retried_and_never_cached_wrong():
    assert answers_equivalent("2", "2")  # a started helper, past its warm-up
    stopped = helper_pids()
    for pid in stopped:
        os.kill(pid, signal.SIGSTOP)  # no CPU time passes: only the wall-clock backstop ends the check
    verdict = answers_equivalent("\\frac{5}{8}", "0.625", timeout_s=0.2)
    assert verdict is True, "retried on a fresh helper"
    assert not any(psutil.pid_exists(pid) for pid in stopped), "the stopped helper was killed and reaped"
    assert answers_equivalent("\\frac{5}{8}", "0.625", timeout_s=0.2) is True


def test_worker_exits_with_its_caller():
    script = (
        "import psutil\n"
        "from noisy_student_assets.core.grading import grade\n"
        "assert grade('\\\\boxed{1}', '1')\n"
        "print(*[p.pid for p in psutil.Process().children()])\n"
    )
    finished = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=True,
        timeout=HANG_GUARD_S,
        cwd=Path(noisy_student_assets.__file__).parents[1],
    )
    worker_pids = [int(pid) for pid in finished.stdout.split()]
    assert len(worker_pids) == 1
    assert not psutil.pid_exists(worker_pids[0])


def test_every_math500_solution_grades_as_its_answer():
    rows = read_jsonl(DATA / "math500" / "test.jsonl")
    assert len(rows) == 500
    failures = [row["unique_id"] for row in rows if not grade(row["solution"], row["answer"])]
    assert failures == []


# Neighbouring MATH-500 answers that differ as strings but are rightly equivalent.
EQUIVALENT_NEIGHBOURS = {("5", "x=5")}


def test_math500_solutions_grade_wrong_against_the_next_answer():
    rows = read_jsonl(DATA / "math500" / "test.jsonl")
    accepted = {
        (row["answer"], following["answer"])
        for row, following in zip(rows, rows[1:] + rows[:1], strict=True)
        if row["answer"] != following["answer"] and grade(row["solution"], following["answer"])
    }
    assert accepted <= EQUIVALENT_NEIGHBOURS


def test_every_gsm8k_solution_grades_as_its_answer_and_not_the_next():
    rows = read_jsonl(DATA / "gsm8k" / "test.jsonl")
    assert len(rows) == 1319
    golds = [row["answer"].rsplit("####", 1)[1].strip() for row in rows]
    assert [row["question"] for row, gold in zip(rows, golds, strict=True) if not grade(row["answer"], gold)] == []
    wrongly_accepted = [
        (gold, following)
        for row, gold, following in zip(rows, golds, golds[1:] + golds[:1], strict=True)
        if gold != following and grade(row["answer"], following)
    ]
    assert wrongly_accepted == []


def test_clear_cache_makes_the_next_check_cold():
    answers_equivalent("1/2", "0.5")
    grading.clear_cache()
    assert grading._verdict.cache_info().currsize == 0
    assert answers_equivalent("1/2", "0.5")
    assert grading._verdict.cache_info().misses == 1


def test_an_ungraded_check_is_not_cached():
    grading.clear_cache()
    assert answers_equivalent(ROOT_OF_ONE, "9^{9^{9^{7}}}", timeout_s=0.2) is None
    assert grading._verdict.cache_info().currsize == 0


BUSY_CALLER = r"""
import sys
from noisy_student_assets.core.grading import answers_equivalent
print(answers_equivalent(r"\frac{1}{2}", "0.5"), flush=True)  # the helper started and ready
answers_equivalent(sys.argv[1], sys.argv[2], timeout_s=600)  # and busy for its CPU bound
"""


def test_a_helper_dies_with_its_caller_s_process_group_even_mid_check():
    """A grid killed with its process group left its grading helper running, busy until its check's CPU bound ran
    out: the helper was in a session of its own. It is in its caller's group now, ignoring only SIGINT."""
    caller = subprocess.Popen(
        [sys.executable, "-c", BUSY_CALLER, ROOT_OF_ONE, "9^{9^{9^{9}}}"],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        cwd=Path(noisy_student_assets.__file__).parents[1],
    )
    try:
        assert caller.stdout.readline().strip() == "True"
        (helper,) = [
            child
            for child in psutil.Process(caller.pid).children()
            if "_math_verify_worker" in " ".join(child.cmdline())
        ]
        assert os.getpgid(helper.pid) == caller.pid, "a SIGKILL to the caller's group reaches the helper"
        ignored = int(Path(f"/proc/{helper.pid}/status").read_text().split("SigIgn:")[1].split()[0], 16)
        assert ignored & (1 << (signal.SIGINT - 1)), "a Ctrl-C is the caller's to handle"
    finally:
        os.killpg(caller.pid, signal.SIGKILL)
        caller.wait()
    _, alive = psutil.wait_procs([helper], timeout=HANG_GUARD_S)
    assert not alive, "the helper ended with its group, mid-check"
