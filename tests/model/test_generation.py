"""Sampling with the transformers and vLLM backends, on tiny random Llamas (real libraries, no mocks).

Each vLLM engine start costs about 30 s on a 2-core CPU, so the vLLM tests start four: vLLM's greedy completions
agreeing with transformers' is shown by `test_several_settings_in_one_load_give_what_separate_calls_give[vllm]`.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path

import polars as pl
import pytest

from noisy_student_assets.core.grading import extract_answer
from noisy_student_assets.core.prompts import DEFAULT_SYSTEM_PROMPT, render_prompt
from noisy_student_assets.core.sampling import (
    GENERATION_SCHEMA,
    Sample,
    SampleShards,
    SamplingSettings,
    _decode_generated,
    _samples_table,
    generate,
)

PROBLEMS = pl.DataFrame(
    {
        "problem_id": ["p-add", "p-mul", "p-sub", "p-div", "p-sq"],
        "prompt": ["Calculate 47 + 38.", "What is 7 times 8?", "Compute 90 - 45.", "What is 81 / 9?", "Square 12."],
        "gold": ["85", "56", "45", "9", "144"],  # other columns are ignored
    }
)
SAMPLING = SamplingSettings(n=4, temperature=1.0, top_p=0.95, max_new_tokens=12, seed=3)
GREEDY = SamplingSettings(n=1, temperature=0.0, max_new_tokens=16)
TEMPERED = SamplingSettings(n=3, temperature=0.5, top_p=0.9, max_new_tokens=6, seed=7)
LOGPROB_COLUMNS = ("token_logprobs", "mean_logprob")


def one_set(model_dir: Path, problems: pl.DataFrame, settings: SamplingSettings, **options) -> pl.DataFrame:
    """The table of `generate` with one set of settings."""
    (table,), _ = generate(model_dir, problems, [settings], **options)
    return table


def reported_samples(model_dir: Path, **options) -> tuple[pl.DataFrame, list[tuple[int, int]]]:
    """`SAMPLING`'s samples of `PROBLEMS`, and the progress reports sampling made."""
    reports: list[tuple[int, int]] = []
    samples = one_set(
        model_dir, PROBLEMS, SAMPLING, progress=lambda done, total: reports.append((done, total)), **options
    )
    return samples, reports


@pytest.fixture(scope="module")
def transformers_run(tiny_model_dir: Path) -> tuple[pl.DataFrame, list[tuple[int, int]]]:
    """Samples from the transformers backend in shards (and batches) of 2, and the progress reports it made."""
    return reported_samples(tiny_model_dir, backend="transformers", batch_size=2, shard_size=2)


@pytest.fixture(scope="module")
def vllm_run(tiny_model_dir: Path) -> tuple[pl.DataFrame, list[tuple[int, int]]]:
    """Samples from the vLLM backend on the CPU, in shards of 4 problems, and the progress reports it made."""
    return reported_samples(tiny_model_dir, backend="vllm", shard_size=4)


@pytest.fixture(scope="module")
def transformers_sets(tiny_model_dir: Path) -> tuple[list[pl.DataFrame], list[tuple[int, int]]]:
    """`GREEDY` and `SAMPLING` in one load of the transformers backend, in shards of 2, and the progress reports."""
    return reported_sample_sets(tiny_model_dir, PROBLEMS, backend="transformers", batch_size=2, shard_size=2)


@pytest.fixture(scope="module")
def vllm_sets(tiny_model_dir: Path) -> tuple[list[pl.DataFrame], list[tuple[int, int]]]:
    """`GREEDY` and `SAMPLING` in one vLLM engine, the problems in reverse order and all in one call (`vllm_run`
    has them in order, in shards of 4), and the progress reports."""
    return reported_sample_sets(tiny_model_dir, PROBLEMS.reverse(), backend="vllm", shard_size=PROBLEMS.height)


