"""Problem tables: load shipped, generated and user problem sets into one schema, split and fingerprint them.

Every loader returns a polars DataFrame with exactly PROBLEM_SCHEMA (same columns, dtypes and order) and
validates every row the same way: a non-empty string prompt, a unique problem_id, and an answer that is a
non-empty string or a number (JSON 42 -> "42", 2.5 -> "2.5", 3.0 -> "3"; null, bools, lists, dicts and NaN are
rejected). A malformed row raises ProblemFormatError naming the source, the row (JSONL line number, else 0-based
row index) with its problem id, and the cause.
"""

import hashlib
import json
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from itertools import islice
from pathlib import Path

import polars as pl

from noisy_student_assets.core.settings import SOURCE_KIND_FIELDS

PROBLEM_SCHEMA = pl.Schema(
    {
        "problem_id": pl.Utf8,
        "prompt": pl.Utf8,
        "gold_answer": pl.Utf8,
        "source": pl.Utf8,
        "subject": pl.Utf8,
        "level": pl.Int64,
    }
)
HIDDEN_GOLD_COLUMN = "hidden_gold_answer"
# Unlabeled problems keep their gold answer only under a name no training code reads (for later evaluation).
UNLABELED_SCHEMA = pl.Schema(
    {name: dtype for name, dtype in PROBLEM_SCHEMA.items() if name != "gold_answer"} | {HIDDEN_GOLD_COLUMN: pl.Utf8}
)
EVAL_HALVES_SALT = "eval-halves"
"""Salts the fixed cut of the held-out set into its transductive and transfer halves (`eval_halves`)."""

DATA_DIR = Path(__file__).parents[1] / "data"
_SHIPPED_SPLITS = {"gsm8k": ("train", "test"), "math500": ("test",)}
_PROMPT_FIELDS = ("prompt", "question", "problem")
_ANSWER_FIELDS = ("gold_answer", "answer")
_GSM8K_MARKER = "####"
_THOUSANDS_NUMBER = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?")


class ProblemFormatError(ValueError):
    """A malformed problem row; the message names the source, the row (and problem id if known) and the cause."""


class _RowError(Exception):
    """The cause of a malformed row; _build_table adds the source and the row."""


def load_problems(kind: str, **fields: object) -> pl.DataFrame:
    """Load a problem set of `kind` (`PROBLEM_KINDS`) as a PROBLEM_SCHEMA table, from the source `fields` the kind
    reads (`kind_fields`; the others must keep their defaults, `SOURCE_DEFAULTS`).

    kind:
      - "gsm8k": shipped GSM8K, split "train" or "test"; the gold answer is the text after "####" (thousands
        separators dropped, as in OpenAI's grade-school-math). `path` reads a local file in the same format instead.
      - "math500": shipped MATH-500, split "test"; `path` reads a file in the same (PRM800K) format instead.
      - "reasoning_gym": `size` problems of task `name` generated with `seed` and `task_options`.
      - "file": a user .jsonl or .parquet file at `path` (field mapping as in problems_from_records).
      - "hf": Hugging Face dataset `name`, `split`; task_options["config"] is the dataset config and any other
        options go to datasets.load_dataset (needs network access).
    `size` > 0 keeps the first `size` rows (for reasoning_gym it is the number generated and must be >= 1).
    """
    if kind not in PROBLEM_KINDS:
        raise ValueError(f"unknown problem kind {kind!r}; valid kinds: {', '.join(PROBLEM_KINDS)}")
    if unknown := sorted(set(fields) - set(SOURCE_DEFAULTS)):
        raise TypeError(
            f"load_problems has no source field {', '.join(unknown)}; the fields: {', '.join(SOURCE_DEFAULTS)}"
        )
    given = SOURCE_DEFAULTS | {name: value for name, value in fields.items() if value is not None}
    if given["size"] < 0:
        raise ValueError(f"size must be >= 0, got {given['size']}")
    return LOADERS[kind](**{name: given[name] for name in kind_fields(kind)})


