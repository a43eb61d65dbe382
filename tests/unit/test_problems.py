"""Problem loading, validation, splitting and fingerprinting on the shipped data and real temporary files."""

import inspect
import json
import re
from pathlib import Path

import datasets
import polars as pl
import pytest

from noisy_student_assets.core.problems import (
    HIDDEN_GOLD_COLUMN,
    LOADERS,
    PROBLEM_KINDS,
    PROBLEM_SCHEMA,
    UNLABELED_SCHEMA,
    ProblemFormatError,
    drop_overlap,
    eval_halves,
    fingerprint,
    kind_fields,
    load_problems,
    problems_from_records,
    split_problems,
)
from noisy_student_assets.core.settings import SOURCE_KIND_FIELDS, ProblemSource

# The default CPU task: "What is 47 + 38?"-style sums of two numbers. allow_parentheses=False selects
# reasoning_gym's simple generator; the default (parenthesised) one also emits negative operands.
TWO_DIGIT_ADDITION = {
    "min_terms": 2,
    "max_terms": 2,
    "min_digits": 2,
    "max_digits": 2,
    "operators": ("+",),
    "allow_parentheses": False,
    "format_style": "natural",
}


def write_jsonl(path: Path, lines: list[object]) -> Path:
    """One line per item: strings verbatim (to write broken JSON), anything else as JSON."""
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


