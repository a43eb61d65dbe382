"""Shared fixtures: offline hub settings, a temporary data lake, and a tiny random model built from
SmolLM2's real tokenizer (for tests where the model's skill does not matter)."""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import uuid
from collections.abc import Callable

# Tests run offline, on the CPU profile, whatever the caller's environment says.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.pop("NOISY_STUDENT_PROFILE", None)
os.environ["NOISY_STUDENT_RETRY_DELAY_S"] = "0"  # a retried step starts again at once
# A test process started in the background (CI's suites run beside each other; xdist's workers) inherits SIGINT
# ignored, and so would every process it starts: then the interrupt that stops them (`DagsterCli.stop`), as Ctrl-C
# stops them in a terminal, would do nothing. A handled signal is at its default again in a child.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

from pathlib import Path

# The test arms, for the code location loaded in-process and for the CLI and daemon the tests start.
TEST_EXPERIMENTS = Path(__file__).parent / "experiments"
os.environ["NOISY_STUDENT_EXPERIMENTS"] = str(TEST_EXPERIMENTS)

import pytest  # noqa: E402


def built_once(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], object]) -> Path:
    """`name`'s folder, which `build` filled once for the whole pytest run: the first xdist worker to ask builds it
    while the others wait on a lock, then every worker reads the same files (pytest-xdist's recipe for a session
    fixture made once). A session fixture is otherwise made once per worker: three workers, three of each model and
    lake. What it holds is read, never changed: a test that writes copies it."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the run's base folder, shared by its workers
    folder = root / "built-once"
    folder.mkdir(parents=True, exist_ok=True)
    target, done = folder / name, folder / f"{name}.done"
    with (folder / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(target, ignore_errors=True)  # a worker that failed halfway left this
            target.mkdir()
            build(target)
            done.touch()
    return target


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer Llama with random weights and SmolLM2's tokenizer and chat template, as safetensors."""
    from tools.tiny_models import tiny_random_model

    return built_once(tmp_path_factory, "tiny_model", tiny_random_model)