def problems_from_records(
    records: Iterable[Mapping[str, object]],
    *,
    source: str,
    id_prefix: str,
    size: int = 0,
    prompt_field: str = "",
    answer_field: str = "",
) -> pl.DataFrame:
    """Map user records (dicts, or a datasets.Dataset) to a PROBLEM_SCHEMA table.

    The prompt is `prompt_field`, else the first of "prompt"/"question"/"problem" the record has; the answer is
    `answer_field`, else "gold_answer"/"answer". An answer holding a GSM8K-style solution ("... #### 72") becomes
    the text after the marker. Optional "problem_id", "subject" and "level" fields are used when present; ids
    default to "<id_prefix>/<row:05d>". Rows are named "row <index>" (0-based) in errors.
    """
    located = ((f"row {index}", record) for index, record in enumerate(records))
    return _build_table(source, _user_rows(located, id_prefix, prompt_field, answer_field), size)


def split_problems(
    problems: pl.DataFrame,
    n_labeled: int,
    n_unlabeled: int,
    seed: int,
    n_validation: int = 0,
    unlabeled_pool: pl.DataFrame | None = None,
) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """Draw disjoint labeled and validation (PROBLEM_SCHEMA) and unlabeled (UNLABELED_SCHEMA) sets of the
    requested sizes.

    The order is a seeded sha256 of each problem_id, so a split depends only on the ids and the seed: it is the
    same across runs, machines and library versions, and independent of the input row order. Labeled problems
    come first in that order, then unlabeled; validation problems are the last of it, so that the validation set
    depends on its size and the seed alone (arms that differ in n_labeled or n_unlabeled are chosen on the same
    problems) and adding validation problems changes neither of the others. The unlabeled frame has no
    gold_answer column; its gold moves to HIDDEN_GOLD_COLUMN (last) so training cannot read it. Validation
    problems keep their gold: settings are chosen on them, never on the held-out eval set, and nothing trains
    on them.

    `unlabeled_pool` (a test-time arm: the transductive half of the held-out set, see `eval_halves`): the
    unlabeled problems are all of it, in the same seeded order, `n_unlabeled` is not read, and `problems` gives
    the labeled and validation sets alone, the same ones it gives without it.
    """
    from_pool = n_unlabeled if unlabeled_pool is None else 0
    if n_labeled < 1 or n_validation < 0 or (unlabeled_pool is None and n_unlabeled < 1):
        wanted = (
            "n_labeled >= 1" + (" and n_unlabeled >= 1" if unlabeled_pool is None else "") + " and n_validation >= 0"
        )
        raise ValueError(f"{wanted}, got n_labeled={n_labeled}, n_unlabeled={n_unlabeled}, n_validation={n_validation}")
    needed = n_labeled + from_pool + n_validation
    if needed > problems.height:
        raise ValueError(
            f"asked for {n_labeled} labeled + {from_pool} unlabeled + {n_validation} validation = {needed} problems,"
            f" but the table has only {problems.height}"
        )
    if unlabeled_pool is not None and unlabeled_pool.is_empty():
        raise ValueError("a test-time split needs a non-empty transductive half of the held-out set")
    ordered = _seeded_order(problems.select(PROBLEM_SCHEMA.names()), seed)
    unlabeled = (
        ordered.slice(n_labeled, n_unlabeled)
        if unlabeled_pool is None
        else _seeded_order(unlabeled_pool.select(PROBLEM_SCHEMA.names()), seed)
    )
    unlabeled = unlabeled.rename({"gold_answer": HIDDEN_GOLD_COLUMN}).select(UNLABELED_SCHEMA.names())
    return ordered.head(n_labeled), unlabeled, ordered.tail(n_validation)