def small_table(n: int) -> pl.DataFrame:
    rows = [{"problem_id": f"p{i:02d}", "question": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(n)]
    return problems_from_records(rows, source="test", id_prefix="test")


def test_gsm8k_rows_normalise():
    problems = load_problems("gsm8k", split="train")
    assert problems.row(0, named=True) == {
        "problem_id": "gsm8k/train/00000",
        "prompt": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
        "How many clips did Natalia sell altogether in April and May?",
        "gold_answer": "72",
        "source": "gsm8k:train",
        "subject": None,
        "level": None,
    }
    # line 346 ends "#### 1,080": thousands separators are dropped, as in GSM8K's own answer extraction
    assert problems.row(345, named=True)["gold_answer"] == "1080"


def test_math500_rows_normalise():
    first = load_problems("math500", split="test").row(0, named=True)
    assert first == {
        "problem_id": "math500/test/precalculus/807",
        "prompt": "Convert the point $(0,3)$ in rectangular coordinates to polar coordinates.  Enter your answer in "
        "the form $(r,\\theta),$ where $r > 0$ and $0 \\le \\theta < 2 \\pi.$",
        "gold_answer": "\\left( 3, \\frac{\\pi}{2} \\right)",
        "source": "math500:test",
        "subject": "Precalculus",
        "level": 2,
    }


@pytest.mark.parametrize(
    ("kind", "split", "rows"), [("gsm8k", "train", 7473), ("gsm8k", "test", 1319), ("math500", "test", 500)]
)
def test_shipped_sets_have_documented_sizes_and_unique_ids(kind, split, rows):
    problems = load_problems(kind, split=split)
    assert problems.schema == PROBLEM_SCHEMA
    assert problems.height == rows
    assert problems["problem_id"].n_unique() == rows


def test_size_keeps_the_head():
    assert load_problems("gsm8k", split="test", size=3).equals(load_problems("gsm8k", split="test").head(3))


def test_shipped_split_must_exist():
    with pytest.raises(ValueError, match=r"math500 ships splits \('test',\), got 'train'"):
        load_problems("math500", split="train")


def test_reasoning_gym_is_deterministic_per_seed():
    def generate(seed: int) -> pl.DataFrame:
        return load_problems("reasoning_gym", name="basic_arithmetic", size=20, seed=seed)

    first = generate(3)
    assert first.schema == PROBLEM_SCHEMA
    assert first.equals(generate(3))
    assert first["prompt"].to_list() != generate(4)["prompt"].to_list()
    assert first["problem_id"][0] == "reasoning_gym/basic_arithmetic/s3/00000"
    assert set(first["source"]) == {"reasoning_gym:basic_arithmetic"}
    assert set(first["subject"]) == {"basic_arithmetic"}


def test_two_digit_addition_problems_and_golds():
    problems = load_problems(
        "reasoning_gym", name="basic_arithmetic", size=200, seed=0, task_options=TWO_DIGIT_ADDITION
    )
    assert problems.height == 200
    assert problems["level"].null_count() == 200  # basic_arithmetic reports config ranges, not a level
    sums = 0
    for prompt, gold in problems.select("prompt", "gold_answer").iter_rows():
        match = re.fullmatch(r"(?:What is|Solve|Compute|Evaluate:) (\d+) \+ (\d+)[.?]", prompt)
        assert match, prompt
        left, right = int(match[1]), int(match[2])
        # reasoning_gym draws operands from 0..10**digits inclusive, so a few are 0-9 or 100
        assert 0 <= left <= 100 and 0 <= right <= 100
        assert gold == str(left + right)
        sums += 10 <= left <= 99 and 10 <= right <= 99
    assert sums > 120  # mostly two two-digit operands
    assert "What is 47 + 77?" in problems["prompt"].to_list()


def test_reasoning_gym_int_difficulty_becomes_level():
    problems = load_problems("reasoning_gym", name="bitwise_arithmetic", size=2, seed=0, task_options={"difficulty": 2})
    assert problems["level"].to_list() == [2, 2]


def test_reasoning_gym_needs_a_size():
    with pytest.raises(ValueError, match="size >= 1"):
        load_problems("reasoning_gym", name="basic_arithmetic")


def test_jsonl_file_with_default_fields(tmp_path):
    path = write_jsonl(
        tmp_path / "mine.jsonl",
        [
            {"question": "Add 2 and 3.", "answer": "She adds.\n#### 5"},
            "",  # blank lines are skipped
            {"prompt": " Big? ", "gold_answer": "Total\n#### 1,250", "subject": "money", "level": 3},
            {"problem": "Count.", "answer": 42, "problem_id": "mine-7", "level": "Level 4"},
            {"problem": "Halve 5.", "answer": 2.5},
            {"problem": "Double 1.5.", "answer": 3.0},
            {"problem": "Tuple?", "answer": "(1, 2)"},
        ],
    )
    problems = load_problems("file", path=str(path))
    assert problems.schema == PROBLEM_SCHEMA
    assert set(problems["source"]) == {"file:mine.jsonl"}
    assert problems.drop("source").rows() == [
        ("file/mine/00000", "Add 2 and 3.", "5", None, None),
        ("file/mine/00001", "Big?", "1250", "money", 3),
        ("mine-7", "Count.", "42", None, 4),
        ("file/mine/00003", "Halve 5.", "2.5", None, None),
        ("file/mine/00004", "Double 1.5.", "3", None, None),
        ("file/mine/00005", "Tuple?", "(1, 2)", None, None),
    ]
    assert load_problems("file", path=str(path), size=2).equals(problems.head(2))


def test_parquet_file_with_field_mapping(tmp_path):
    path = tmp_path / "quiz.parquet"
    pl.DataFrame(
        {
            "text": ["1 + 1?", "2 * 3?"],
            "solution": ["1 + 1 = 2\n#### 2", "6"],
            "answer": ["wrong", "wrong"],
            "level": [1, None],
        }
    ).write_parquet(path)
    problems = load_problems("file", path=str(path), prompt_field="text", answer_field="solution")
    assert problems.schema == PROBLEM_SCHEMA
    assert problems.select("problem_id", "prompt", "gold_answer", "source", "level").rows() == [
        ("file/quiz/00000", "1 + 1?", "2", "file:quiz.parquet", 1),
        ("file/quiz/00001", "2 * 3?", "6", "file:quiz.parquet", None),
    ]


SECOND_ROW = "file:bad.jsonl line 2 (id file/bad/00001)"


@pytest.mark.parametrize(
    ("bad_line", "message"),
    [
        ({"question": "Q?"}, f"{SECOND_ROW}: missing answer"),
        ({"question": "Q?", "answer": None}, f"{SECOND_ROW}: missing answer"),
        ({"question": "Q?", "answer": ["1"]}, f"{SECOND_ROW}: answer must be a string or a number, not list"),
        ({"question": "Q?", "answer": True}, f"{SECOND_ROW}: answer must be a string or a number, not bool"),
        ({"question": "Q?", "answer": float("nan")}, f"{SECOND_ROW}: answer nan is not a finite number"),
        ({"question": "Q?", "answer": " "}, f"{SECOND_ROW}: empty answer"),
        ({"question": "Q?", "answer": "work\n####  "}, f"{SECOND_ROW}: empty answer"),
        ({"question": " \n", "answer": "1"}, f"{SECOND_ROW}: empty prompt"),
        ({"answer": "1"}, f"{SECOND_ROW}: missing prompt"),
        ({"question": 7, "answer": "1"}, f"{SECOND_ROW}: prompt must be a string, not int"),
        (
            {"question": "Q?", "answer": "1", "problem_id": "dup"},
            "file:bad.jsonl line 2 (id dup): duplicate problem_id (first used at line 1)",
        ),
        ('{"question": "Q?", "answer": ', "file:bad.jsonl line 2: invalid JSON"),
        ("[1, 2]", "file:bad.jsonl line 2: expected a JSON object, got list"),
    ],
)
def test_malformed_jsonl_rows_are_named(tmp_path, bad_line, message):
    path = write_jsonl(tmp_path / "bad.jsonl", [{"question": "Fine?", "answer": "1", "problem_id": "dup"}, bad_line])
    with pytest.raises(ProblemFormatError, match=re.escape(message)):
        load_problems("file", path=str(path))


def test_malformed_parquet_row_is_named(tmp_path):
    path = tmp_path / "bad.parquet"
    pl.DataFrame({"question": ["A?", "B?"], "answer": ["1", None]}).write_parquet(path)
    expected = "file:bad.parquet row 1 (id file/bad/00001): missing answer"
    with pytest.raises(ProblemFormatError, match=re.escape(expected)):
        load_problems("file", path=str(path))


def test_gsm8k_format_requires_the_marker(tmp_path):
    path = write_jsonl(
        tmp_path / "gsm.jsonl",
        [{"question": "Q1?", "answer": "3 + 4 = 7\n#### 7"}, {"question": "Q2?", "answer": "The answer is 7."}],
    )
    expected = "gsm8k:train line 2 (id gsm8k/train/00001): answer has no '#### <final answer>' marker"
    with pytest.raises(ProblemFormatError, match=re.escape(expected)):
        load_problems("gsm8k", path=str(path))
    # only the kept head is read and validated
    assert load_problems("gsm8k", path=str(path), size=1)["gold_answer"].to_list() == ["7"]


def test_unsupported_file_type(tmp_path):
    with pytest.raises(ValueError, match=r"expected a \.jsonl or \.parquet file"):
        load_problems("file", path=str(tmp_path / "problems.csv"))


def test_hf_rows_map_like_files():
    dataset = datasets.Dataset.from_list(
        [
            # Hendrycks-MATH style levels; "Level ?" occurs there and becomes null
            {"problem": "Find x.", "solution": "x = \\boxed{2}", "answer": "2", "level": "Level 5"},
            {"problem": "Find y.", "solution": "y = \\boxed{3}", "answer": "3", "level": "Level ?"},
            {"problem": "Find z.", "solution": "z = \\boxed{4}", "answer": "4", "level": "Level 1"},
        ]
    )
    problems = problems_from_records(dataset, source="hf:org/math", id_prefix="hf/org/math/test", size=2)
    assert problems.schema == PROBLEM_SCHEMA
    assert problems.select("problem_id", "prompt", "gold_answer", "source", "level").rows() == [
        ("hf/org/math/test/00000", "Find x.", "2", "hf:org/math", 5),
        ("hf/org/math/test/00001", "Find y.", "3", "hf:org/math", None),
    ]


def test_split_is_seeded_disjoint_and_hides_gold():
    problems = small_table(30)
    labeled, unlabeled, _ = split_problems(problems, 5, 10, seed=7)
    assert labeled.schema == PROBLEM_SCHEMA
    assert unlabeled.schema == UNLABELED_SCHEMA
    assert unlabeled.columns[-1] == HIDDEN_GOLD_COLUMN
    assert "gold_answer" not in unlabeled.columns
    assert (labeled.height, unlabeled.height) == (5, 10)
    assert not set(labeled["problem_id"]) & set(unlabeled["problem_id"])
    gold_by_id = dict(problems.select("problem_id", "gold_answer").iter_rows())
    hidden = unlabeled.select("problem_id", HIDDEN_GOLD_COLUMN).iter_rows()
    assert all(gold_by_id[problem_id] == gold for problem_id, gold in hidden)

    again_labeled, again_unlabeled, _ = split_problems(problems.reverse(), 5, 10, seed=7)
    assert again_labeled.equals(labeled) and again_unlabeled.equals(unlabeled)
    other_labeled, _, _ = split_problems(problems, 5, 10, seed=8)
    assert other_labeled["problem_id"].to_list() != labeled["problem_id"].to_list()


def test_validation_problems_keep_their_gold_and_leave_the_other_sets_as_they_were():
    problems = small_table(30)
    labeled, unlabeled, validation = split_problems(problems, 5, 10, seed=7, n_validation=8)
    assert validation.schema == PROBLEM_SCHEMA and validation.height == 8
    assert not set(validation["problem_id"]) & (set(labeled["problem_id"]) | set(unlabeled["problem_id"]))
    without, unlabeled_without, empty = split_problems(problems, 5, 10, seed=7)
    assert without.equals(labeled) and unlabeled_without.equals(unlabeled) and empty.height == 0


def test_the_validation_draw_depends_on_its_size_and_the_seed_alone():
    problems = small_table(30)
    _, _, validation = split_problems(problems, 5, 10, seed=7, n_validation=8)
    for n_labeled, n_unlabeled in ((1, 1), (12, 3), (2, 20)):
        labeled, unlabeled, same = split_problems(problems, n_labeled, n_unlabeled, seed=7, n_validation=8)
        assert same.equals(validation), (n_labeled, n_unlabeled)
        assert (labeled.height, unlabeled.height) == (n_labeled, n_unlabeled)
        assert not set(validation["problem_id"]) & (set(labeled["problem_id"]) | set(unlabeled["problem_id"]))
    _, _, other_seed = split_problems(problems, 5, 10, seed=8, n_validation=8)
    assert other_seed["problem_id"].to_list() != validation["problem_id"].to_list()


def test_a_test_time_split_takes_the_whole_transductive_half_and_keeps_the_rest():
    pool, held_out = (
        small_table(30),
        small_table(11).with_columns(pl.format("eval/{}", "problem_id").alias("problem_id")),
    )
    transductive, transfer = eval_halves(held_out)
    assert (transductive.height, transfer.height) == (6, 5)
    assert not set(transductive["problem_id"]) & set(transfer["problem_id"])
    assert eval_halves(held_out.reverse())[0].equals(transductive)  # a fixed cut: no seed, no row order
    labeled, unlabeled, validation = split_problems(pool, 5, 4, seed=7, n_validation=8, unlabeled_pool=transductive)
    pool_labeled, _, pool_validation = split_problems(pool, 5, 4, seed=7, n_validation=8)
    assert labeled.equals(pool_labeled) and validation.equals(pool_validation)  # labeled RL is the pool arm's
    assert unlabeled.schema == UNLABELED_SCHEMA and set(unlabeled["problem_id"]) == set(transductive["problem_id"])
    gold_by_id = dict(held_out.select("problem_id", "gold_answer").iter_rows())
    assert all(gold_by_id[pid] == gold for pid, gold in unlabeled.select("problem_id", HIDDEN_GOLD_COLUMN).iter_rows())
    # 30 pool problems suffice for 5 labeled + 25 validation: the unlabeled ones come from elsewhere
    assert split_problems(pool, 5, 0, seed=0, n_validation=25, unlabeled_pool=transductive)[2].height == 25
    with pytest.raises(ValueError, match="non-empty transductive half"):
        split_problems(pool, 5, 0, seed=0, unlabeled_pool=transductive.clear())


def test_split_rejects_impossible_sizes():
    problems = small_table(10)
    with pytest.raises(
        ValueError, match=r"6 labeled \+ 5 unlabeled \+ 0 validation = 11 problems, but the table has only 10"
    ):
        split_problems(problems, 6, 5, seed=0)
    with pytest.raises(
        ValueError, match="n_unlabeled >= 1 and n_validation >= 0, got n_labeled=3, n_unlabeled=0, n_validation=0"
    ):
        split_problems(problems, 3, 0, seed=0)
    with pytest.raises(
        ValueError, match=r"^n_labeled >= 1 and n_validation >= 0, got n_labeled=0"
    ):  # test-time: n_unlabeled unread
        split_problems(problems, 0, 0, seed=0, unlabeled_pool=problems)


def test_drop_overlap_ignores_case_and_whitespace():
    problems = small_table(4)
    reference = pl.DataFrame(
        {"problem_id": ["x", "y", "p03"], "prompt": ["  what IS 1 +\n1? ", "What is 3 + 1", "another prompt"]}
    )
    assert drop_overlap(problems, reference)["problem_id"].to_list() == ["p00", "p02"]  # p03: same id, other text


def test_fingerprint_is_stable_and_content_sensitive():
    problems = small_table(3)
    assert fingerprint(problems) == "c51c2d3b770fc3b8"  # pinned: must not change across runs or machines
    assert fingerprint(problems) == fingerprint(small_table(3))
    assert fingerprint(problems) != fingerprint(problems.with_columns(pl.lit("9").alias("gold_answer")))
    assert fingerprint(problems) != fingerprint(problems.reverse())


def test_unknown_kind_lists_valid_kinds():
    expected = "unknown problem kind 'csv'; valid kinds: gsm8k, math500, reasoning_gym, file, hf"
    with pytest.raises(ValueError, match=expected):
        load_problems("csv")


def test_a_source_field_no_kind_reads_is_refused() -> None:
    with pytest.raises(TypeError, match="no source field splitt"):
        load_problems("gsm8k", splitt="test")


def test_each_kind_of_the_registry_has_a_loader_reading_exactly_its_source_fields() -> None:
    """`settings.SOURCE_KIND_FIELDS` is the one registry of problem kinds: a kind without a loader, a loader of no
    kind, or a loader whose parameters are not the fields its kind's sources may set, fails here."""
    assert LOADERS.keys() == SOURCE_KIND_FIELDS.keys() and tuple(SOURCE_KIND_FIELDS) == PROBLEM_KINDS
    for kind, loader in LOADERS.items():
        assert tuple(inspect.signature(loader).parameters) == kind_fields(kind), kind
        assert set(SOURCE_KIND_FIELDS[kind]) <= set(ProblemSource.model_fields), kind
