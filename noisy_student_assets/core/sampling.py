"""Sample K completions per problem from a checkpoint, with vLLM or transformers, into one table: `generate`, over
one or several sets of decoding settings, resumable from saved shards where it is given them.

Both backends see the same token ids: each problem goes through ``render_prompt`` and is tokenized
here once, without extra special tokens (the chat template already holds them).  Both sample from
the plain tempered distribution with nucleus filtering (no top-k, no checkpoint-shipped defaults),
so their samples are comparable, and greedy decoding gives the same text up to float rounding.

Reproducibility: a seed fixes the samples of both backends, but differently.  transformers draws
from one generator seeded per call, so samples also depend on ``batch_size`` and problem order.
vLLM (the project's one engine, `vllm_engine.VllmEngine`) gives every problem a generator of its own
(`vllm_engine.request_seed`), so a problem's samples depend only on the checkpoint, its prompt and id,
and the settings.

Every sample also carries its tokens' log-probabilities under the model's own distribution, before
temperature and top-p (vLLM's raw logprobs; for transformers, a forward pass over each generated
batch): the model's confidence in what it sampled, whatever the decoding settings.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import shutil
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import polars as pl

from noisy_student_assets.core.grading import extract_answer
from noisy_student_assets.core.prompts import DEFAULT_SYSTEM_PROMPT, prompt_template, render_prompt
from noisy_student_assets.core.resumable import SetAside, whole_parquet
from noisy_student_assets.core.settings import BACKENDS, DTYPES
from noisy_student_assets.core.vllm_engine import VllmEngine, request_seed

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase
    from vllm.outputs import CompletionOutput

    from noisy_student_assets.core.settings import ComputeSettings, TeacherSamplingSettings

REQUIRED_COLUMNS = ("problem_id", "prompt")

GENERATION_SCHEMA = pl.Schema(
    {
        "problem_id": pl.Utf8,
        "sample_index": pl.Int32,
        "completion": pl.Utf8,
        "answer": pl.Utf8,
        "n_tokens": pl.Int32,
        "finish_reason": pl.Utf8,
        "token_logprobs": pl.List(pl.Float64),
        "mean_logprob": pl.Float64,
        "checkpoint": pl.Utf8,
        "backend": pl.Utf8,
        "sampling": pl.Utf8,
    }
)

# Without an explicit KV cache size the CPU worker claims gpu_memory_utilization (0.92 by default) of *all* RAM, and
# fails on a shared machine; 2 GiB holds 41k tokens of SmolLM2-135M in float32 (64 problems x 8 samples x 80 tokens),
# and sequences beyond it wait their turn rather than fail. vLLM's legacy `VLLM_CPU_KVCACHE_SPACE` (GiB), where the
# caller's environment sets it, overrides this.
SAMPLING_KV_CACHE_BYTES = 2 * 2**30

LOGPROB_ROWS_PER_PASS = 8
"""Generated rows the transformers backend scores per forward pass: its logits hold rows x length x vocabulary."""

Progress = Callable[[int, int], None]
ShardDone = Callable[[int, list[int], list[list["Sample"]]], None]
"""A backend's report of one finished shard: (set index, the problems' indices, their samples)."""


@dataclass(frozen=True)
class SamplingSettings:
    """The decoding parameters of one generation call (what the stages' settings turn into, as vLLM's
    ``SamplingParams``); ``temperature == 0`` means greedy decoding, which needs ``n == 1``."""

    n: int
    """Samples per prompt (K)."""
    temperature: float
    max_new_tokens: int
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.n < 1 or self.max_new_tokens < 1:
            raise ValueError(f"need n >= 1 and max_new_tokens >= 1, got {self.n}, {self.max_new_tokens}")
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ValueError(f"need temperature >= 0 and 0 < top_p <= 1, got {self.temperature}, {self.top_p}")
        if self.greedy and self.n != 1:
            raise ValueError(f"greedy decoding (temperature=0) yields one completion per prompt, not n={self.n}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Sample:
    """One completion, as either backend reports it."""

    completion: str
    n_tokens: int
    """Generated tokens, the end-of-sequence token included."""
    finish_reason: str
    """``"stop"`` (end-of-sequence emitted) or ``"length"`` (``max_new_tokens`` reached)."""
    token_logprobs: tuple[float, ...]
    """Each generated token's log-probability (``n_tokens`` of them) under the model's raw distribution: the
    log-softmax of its logits, before temperature and top-p."""


class Generated(NamedTuple):
    """What `generate` returns."""

    tables: list[pl.DataFrame]
    """One table per set of settings, with exactly ``GENERATION_SCHEMA``, in problem order then ``sample_index``."""
    resumed: int
    """Problem passes read back from saved shards instead of sampled."""


def generate(
    checkpoint_dir: Path,
    problems: pl.DataFrame,
    settings_sets: Sequence[SamplingSettings],
    *,
    shards: Sequence[SampleShards] | None = None,
    backend: str = "vllm",
    device: str = "cpu",
    dtype: str = "float32",
    system_prompt: str = DEFAULT_SYSTEM_PROMPT,
    batch_size: int = 16,
    shard_size: int = 64,
    progress: Progress | None = None,
    checkpoint_label: str | None = None,
    gpu_memory_utilization: float = 0.85,
    model: PreTrainedModel | None = None,
) -> Generated:
    """``settings.n`` completions of each problem (columns ``problem_id``, ``prompt``) for each entry of
    ``settings_sets``, all from one model load (one vLLM engine, whose start-up dominates short runs on a CPU), or
    none: ``model`` is the checkpoint's, already loaded (``load_transformers_model``; transformers only), which a
    caller asking often keeps.

    Problems go to the backend ``shard_size`` at a time (vLLM batches a shard internally; transformers in batches of
    ``batch_size``), and ``progress(problems_done, total)`` is called after each shard, counting over all the sets.
    With ``shards``, every finished shard of set i is saved into ``shards[i]``, and the problems an earlier,
    interrupted call saved there are read back instead of sampled. ``gpu_memory_utilization`` only matters for vLLM
    on a GPU.
    """
    _validate(problems, backend, dtype)
    if model is not None and backend != "transformers":
        raise ValueError(f"a loaded model samples with transformers; {backend} loads its own engine")
    if not settings_sets or (shards and len(shards) != len(settings_sets)):
        raise ValueError(f"need one or more sampling settings, and as many shard directories: {len(settings_sets)}")
    empty = GENERATION_SCHEMA.to_frame()
    done = [set_shards.load() for set_shards in shards] if shards else [empty] * len(settings_sets)
    problem_ids = problems["problem_id"].cast(pl.Utf8).to_list()
    skipped = [set(table["problem_id"]) for table in done]
    jobs = [[index for index, problem_id in enumerate(problem_ids) if problem_id not in skip] for skip in skipped]
    total, resumed = len(problem_ids) * len(settings_sets), sum(map(len, skipped))
    progressed = total - sum(map(len, jobs))

    def table(set_index: int, indices: list[int], samples: list[list[Sample]]) -> pl.DataFrame:
        return _samples_table(
            [problem_ids[index] for index in indices],
            samples,
            checkpoint=checkpoint_label or str(checkpoint_dir),
            backend=backend,
            sampling=json.dumps(settings_sets[set_index].as_dict(), sort_keys=True),
        )

    def shard_done(set_index: int, indices: list[int], samples: list[list[Sample]]) -> None:
        nonlocal progressed
        progressed += len(samples)
        if shards:
            shards[set_index].write(table(set_index, indices, samples))
        if progress is not None:
            progress(progressed, total)

    sample_sets: list[list[list[Sample]]] = [[] for _ in settings_sets]
    if any(jobs):  # else every set was sampled before: no model to load
        from transformers import AutoTokenizer  # torch/transformers load here, not when the config imports us

        tokenizer = AutoTokenizer.from_pretrained(str(checkpoint_dir))
        prompt_ids = _prompt_ids(tokenizer, problems, system_prompt)
        work = _Work(checkpoint_dir, prompt_ids, jobs, settings_sets, device, dtype, shard_size, shard_done)
        if backend == "vllm":
            sample_sets = _sample_with_vllm(work, problem_ids, gpu_memory_utilization)
        else:
            model = model if model is not None else load_transformers_model(checkpoint_dir, dtype, device)
            sample_sets = _sample_with_transformers(work, tokenizer, batch_size, model)
    new = [table(set_index, jobs[set_index], samples) for set_index, samples in enumerate(sample_sets)]
    return Generated(_in_problem_order(problems, done, new) if shards else new, resumed)


def _prompt_ids(tokenizer: PreTrainedTokenizerBase, problems: pl.DataFrame, system_prompt: str) -> list[list[int]]:
    """Each problem's prompt as the checkpoint's tokenizer encodes its chat template, without extra special tokens
    (the template holds them)."""
    return [
        tokenizer(render_prompt(tokenizer, problem, system_prompt), add_special_tokens=False).input_ids
        for problem in problems["prompt"].to_list()
    ]


def _in_problem_order(problems: pl.DataFrame, done: list[pl.DataFrame], new: list[pl.DataFrame]) -> list[pl.DataFrame]:
    """Each set's samples read back and sampled now, in problem order, then ``sample_index``."""
    order = problems.select(pl.col("problem_id").cast(pl.Utf8)).with_row_index("problem_order")
    return [
        pl.concat([before, after])
        .join(order, on="problem_id")
        .sort("problem_order", "sample_index")
        .drop("problem_order")
        for before, after in zip(done, new, strict=True)
    ]