def reported_sample_sets(
    model_dir: Path, problems: pl.DataFrame, **options
) -> tuple[list[pl.DataFrame], list[tuple[int, int]]]:
    """`GREEDY`'s and `SAMPLING`'s samples of `problems` in one load, each in `PROBLEMS`' order, and the progress
    reports sampling made."""
    reports: list[tuple[int, int]] = []
    sets, _ = generate(
        model_dir, problems, [GREEDY, SAMPLING], progress=lambda done, total: reports.append((done, total)), **options
    )
    position = pl.col("problem_id").replace_strict(PROBLEMS["problem_id"], range(PROBLEMS.height))
    return [samples.sort(position, "sample_index") for samples in sets], reports


def assert_k_rows_per_problem_in_order(samples: pl.DataFrame, k: int) -> None:
    assert samples["problem_id"].to_list() == [pid for pid in PROBLEMS["problem_id"] for _ in range(k)]
    assert samples["sample_index"].to_list() == list(range(k)) * PROBLEMS.height


def assert_finish_reasons_consistent(samples: pl.DataFrame, max_new_tokens: int) -> None:
    assert set(samples["finish_reason"]) <= {"stop", "length"}
    lengths = samples.filter(pl.col("finish_reason") == "length")["n_tokens"]
    assert (lengths == max_new_tokens).all()
    assert samples["n_tokens"].is_between(1, max_new_tokens).all()


def assert_logprobs_close(samples: pl.DataFrame, expected: pl.DataFrame) -> None:
    """The same tokens' logprobs, up to the float32 rounding that another backend or batching brings."""
    assert samples["token_logprobs"].explode().to_list() == pytest.approx(
        expected["token_logprobs"].explode().to_list(), abs=1e-3
    )