def eval_halves(eval_problems: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The held-out set cut into two fixed halves, the transductive one first (the larger when the count is odd).

    The cut is a sha256 of each problem_id with no seed, so every arm and seed sees the same two halves: a
    test-time arm takes its unlabeled problems (gold hidden) from the transductive half, and no arm trains on
    the other, which measures transfer. Every evaluation still scores the whole set; reports split it after.
    """
    ordered = _seeded_order(eval_problems, EVAL_HALVES_SALT)
    transductive = (ordered.height + 1) // 2
    return ordered.head(transductive), ordered.slice(transductive)


def _seeded_order(problems: pl.DataFrame, seed: int | str) -> pl.DataFrame:
    """`problems` sorted by a sha256 of `seed` and each problem_id."""
    draw_key = pl.Series([hashlib.sha256(f"{seed}:{pid}".encode()).hexdigest() for pid in problems["problem_id"]])
    return problems.sort(draw_key)


def drop_overlap(problems: pl.DataFrame, reference: pl.DataFrame) -> pl.DataFrame:
    """Rows of `problems` whose prompt (whitespace-normalised, lower-cased) and problem_id both occur nowhere in
    `reference`: a held-out problem shares neither text nor id with the pool (reports tell a test-time arm's
    transductive problems by id)."""
    seen = reference.select(_prompt_key()).to_series()
    return problems.filter(
        ~_prompt_key().is_in(seen.implode()) & ~pl.col("problem_id").is_in(reference["problem_id"].implode())
    )


def fingerprint(problems: pl.DataFrame) -> str:
    """First 16 hex chars of a sha256 over column names and rows in order (reordered rows are a different table)."""
    payload = json.dumps([problems.columns, problems.rows()], ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def _load_gsm8k(split: str, size: int, path: str) -> pl.DataFrame:
    source = f"gsm8k:{split}"
    rows = (
        (where, _raw_row(f"gsm8k/{split}/{index:05d}", record.get("question"), record.get("answer")))
        for index, (where, record) in enumerate(_jsonl_records(_shipped_or(path, "gsm8k", split), source))
    )
    return _build_table(source, rows, size, require_marker=True)


def _load_math500(split: str, size: int, path: str) -> pl.DataFrame:
    source = f"math500:{split}"
    rows = (
        (
            where,
            _raw_row(
                _math500_id(record, split, index),
                record.get("problem"),
                record.get("answer"),
                record.get("subject"),
                record.get("level"),
            ),
        )
        for index, (where, record) in enumerate(_jsonl_records(_shipped_or(path, "math500", split), source))
    )
    return _build_table(source, rows, size)


def _math500_id(record: Mapping[str, object], split: str, index: int) -> str:
    """ "math500/" + unique_id without ".json" (e.g. "math500/test/precalculus/807"), else by row number."""
    unique_id = record.get("unique_id")
    return f"math500/{str(unique_id).removesuffix('.json')}" if unique_id else f"math500/{split}/{index:05d}"


def _generate_reasoning_gym(name: str, size: int, seed: int, task_options: Mapping[str, object]) -> pl.DataFrame:
    import reasoning_gym  # a slow import, and only this kind needs it

    if not name:
        raise ValueError("reasoning_gym needs a task name (e.g. 'basic_arithmetic')")
    if size < 1:
        raise ValueError(f"reasoning_gym needs size >= 1 (the number of problems to generate), got {size}")
    dataset = reasoning_gym.create_dataset(name, size=size, seed=seed, **task_options)
    rows = (
        (
            f"item {index}",
            _raw_row(
                f"reasoning_gym/{name}/s{seed}/{index:05d}",
                entry["question"],
                None if entry["answer"] is None else str(entry["answer"]),
                name,
                _difficulty_level(entry["metadata"]),
            ),
        )
        for index, entry in enumerate(dataset)
    )
    return _build_table(f"reasoning_gym:{name}", rows, size)


def _load_file(path: str, size: int, prompt_field: str, answer_field: str) -> pl.DataFrame:
    if not path:
        raise ValueError("kind 'file' needs a path to a .jsonl or .parquet file")
    file = Path(path)
    source, id_prefix = f"file:{file.name}", f"file/{file.stem}"
    if file.suffix == ".parquet":
        return problems_from_records(
            pl.read_parquet(file).iter_rows(named=True),
            source=source,
            id_prefix=id_prefix,
            size=size,
            prompt_field=prompt_field,
            answer_field=answer_field,
        )
    if file.suffix != ".jsonl":
        raise ValueError(f"{file}: expected a .jsonl or .parquet file")
    # JSONL rows are named by line number, which users can find in an editor.
    rows = _user_rows(_jsonl_records(file, source), id_prefix, prompt_field, answer_field)
    return _build_table(source, rows, size)


def _load_hf(
    name: str, split: str, size: int, task_options: Mapping[str, object], prompt_field: str, answer_field: str
) -> pl.DataFrame:
    import datasets  # slow import; only this kind needs it

    options = dict(task_options)
    dataset = datasets.load_dataset(name, options.pop("config", None), split=split, **options)
    return problems_from_records(
        dataset,
        source=f"hf:{name}",
        id_prefix=f"hf/{name}/{split}",
        size=size,
        prompt_field=prompt_field,
        answer_field=answer_field,
    )


def _shipped_or(path: str, dataset: str, split: str) -> Path:
    """`path` if given, else the shipped file of `dataset`/`split`."""
    if path:
        return Path(path)
    if split not in _SHIPPED_SPLITS[dataset]:
        raise ValueError(f"{dataset} ships splits {_SHIPPED_SPLITS[dataset]}, got {split!r}")
    return DATA_DIR / dataset / f"{split}.jsonl"


def _jsonl_records(path: Path, source: str) -> Iterator[tuple[str, dict]]:
    """("line <n>", record) for each non-blank line of a JSONL file."""
    with path.open(encoding="utf-8") as lines:
        for line_number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise ProblemFormatError(f"{source} line {line_number}: invalid JSON ({err.msg})") from None
            if not isinstance(record, dict):
                raise ProblemFormatError(
                    f"{source} line {line_number}: expected a JSON object, got {type(record).__name__}"
                )
            yield f"line {line_number}", record


def _user_rows(
    located_records: Iterable[tuple[str, Mapping[str, object]]], id_prefix: str, prompt_field: str, answer_field: str
) -> Iterator[tuple[str, dict]]:
    """(where, raw row) for user records, with the field mapping documented in problems_from_records."""
    for index, (where, record) in enumerate(located_records):
        problem_id = record.get("problem_id")
        yield (
            where,
            _raw_row(
                f"{id_prefix}/{index:05d}" if problem_id is None else str(problem_id),
                _field(record, prompt_field, _PROMPT_FIELDS),
                _field(record, answer_field, _ANSWER_FIELDS),
                record.get("subject"),
                record.get("level"),
            ),
        )


def _field(record: Mapping[str, object], name: str, defaults: tuple[str, ...]) -> object:
    """Value of field `name`, else of the first of `defaults` the record has; None if absent."""
    if name:
        return record.get(name)
    return next((record[field] for field in defaults if field in record), None)


def _raw_row(problem_id: str, prompt: object, answer: object, subject: object = None, level: object = None) -> dict:
    """A row as read, before validation."""
    return {"problem_id": problem_id, "prompt": prompt, "gold_answer": answer, "subject": subject, "level": level}


def _build_table(
    source: str, rows: Iterable[tuple[str, dict]], size: int, *, require_marker: bool = False
) -> pl.DataFrame:
    """Validate and normalise the first `size` (0: all) (where, raw row) pairs into a PROBLEM_SCHEMA table."""
    problems, first_seen = [], {}
    for where, row in islice(rows, size or None):
        problem_id = row["problem_id"]
        try:
            if problem_id in first_seen:
                raise _RowError(f"duplicate problem_id (first used at {first_seen[problem_id]})")
            problems.append(
                {
                    "problem_id": problem_id,
                    "prompt": _prompt(row["prompt"]),
                    "gold_answer": _gold_answer(row["gold_answer"], require_marker),
                    "source": source,
                    "subject": None if row["subject"] is None else str(row["subject"]),
                    "level": _as_level(row["level"]),
                }
            )
        except _RowError as err:
            raise ProblemFormatError(f"{source} {where} (id {problem_id}): {err}") from None
        first_seen[problem_id] = where
    return pl.DataFrame(problems, schema=PROBLEM_SCHEMA)


def _prompt(value: object) -> str:
    if value is None:
        raise _RowError("missing prompt")
    if not isinstance(value, str):
        raise _RowError(f"prompt must be a string, not {type(value).__name__}")
    if not value.strip():
        raise _RowError("empty prompt")
    return value.strip()


def _gold_answer(value: object, require_marker: bool) -> str:
    """The short final answer.

    Strings are kept; ints and finite floats (e.g. 42 in a JSON file) become their decimal text, with integral
    floats written as ints ("42", not "42.0"); anything else (None, bools, lists, dicts) is rejected. Text holding
    a GSM8K-style solution becomes the part after the last "####" (required when `require_marker`), with
    thousands separators dropped from numbers ("1,080" -> "1080") as GSM8K's own answer extraction does.
    """
    if value is None:
        raise _RowError("missing answer")
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise _RowError(f"answer must be a string or a number, not {type(value).__name__}")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _RowError(f"answer {value} is not a finite number")
        value = int(value) if value.is_integer() else value
    text = str(value).strip()
    if _GSM8K_MARKER in text:
        text = text.rsplit(_GSM8K_MARKER, 1)[1].strip()
        if _THOUSANDS_NUMBER.fullmatch(text):
            text = text.replace(",", "")
    elif require_marker:
        raise _RowError(f"answer has no '{_GSM8K_MARKER} <final answer>' marker")
    if not text:
        raise _RowError("empty answer")
    return text


def _as_level(value: object) -> int | None:
    """An integer level from an int or text like "3" / "Level 3" (Hendrycks MATH); None if absent or unparseable
    (e.g. MATH's "Level ?"): the level is optional metadata, not worth rejecting a problem over."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    match = re.fullmatch(r"(?:level\s*)?(\d+)", str(value).strip(), re.IGNORECASE)
    return int(match.group(1)) if match else None


def _difficulty_level(metadata: Mapping[str, object]) -> int | None:
    """reasoning_gym metadata["difficulty"] as a level: an int, or {"difficulty": int} (bf, codeio, ...); most
    tasks give a dict of config ranges instead, which has no single level."""
    difficulty = metadata.get("difficulty")
    if isinstance(difficulty, Mapping):
        difficulty = difficulty.get("difficulty")
    return _as_level(difficulty)


def _prompt_key() -> pl.Expr:
    """The prompt with whitespace runs collapsed, trimmed and lower-cased, for overlap checks."""
    return pl.col("prompt").str.replace_all(r"\s+", " ").str.strip_chars().str.to_lowercase()


LOADERS: dict[str, Callable[..., pl.DataFrame]] = {
    "gsm8k": _load_gsm8k,
    "math500": _load_math500,
    "reasoning_gym": _generate_reasoning_gym,
    "file": _load_file,
    "hf": _load_hf,
}
"""Each kind of problem source's loader, for the kinds of the one registry (`settings.SOURCE_KIND_FIELDS`, which
`PROBLEM_KINDS` lists): its parameters are the source fields its kind reads (`kind_fields`)."""
PROBLEM_KINDS = tuple(SOURCE_KIND_FIELDS)
SOURCE_DEFAULTS = {
    "name": "",
    "split": "train",
    "size": 0,
    "seed": 0,
    "path": "",
    "task_options": {},
    "prompt_field": "",
    "answer_field": "",
}
"""What a source field is when a source does not give it."""


def kind_fields(kind: str) -> tuple[str, ...]:
    """The loader parameters of problem kind `kind`: the source fields it reads, task options as a mapping."""
    return tuple("task_options" if name == "task_options_json" else name for name in SOURCE_KIND_FIELDS[kind])