@pytest.fixture(scope="session")
def sevens_model_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model rewired to say mostly "7" or end its turn, so that rewards vary within a group
    (`tools.tiny_models.sevens_model`)."""
    from tools.tiny_models import sevens_model

    return built_once(tmp_path_factory, "sevens_model", lambda out: sevens_model(tiny_model_dir, out))


@pytest.fixture
def lake_root(tmp_path: Path) -> Path:
    root = tmp_path / "data_lake"
    root.mkdir()
    return root


@pytest.fixture
def ungraded_pair(monkeypatch) -> tuple[str, str]:
    """(gold, answer): each is checked against itself, or against "x", within the short CPU bound this fixture sets,
    but comparing the two takes seconds of CPU, so that check is ungraded - really, on both attempts."""
    from noisy_student_assets.core import grading

    monkeypatch.setattr(grading, "TIMEOUT_S", 0.6)
    return "\\cos(x)^{30}", "\\sin(x)^{30}"


_SUMMARY_LINES = pytest.StashKey[list[str]]()


@pytest.fixture
def run_summary(request: pytest.FixtureRequest):
    """Adds a line to the summary printed at the end of the pytest run (e.g. the hostile-answer suite's)."""
    return request.config.stash.setdefault(_SUMMARY_LINES, []).append


PROFILED_FILE_MIN_S = 10.0
"""Test files that took less (their tests' setup, call and teardown) are counted together in the profile."""


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    lines = config.stash.get(_SUMMARY_LINES, [])
    if lines:
        terminalreporter.section("noisy-student summary")
        for line in lines:
            terminalreporter.write_line(line)
    _print_seconds_per_file(terminalreporter)


def _print_seconds_per_file(terminalreporter) -> None:
    """The run's seconds per test file, slowest first, as pytest's --durations adds them up (every phase of every
    test): the per-file profile of docs/testing.md."""
    seconds: dict[str, float] = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            if isinstance(report, pytest.TestReport):
                path = report.nodeid.split("::")[0]
                seconds[path] = seconds.get(path, 0.0) + report.duration
    if not seconds:
        return
    terminalreporter.section("seconds per test file")
    for path, total in sorted(seconds.items(), key=lambda item: -item[1]):
        if total >= PROFILED_FILE_MIN_S:
            terminalreporter.write_line(f"{total:8.1f}  {path}")
    rest = [total for total in seconds.values() if total < PROFILED_FILE_MIN_S]
    terminalreporter.write_line(f"{sum(rest):8.1f}  {len(rest)} other files")
    terminalreporter.write_line(f"{sum(seconds.values()):8.1f}  in all, over {len(seconds)} files")


def _teacher_lake(root: Path, model_dir: Path) -> Path:
    from resources.data_lake import DataLake
    from tests.lakes import materialize
    from tests.tiny_configs import FOUNDATION, tiny_config

    lake = DataLake(root=str(root))
    materialize(lake, FOUNDATION, tiny_config(model_dir), arm="a")
    return root


def _copier(teacher: Path, tmp_path: Path):
    from resources.data_lake import DataLake

    copies = iter(range(1_000))

    def copy() -> DataLake:
        root = tmp_path / f"lake-{next(copies)}"
        shutil.copytree(teacher, root)
        return DataLake(root=str(root))

    return copy


@pytest.fixture(scope="session")
def teacher_lake(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    """A lake holding round 1's inputs for arm `a` (its problems and base model, split, labeled-RL teacher); copy it,
    see `lake_copy`."""
    return built_once(tmp_path_factory, "teacher_lake", lambda root: _teacher_lake(root, tiny_model_dir))


@pytest.fixture
def lake_copy(teacher_lake: Path, tmp_path: Path):
    """Copies of `teacher_lake` for a test to change: `lake_copy()` gives a fresh `DataLake` each call."""
    return _copier(teacher_lake, tmp_path)


@pytest.fixture(scope="session")
def sevens_teacher_lake(tmp_path_factory: pytest.TempPathFactory, sevens_model_dir: Path) -> Path:
    """`teacher_lake` from `sevens_model_dir`, whose samples answer (mostly "7"), so votes have a majority and
    dissent."""
    return built_once(tmp_path_factory, "sevens_teacher_lake", lambda root: _teacher_lake(root, sevens_model_dir))


@pytest.fixture
def sevens_lake_copy(sevens_teacher_lake: Path, tmp_path: Path):
    return _copier(sevens_teacher_lake, tmp_path)


INSPECTED_ARM = "a"


@pytest.fixture(scope="session")
def inspected_lake(sevens_teacher_lake: Path, sevens_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A lake holding a whole round 1 of arm `a` (`INSPECTED_ARM`), as `make run` leaves one: the samples, the
    verifier and its scores (every label source can judge them), the vote, the student, the labeled-only control and
    both evaluations; what the notebooks and the explorer are tested on. Read it, do not change it."""
    return built_once(
        tmp_path_factory, "inspected_lake", lambda root: _inspected_lake(root, sevens_teacher_lake, sevens_model_dir)
    )


def _inspected_lake(root: Path, sevens_teacher_lake: Path, sevens_model_dir: Path) -> None:
    from noisy_student_assets.core import layout
    from resources.data_lake import DataLake
    from tests.lakes import answerable_by_sevens, arms_instance, materialize
    from tests.tiny_configs import round_chain, round_names, tiny_config

    shutil.copytree(sevens_teacher_lake, root, dirs_exist_ok=True)
    lake, config = DataLake(root=str(root)), tiny_config(sevens_model_dir, rounds=1, tau=0.5)
    with arms_instance() as instance:
        materialize(
            lake,
            [layout.BASE_MODEL_EVAL, layout.UNLABELED_PROBLEMS, layout.VALIDATION_PROBLEMS, layout.LABELED_RL_EVAL],
            config,
            INSPECTED_ARM,
            instance=instance,
        )
        answerable_by_sevens(lake, INSPECTED_ARM)
        verifier = round_names(1, layout.VERIFIER, layout.VERIFIER_SCORES)
        materialize(lake, [*round_chain(1, layout.LABELED_ONLY), *verifier], config, INSPECTED_ARM, instance=instance)


@pytest.fixture
def fault(monkeypatch):
    """Inject a fault (tests/payload_faults/sitecustomize.py) into the payloads this test starts; afterwards, no
    process they started may remain."""
    from tests.faults import FAULTS_DIR, leftovers

    marker = uuid.uuid4().hex
    monkeypatch.setenv("NOISY_STUDENT_TEST_MARKER", marker)
    monkeypatch.setenv("PYTHONPATH", str(FAULTS_DIR))

    def inject(name: str) -> None:
        monkeypatch.setenv("NOISY_STUDENT_PAYLOAD_FAULT", name)

    yield inject
    assert leftovers(marker) == []


@pytest.fixture(scope="module")
def sft_set():
    """The SFT rows of `tests/training_data.votes` for a step of `TINY_SUPERVISED`."""
    from noisy_student_assets.core.pseudo_labels.student_data import sft_rows
    from noisy_student_assets.core.training.modes.sft import build_sft_dataset
    from tests.training_data import TINY_SUPERVISED, votes

    return build_sft_dataset(sft_rows(*votes(), group_size=TINY_SUPERVISED.num_generations), "", seed=0)


@pytest.fixture(scope="module")
def dpo_set():
    """The DPO pairs of `tests/training_data.votes` for a step of `TINY_SUPERVISED`."""
    from noisy_student_assets.core.pseudo_labels.student_data import dpo_pairs
    from noisy_student_assets.core.training.modes.dpo import build_dpo_dataset
    from tests.training_data import TINY_SUPERVISED, votes

    return build_dpo_dataset(dpo_pairs(*votes(), pairs_per_problem=TINY_SUPERVISED.num_generations // 2), "", seed=0)