def teacher_forced_logprobs(
    model_dir: Path, problems: pl.DataFrame, samples: pl.DataFrame, temperature: float
) -> tuple[list[float], list[float]]:
    """Every sampled token's log-probability, raw and at `temperature`, computed apart from the backends: one
    unpadded forward pass per sample, in float32. The samples' token ids are their completions tokenized again
    (and the end-of-turn token when they stopped), which holds for the sevens model's "7"s."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    prompts = dict(zip(problems["problem_id"], problems["prompt"], strict=True))
    raw, tempered = [], []
    for sample in samples.iter_rows(named=True):
        rendered = render_prompt(tokenizer, prompts[sample["problem_id"]], DEFAULT_SYSTEM_PROMPT)
        prompt = tokenizer(rendered, add_special_tokens=False).input_ids
        generated = tokenizer(sample["completion"], add_special_tokens=False).input_ids
        generated += [tokenizer.eos_token_id] if sample["finish_reason"] == "stop" else []
        assert len(generated) == sample["n_tokens"], "the completion tokenizes back into its tokens"
        with torch.inference_mode():
            logits = model(torch.tensor([prompt + generated])).logits[0, len(prompt) - 1 : -1]
        tokens = torch.tensor(generated)[:, None]
        raw += logits.log_softmax(-1).gather(-1, tokens).squeeze(-1).tolist()
        tempered += (logits / temperature).log_softmax(-1).gather(-1, tokens).squeeze(-1).tolist()
    return raw, tempered


# --- transformers backend -------------------------------------------------------------------------


def test_transformers_table_has_exactly_the_generation_schema(transformers_run):
    samples, _ = transformers_run
    assert samples.schema == GENERATION_SCHEMA


def test_transformers_gives_k_rows_per_problem_in_problem_order(transformers_run):
    samples, _ = transformers_run
    assert_k_rows_per_problem_in_order(samples, SAMPLING.n)


def test_transformers_finish_reasons_match_token_counts(transformers_run):
    samples, _ = transformers_run
    assert_finish_reasons_consistent(samples, SAMPLING.max_new_tokens)


def test_answer_column_is_the_extracted_answer(transformers_run):
    samples, _ = transformers_run
    assert samples["answer"].to_list() == [extract_answer(c) for c in samples["completion"]]


def test_provenance_columns(transformers_run, tiny_model_dir):
    samples, _ = transformers_run
    assert set(samples["checkpoint"]) == {str(tiny_model_dir)}
    assert set(samples["backend"]) == {"transformers"}
    assert [json.loads(s) for s in set(samples["sampling"])] == [SAMPLING.as_dict()]


def test_transformers_progress_counts_problems_up_to_the_total(transformers_run):
    _, reports = transformers_run
    assert reports == [(2, 5), (4, 5), (5, 5)]


def test_transformers_sampling_is_deterministic_for_a_seed(transformers_run, tiny_model_dir):
    samples, _ = transformers_run
    again = one_set(tiny_model_dir, PROBLEMS, SAMPLING, backend="transformers", batch_size=2)
    reseeded = one_set(
        tiny_model_dir, PROBLEMS, dataclasses.replace(SAMPLING, seed=4), backend="transformers", batch_size=2
    )
    assert again["completion"].to_list() == samples["completion"].to_list()
    assert reseeded["completion"].to_list() != samples["completion"].to_list()


def test_transformers_greedy_gives_one_deterministic_row_per_problem(tiny_model_dir):
    first = one_set(tiny_model_dir, PROBLEMS, GREEDY, backend="transformers", checkpoint_label="tiny")
    second = one_set(tiny_model_dir, PROBLEMS, GREEDY, backend="transformers", batch_size=1)
    assert_k_rows_per_problem_in_order(first, 1)
    assert set(first["checkpoint"]) == {"tiny"}
    assert first["completion"].to_list() == second["completion"].to_list()


def test_generation_is_cut_after_the_first_stop_token(tiny_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    eos = tokenizer.eos_token_id
    words = tokenizer("The answer is 5", add_special_tokens=False).input_ids
    logprobs = [-0.5 * position for position in range(1, len(words) + 4)]
    stopped = _decode_generated(tokenizer, [*words, eos, eos, eos], logprobs, {eos})  # padded with EOS after the stop
    assert stopped == Sample("The answer is 5", len(words) + 1, "stop", tuple(logprobs[: len(words) + 1]))
    unstopped = _decode_generated(tokenizer, words, logprobs[: len(words)], {eos})
    assert unstopped == Sample("The answer is 5", len(words), "length", tuple(logprobs[: len(words)]))


def test_mean_logprob_is_null_without_tokens():
    table = _samples_table(["p-empty"], [[Sample("", 0, "length", ())]], checkpoint="c", backend="vllm", sampling="{}")
    assert table.schema == GENERATION_SCHEMA
    assert table["token_logprobs"].to_list() == [[]] and table["mean_logprob"].to_list() == [None]


# --- input validation -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("problems", "backend", "message"),
    [
        (PROBLEMS.clear(), "transformers", "no problems to sample"),
        (PROBLEMS, "llama.cpp", "vllm, transformers"),
        (PROBLEMS.drop("prompt", "problem_id"), "transformers", "problem_id, prompt"),
    ],
)
def test_bad_inputs_are_rejected(tiny_model_dir, problems, backend, message):
    with pytest.raises(ValueError, match=message):
        one_set(tiny_model_dir, problems, SAMPLING, backend=backend)


# --- vLLM backend (CPU) ---------------------------------------------------------------------------


def test_vllm_table_has_the_same_schema_as_transformers(vllm_run, transformers_run):
    assert vllm_run[0].schema == transformers_run[0].schema == GENERATION_SCHEMA


def test_vllm_gives_k_rows_per_problem_with_consistent_finish_reasons(vllm_run):
    samples, reports = vllm_run
    assert_k_rows_per_problem_in_order(samples, SAMPLING.n)
    assert_finish_reasons_consistent(samples, SAMPLING.max_new_tokens)
    assert set(samples["backend"]) == {"vllm"}
    assert reports == [(4, 5), (5, 5)]


def test_vllm_samples_of_a_problem_do_not_depend_on_order_or_batching(vllm_run, vllm_sets):
    samples, _ = vllm_run
    (_, again), _ = vllm_sets  # reversed, all in one call
    assert again["completion"].to_list() == samples["completion"].to_list()
    assert samples["completion"].n_unique() == samples.height  # each sample has a stream of its own


# --- token log-probabilities ----------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["transformers", "vllm"])
def test_every_generated_token_has_a_logprob_and_the_mean_is_theirs(backend, request):
    samples, _ = request.getfixturevalue(f"{backend}_run")
    assert samples["token_logprobs"].list.len().to_list() == samples["n_tokens"].to_list()
    logprobs = samples["token_logprobs"].explode()
    assert logprobs.is_finite().all() and (logprobs <= 0).all()
    assert samples["mean_logprob"].to_list() == pytest.approx(
        [statistics.fmean(lp) for lp in samples["token_logprobs"]]
    )


@pytest.mark.parametrize("backend", ["transformers", "vllm"])
def test_recorded_logprobs_are_the_models_own_whatever_the_temperature(backend, sevens_model_dir):
    """Sampled at temperature 0.5 and top-p 0.9, the logprobs recorded are those of the untempered, unfiltered
    distribution; the tempered ones differ by far more than the tolerance. The sevens model says "7" or ends its
    turn, with a probability that a temperature changes a lot."""
    problems = PROBLEMS.head(2)
    samples = one_set(sevens_model_dir, problems, TEMPERED, backend=backend)
    raw, tempered = teacher_forced_logprobs(sevens_model_dir, problems, samples, TEMPERED.temperature)
    recorded = samples["token_logprobs"].explode().to_list()
    assert recorded == pytest.approx(raw, abs=1e-4)
    assert max(abs(logprob - at_temperature) for logprob, at_temperature in zip(recorded, tempered, strict=True)) > 0.05


@pytest.mark.parametrize("backend", ["transformers", "vllm"])
def test_several_settings_in_one_load_give_what_separate_calls_give(backend, tiny_model_dir, request):
    (greedy, sampled), reports = request.getfixturevalue(f"{backend}_sets")
    separately, _ = request.getfixturevalue(f"{backend}_run")
    assert sampled.equals(separately)
    by_transformers = one_set(tiny_model_dir, PROBLEMS, GREEDY, backend="transformers").with_columns(
        backend=pl.lit(backend)
    )
    assert greedy.drop(LOGPROB_COLUMNS).equals(by_transformers.drop(LOGPROB_COLUMNS))
    assert_logprobs_close(greedy, by_transformers)  # batched otherwise: 2 prompts a call in the sets, 16 alone
    assert reports[-1] == (2 * PROBLEMS.height, 2 * PROBLEMS.height)
    assert [done for done, _ in reports] == sorted(done for done, _ in reports)


class ShardWriterKilled(Exception):
    pass


class KilledAfterFirstShard(SampleShards):
    """Saves one shard, then dies the way a killed writer would: mid-way through its next file."""

    def write(self, table: pl.DataFrame) -> None:
        if list(self.directory.glob("shard-*.parquet")):
            (self.directory / "shard-00001.parquet.tmp").write_bytes(b"PAR1 half a file")
            raise ShardWriterKilled
        super().write(table)


def test_interrupted_sampling_resumes_after_the_saved_shards(tiny_model_dir, tmp_path, transformers_run):
    options = {"backend": "transformers", "batch_size": 2, "shard_size": 2}
    with pytest.raises(ShardWriterKilled):
        generate(tiny_model_dir, PROBLEMS, [SAMPLING], shards=[KilledAfterFirstShard(tmp_path)], **options)
    reports: list[tuple[int, int]] = []
    (samples,), resumed = generate(
        tiny_model_dir,
        PROBLEMS,
        [SAMPLING],
        shards=[SampleShards(tmp_path)],
        progress=lambda *r: reports.append(r),
        **options,
    )
    assert resumed == 2 and reports == [(4, 5), (5, 5)]  # only the 3 unsaved problems were sampled again, 2 at a time
    assert samples.schema == GENERATION_SCHEMA
    assert samples["problem_id"].to_list() == [p for p in PROBLEMS["problem_id"] for _ in range(SAMPLING.n)]
    assert samples["sample_index"].to_list() == list(range(SAMPLING.n)) * PROBLEMS.height
    first_shard = transformers_run[0].head(2 * SAMPLING.n)
    assert samples.head(2 * SAMPLING.n).equals(first_shard)
    assert not list(tmp_path.glob("*.tmp")), "the killed writer's partial file is deleted"


def test_transformers_pads_a_batch_for_a_tokenizer_without_a_pad_token(tiny_model_dir: Path, tmp_path: Path):
    """Many base models' tokenizers define no pad token; batched generation must still left-pad."""
    import shutil

    from transformers import AutoTokenizer

    shutil.copytree(tiny_model_dir, tmp_path, dirs_exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    tokenizer.pad_token = None
    tokenizer.save_pretrained(tmp_path)
    assert AutoTokenizer.from_pretrained(tmp_path).pad_token is None
    unpadded = one_set(tmp_path, PROBLEMS, GREEDY, backend="transformers", batch_size=5)
    padded = one_set(tiny_model_dir, PROBLEMS, GREEDY, backend="transformers", batch_size=5)
    assert unpadded["completion"].to_list() == padded["completion"].to_list()


def cut_short(path: Path) -> None:
    """`path` as a disk that lost the end of its write leaves it."""
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def test_a_shard_cut_short_is_set_aside_and_its_problems_sampled_again(tiny_model_dir, tmp_path):
    """Greedy, in shards of 2: the problems of the shard cut short are sampled again, as they were the first time."""
    options = {"backend": "transformers", "batch_size": 2, "shard_size": 2}
    (whole,), _ = generate(tiny_model_dir, PROBLEMS, [GREEDY], shards=[SampleShards(tmp_path)], **options)
    cut_short(tmp_path / "shard-00001.parquet")
    told: list[str] = []
    (again,), resumed = generate(
        tiny_model_dir, PROBLEMS, [GREEDY], shards=[SampleShards(tmp_path, told.append)], **options
    )
    assert resumed == 3  # shards 0 and 2; shard 1's 2 problems are sampled again
    assert len(told) == 1 and told[0].startswith(f"shard-00001.parquet in {tmp_path} is not a whole table (")
    assert again.drop(*LOGPROB_COLUMNS).equals(whole.drop(*LOGPROB_COLUMNS))
    assert_logprobs_close(again, whole)


def test_an_evaluation_shard_cut_short_is_set_aside_and_evaluated_again(tiny_model_dir, tmp_path):
    from noisy_student_assets.core.evaluation import eval_completions
    from noisy_student_assets.core.settings import ComputeSettings, EvalSettings

    settings = EvalSettings(backend="transformers", max_new_tokens=8, samples=2, ks=[1, 2], batch_size=2, shard_size=3)
    problems = PROBLEMS.select("problem_id", "prompt")
    greedy, sampled, _ = eval_completions(tiny_model_dir, problems, settings, ComputeSettings(), tmp_path)
    cut_short(tmp_path / "greedy" / "shard-00000.parquet")
    told: list[str] = []
    again, sampled_again, resumed = eval_completions(
        tiny_model_dir, problems, settings, ComputeSettings(), tmp_path, set_aside=told.append
    )
    assert resumed == 2 + PROBLEMS.height  # greedy's second shard and every sampled shard were read back
    assert len(told) == 1 and told[0].startswith("shard-00000.parquet in ") and "greedy" in told[0]
    assert again.drop(*LOGPROB_COLUMNS).equals(greedy.drop(*LOGPROB_COLUMNS))
    assert sampled_again.equals(sampled)