def sampling_cache_key(
    checkpoint_sha256: str,
    problems_fingerprint: str,
    settings: SamplingSettings,
    backend: str,
    prompt_template: str,
    batch_size: int = 16,
) -> str:
    """sha256 hex identifying a sampling run: equal keys mean the samples can be reused.

    `prompt_template` is how a problem becomes chat messages (`prompts.prompt_template`). `batch_size`
    shapes transformers' samples (one generator per call) and not vLLM's, so only the former's key holds it."""
    identity = {
        "checkpoint_sha256": checkpoint_sha256,
        "problems_fingerprint": problems_fingerprint,
        "settings": settings.as_dict(),
        "backend": backend,
        "prompt_template": prompt_template,
    }
    if backend == "transformers":
        identity["batch_size"] = batch_size
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()


def decoding(settings: TeacherSamplingSettings) -> SamplingSettings:
    """The decoding parameters of the teacher's K samples."""
    return SamplingSettings(
        n=settings.k,
        temperature=settings.temperature,
        top_p=settings.top_p,
        max_new_tokens=settings.max_new_tokens,
        seed=settings.seed,
    )


def teacher_cache_key(teacher_sha256: str, problems: pl.DataFrame, settings: TeacherSamplingSettings) -> str:
    """The content key of a teacher's samples of `problems` (only the columns sampling reads: the hidden gold
    must not shape, or even key, the samples)."""
    from noisy_student_assets.core.problems import fingerprint

    return sampling_cache_key(
        teacher_sha256,
        fingerprint(problems.select(*REQUIRED_COLUMNS)),
        decoding(settings),
        settings.backend,
        prompt_template(),
        settings.batch_size,
    )


def sample_teacher(
    teacher_dir: Path,
    problems: pl.DataFrame,
    settings: TeacherSamplingSettings,
    shards: SampleShards,
    compute: ComputeSettings,
    *,
    progress: Progress | None = None,
    checkpoint_label: str | None = None,
) -> tuple[pl.DataFrame, int]:
    """The sampling stage: the teacher's K samples of every problem (only its id and prompt are read), saved shard
    by shard into `shards` and resumed from there; the table and the number of problems taken from saved shards."""
    (table,), resumed = generate(
        teacher_dir,
        problems.select(*REQUIRED_COLUMNS),
        [decoding(settings)],
        shards=[shards],
        backend=settings.backend,
        shard_size=settings.shard_size,
        batch_size=settings.batch_size,
        progress=progress,
        checkpoint_label=checkpoint_label,
        **compute.generation_options(),
    )
    return table, resumed


def problem_parts(problems: pl.DataFrame, parts: int) -> list[pl.DataFrame]:
    """`problems` cut into at most `parts` contiguous slices of near-equal size (one sampling payload each), which
    concatenated give `problems` back. vLLM seeds each problem's samples from the settings' seed and the problem's
    id alone, so the samples do not depend on the cut."""
    bounds = [round(index * problems.height / parts) for index in range(parts + 1)]
    return [problems.slice(start, end - start) for start, end in itertools.pairwise(bounds) if end > start]


class SampleShards:
    """The finished shards of one sampling run, on disk, so that a run killed midway resumes from the
    problems already sampled instead of from zero.

    A shard is written under a temporary name and renamed, so a shard file is complete unless the disk lost it; a
    temporary file left by a killed writer is deleted by the next ``load``, and a shard that does not read whole is
    moved aside (``resumable.whole_parquet``, told to ``set_aside``) and its problems sampled again. The directory
    belongs to one sampling run (key it by ``sampling_cache_key``): shards of other settings must not mix in.
    """

    def __init__(self, directory: Path, set_aside: SetAside | None = None) -> None:
        self.directory = directory
        self.set_aside = set_aside

    def load(self) -> pl.DataFrame:
        """Every finished shard, in the order written."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for partial in self.directory.glob("*.tmp"):
            partial.unlink()
        tables = [whole_parquet(path, GENERATION_SCHEMA, self.set_aside) for path in self._files()]
        return pl.concat([table for table in tables if table is not None] or [GENERATION_SCHEMA.to_frame()])

    def write(self, table: pl.DataFrame) -> None:
        files = self._files()
        number = int(files[-1].stem.removeprefix("shard-")) + 1 if files else 0  # after every shard kept
        final = self.directory / f"shard-{number:05d}.parquet"
        partial = final.with_name(final.name + ".tmp")
        table.write_parquet(partial)
        os.replace(partial, final)

    def clear(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)

    def _files(self) -> list[Path]:
        return sorted(self.directory.glob("shard-*.parquet"))


def _validate(problems: pl.DataFrame, backend: str, dtype: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; expected one of {', '.join(BACKENDS)}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of {sorted(DTYPES)}")
    missing = [column for column in REQUIRED_COLUMNS if column not in problems.columns]
    if missing:
        raise ValueError(f"problems table lacks column(s) {', '.join(missing)}")
    if problems.is_empty():
        raise ValueError("no problems to sample")


def _samples_table(
    problem_ids: list[str], samples: list[list[Sample]], *, checkpoint: str, backend: str, sampling: str
) -> pl.DataFrame:
    rows = [
        {
            "problem_id": problem_id,
            "sample_index": index,
            "completion": sample.completion,
            "answer": extract_answer(sample.completion),
            "n_tokens": sample.n_tokens,
            "finish_reason": sample.finish_reason,
            "token_logprobs": list(sample.token_logprobs),
            "mean_logprob": statistics.fmean(sample.token_logprobs) if sample.token_logprobs else None,
            "checkpoint": checkpoint,
            "backend": backend,
            "sampling": sampling,
        }
        for problem_id, problem_samples in zip(problem_ids, samples, strict=True)
        for index, sample in enumerate(problem_samples)
    ]
    return pl.DataFrame(rows, schema=GENERATION_SCHEMA)


def _chunks(items: list, size: int) -> list[list]:
    return [items[start : start + size] for start in range(0, len(items), size)]


@dataclass(frozen=True)
class _Work:
    """What either backend samples: from the checkpoint, each set of settings over its problems (`jobs`: indices
    into `prompt_ids`, each problem's token ids), `shard_size` problems at a time, each shard reported to
    `shard_done`."""

    checkpoint_dir: Path
    prompt_ids: list[list[int]]
    jobs: list[list[int]]
    settings_sets: Sequence[SamplingSettings]
    device: str
    dtype: str
    shard_size: int
    shard_done: ShardDone


def load_transformers_model(checkpoint_dir: Path, dtype: str = "float32", device: str = "cpu") -> PreTrainedModel:
    """A checkpoint's model as transformers' generation reads it: in `dtype`, on `device`, in eval mode."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(checkpoint_dir), dtype=getattr(torch, dtype), use_safetensors=True)
    return model.to(device).eval()


def _sample_with_transformers(
    work: _Work, tokenizer: PreTrainedTokenizerBase, batch_size: int, model: PreTrainedModel
) -> list[list[list[Sample]]]:
    import torch
    from transformers import GenerationConfig

    stop_ids = stop_token_ids(model.generation_config.eos_token_id, tokenizer)
    if tokenizer.pad_token_id is None:
        # Batches are left-padded; the pad positions are masked out, so any id serves (a base model's
        # tokenizer often defines none, and `tokenizer.pad` then refuses to pad).
        tokenizer.pad_token = tokenizer.eos_token
    pad_id = tokenizer.pad_token_id
    # Sampling defaults shipped in the checkpoint (top-k, repetition penalty...) would otherwise be
    # merged into every call; vLLM ignores them when given explicit SamplingParams, and so do we.
    model.generation_config = GenerationConfig(eos_token_id=sorted(stop_ids), pad_token_id=pad_id)
    sample_sets: list[list[list[Sample]]] = []
    with torch.inference_mode():
        for set_index, settings in enumerate(work.settings_sets):
            torch.manual_seed(settings.seed)
            samples: list[list[Sample]] = []
            for shard in _chunks(work.jobs[set_index], work.shard_size):
                shard_samples: list[list[Sample]] = []
                for batch in _chunks([work.prompt_ids[index] for index in shard], batch_size):
                    inputs = tokenizer.pad(
                        {"input_ids": batch}, padding=True, padding_side="left", return_tensors="pt"
                    ).to(work.device)  # left: generation continues from the right end of every row
                    output = model.generate(
                        **inputs,
                        **_transformers_sampling_kwargs(settings),
                        max_new_tokens=settings.max_new_tokens,
                        num_return_sequences=settings.n,
                    )
                    prompt_mask = inputs["attention_mask"].repeat_interleave(settings.n, dim=0)
                    logprobs = _generated_token_logprobs(model, output, prompt_mask)
                    generated = output[:, prompt_mask.shape[1] :].tolist()
                    decoded = [
                        _decode_generated(tokenizer, ids, row_logprobs, stop_ids)
                        for ids, row_logprobs in zip(generated, logprobs, strict=True)
                    ]
                    shard_samples.extend(_chunks(decoded, settings.n))  # rows come grouped by prompt
                work.shard_done(set_index, shard, shard_samples)
                samples.extend(shard_samples)
            sample_sets.append(samples)
    return sample_sets


def _generated_token_logprobs(
    model: PreTrainedModel, sequences: torch.Tensor, prompt_mask: torch.Tensor
) -> list[list[float]]:
    """The log-probability of every generated token of ``sequences`` (``generate``'s output: left-padded prompts
    whose mask is ``prompt_mask``, then the new tokens) under the model's raw distribution, from teacher-forced
    forward passes over a few rows at a time. Not ``generate(output_logits=True)``: that keeps the logits of
    every step, steps x rows x vocabulary, for the whole batch."""
    import torch

    prompt_length = prompt_mask.shape[1]
    mask = torch.cat([prompt_mask, prompt_mask.new_ones(sequences.shape[0], sequences.shape[1] - prompt_length)], dim=1)
    # The positions generate gave: counted from each row's first prompt token, past the left padding.
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    logprobs = []
    for start in range(0, sequences.shape[0], LOGPROB_ROWS_PER_PASS):
        rows = slice(start, start + LOGPROB_ROWS_PER_PASS)
        logits = model(input_ids=sequences[rows], attention_mask=mask[rows], position_ids=positions[rows]).logits
        # The logits at position t predict token t + 1.
        predicted = logits[:, prompt_length - 1 : -1].float().log_softmax(-1)
        logprobs.append(predicted.gather(-1, sequences[rows, prompt_length:, None]).squeeze(-1))
    return torch.cat(logprobs).tolist()


def _transformers_sampling_kwargs(settings: SamplingSettings) -> dict:
    """Greedy, or the tempered distribution with nucleus filtering and, as in vLLM, no top-k."""
    if settings.greedy:
        return {"do_sample": False}  # sampling knobs here would only draw warnings
    return {"do_sample": True, "temperature": settings.temperature, "top_p": settings.top_p, "top_k": 0}


def stop_token_ids(generation_eos: int | list[int] | None, tokenizer: PreTrainedTokenizerBase) -> set[int]:
    """The token ids that end a generation: the generation config's, else the tokenizer's EOS."""
    if generation_eos is None:
        return {tokenizer.eos_token_id}
    return set(generation_eos) if isinstance(generation_eos, list) else {generation_eos}


def _decode_generated(
    tokenizer: PreTrainedTokenizerBase, ids: list[int], logprobs: list[float], stop_ids: set[int]
) -> Sample:
    """Cut one generated row (and its tokens' log-probabilities) after its first stop token (the rest is padding)
    and decode it."""
    stop_at = next((position for position, token in enumerate(ids) if token in stop_ids), None)
    kept = ids if stop_at is None else ids[: stop_at + 1]
    return Sample(
        completion=tokenizer.decode(kept, skip_special_tokens=True),
        n_tokens=len(kept),
        finish_reason="length" if stop_at is None else "stop",
        token_logprobs=tuple(logprobs[: len(kept)]),
    )


def _sample_with_vllm(work: _Work, problem_ids: list[str], gpu_memory_utilization: float) -> list[list[list[Sample]]]:
    max_model_len = max(map(len, work.prompt_ids)) + max(settings.max_new_tokens for settings in work.settings_sets)
    sample_sets: list[list[list[Sample]]] = []
    with VllmEngine(
        work.checkpoint_dir,
        max_model_len=max_model_len,
        seed=work.settings_sets[0].seed,
        dtype=work.dtype,
        device=work.device,
        kv_cache_bytes=SAMPLING_KV_CACHE_BYTES,
        gpu_memory_utilization=gpu_memory_utilization,
    ) as engine:
        for set_index, settings in enumerate(work.settings_sets):
            samples: list[list[Sample]] = []
            for shard in _chunks(work.jobs[set_index], work.shard_size):
                params = [_vllm_sampling_params(settings, problem_ids[index]) for index in shard]
                outputs = engine.generate([work.prompt_ids[index] for index in shard], params)
                shard_samples = [[_vllm_sample(c) for c in sorted(o.outputs, key=lambda c: c.index)] for o in outputs]
                work.shard_done(set_index, shard, shard_samples)
                samples.extend(shard_samples)
            sample_sets.append(samples)
    return sample_sets


def _vllm_sample(completion: CompletionOutput) -> Sample:
    """One of vLLM's ``CompletionOutput``s; its ``logprobs`` hold, for each generated token, the chosen token's
    alone."""
    logprobs = tuple(
        position[token].logprob for token, position in zip(completion.token_ids, completion.logprobs, strict=True)
    )
    return Sample(completion.text, len(completion.token_ids), completion.finish_reason, logprobs)


def _vllm_sampling_params(settings: SamplingSettings, problem_id: str):
    """One problem's vLLM request settings, seeded from (settings seed, problem id) (`request_seed`)."""
    from vllm import SamplingParams

    return SamplingParams(
        n=settings.n,
        temperature=settings.temperature,
        top_p=settings.top_p,
        max_tokens=settings.max_new_tokens,
        seed=request_seed(settings.seed, problem_id),
        logprobs=0,  # the chosen token's logprob alone, at each position
    )
