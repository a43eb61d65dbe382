"""The shared-prefix loss against TRL's own (`training/shared_prefix.py`): the same per-token log-probs, entropies and
gradients through TRL's real GRPOTrainer, on the tiny Llama, a tiny Qwen2 and SmolLM2, and one GRPO step's loss and
weights; a wrong prompt mask given to the shared path breaks the equality (the check can fail)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from noisy_student_assets.core.training.base import TrainingRun, load_policy
from noisy_student_assets.core.training.compute import grpo_compute
from noisy_student_assets.core.training.grpo import build_training_dataset, grpo_loss, train_grpo
from noisy_student_assets.core.training.shared_prefix import LOSS_TOKENS, kept_together, pack_groups
from tests.training_data import SYSTEM_PROMPT, TINY_RUN, labeled_frame, pseudo_frame

LOGP_TOLERANCE = 1e-5
"""float32: the largest difference of a per-token log-prob or entropy from TRL's."""
GRADIENT_TOLERANCE = 1e-4
"""float32: the largest relative difference of a parameter's gradient (its difference's norm over its norm)."""

PROMPT_LENGTHS = (9, 14, 5)
COMPLETION_LENGTHS = ((7, 3, 1, 7), (5, 0, 6), (2, 7))
"""Three groups: prompts of unequal lengths (left-padded to the longest), completions of unequal lengths (one
empty, as a truncated completion masked out is), each row of a group apart from its siblings in the batch."""


@pytest.fixture(scope="module")
def training_set():
    return build_training_dataset(labeled_frame(), pseudo_frame(), SYSTEM_PROMPT)


def trainer_on(model_dir: Path, training_set, tmp_path: Path, *, use_lora: bool = True, dtype: str = "float32"):
    """TRL's GRPOTrainer as the project configures it (`grpo_loss`, LoRA or every weight), its LoRA adapters given
    random weights so that both their matrices have gradients."""
    from peft import LoraConfig

    loss = grpo_loss(TINY_RUN)
    model, tokenizer = load_policy(model_dir)
    config = loss.config_class(
        output_dir=str(tmp_path),
        per_device_train_batch_size=8,
        max_steps=1,
        use_cpu=True,
        bf16=dtype == "bfloat16",
        report_to=[],
        **loss.config,
    )
    lora = LoraConfig(task_type="CAUSAL_LM", r=4, lora_alpha=8, target_modules="all-linear") if use_lora else None
    trainer = loss.trainer_class(
        model=model,
        args=config,
        train_dataset=training_set,
        processing_class=tokenizer,
        peft_config=lora,
        **loss.trainer_options,
    )
    torch.manual_seed(1)
    with torch.no_grad():
        for name, parameter in trainer.model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(std=0.05)
    trainer.model.train()
    return trainer


def grouped_batch(vocab: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, int]:
    """TRL's loss inputs for `PROMPT_LENGTHS` x `COMPLETION_LENGTHS`: input ids, attention mask, completion length."""
    generator = torch.Generator().manual_seed(seed)
    prompt_width, completion_width = max(PROMPT_LENGTHS), max(max(group) for group in COMPLETION_LENGTHS)
    rows = []
    for prompt_length, completions in zip(PROMPT_LENGTHS, COMPLETION_LENGTHS, strict=True):
        prompt = torch.randint(10, vocab, (prompt_length,), generator=generator)
        for length in completions:
            ids = torch.zeros(prompt_width + completion_width, dtype=torch.long)
            mask = torch.zeros_like(ids)
            ids[prompt_width - prompt_length : prompt_width], mask[prompt_width - prompt_length : prompt_width] = (
                prompt,
                1,
            )
            ids[prompt_width : prompt_width + length] = torch.randint(10, vocab, (length,), generator=generator)
            mask[prompt_width : prompt_width + length] = 1
            rows.append((ids, mask))
    order = torch.randperm(len(rows), generator=generator)  # TRL shuffles a step's completions before micro-batches
    ids, mask = (torch.stack([rows[i][column] for i in order]) for column in (0, 1))
    return ids, mask, completion_width


def log_probs_and_gradients(trainer, ids, mask, completion_length, *, shared: bool, batch_size=None):
    """The per-token log-probs and entropies of TRL's log-prob method (the shared path or TRL's own), and the
    gradients of a weighted sum of both over the completion tokens."""
    trainer.shared_prefix = shared
    trainer.model.zero_grad()
    logps, entropies, _ = trainer._get_per_token_logps_and_entropies(
        trainer.model, ids, mask, completion_length, batch_size=batch_size, compute_entropy=True
    )
    weights = torch.linspace(-1.0, 1.0, logps.numel()).view_as(logps)
    ((logps + 0.1 * entropies) * weights).sum().backward()
    gradients = {name: p.grad.clone() for name, p in trainer.model.named_parameters() if p.grad is not None}
    return logps.detach(), entropies.detach(), gradients


def differences(trainer, ids, mask, completion_length, shared_mask=None, batch_size=None) -> tuple[float, float]:
    """The largest log-prob or entropy difference and the largest relative gradient difference of the shared path
    (given `shared_mask`, else the batch's own mask) from TRL's own on the same batch."""
    trl_logps, trl_entropies, trl_gradients = log_probs_and_gradients(
        trainer, ids, mask, completion_length, shared=False
    )
    logps, entropies, gradients = log_probs_and_gradients(
        trainer,
        ids,
        mask if shared_mask is None else shared_mask,
        completion_length,
        shared=True,
        batch_size=batch_size,
    )
    assert gradients.keys() == trl_gradients.keys()
    value = max((logps - trl_logps).abs().max().item(), (entropies - trl_entropies).abs().max().item())
    gradient = max(
        ((gradients[name] - g).norm() / g.norm()).item() for name, g in trl_gradients.items() if g.norm() > 0
    )
    return value, gradient


def assert_equal_to_trl(trainer, batch_size=None) -> None:
    ids, mask, completion_length = grouped_batch(trainer.model.config.vocab_size)
    value, gradient = differences(trainer, ids, mask, completion_length, batch_size=batch_size)
    assert value <= LOGP_TOLERANCE, f"log-probs differ from TRL's by {value:.3g}"
    assert gradient <= GRADIENT_TOLERANCE, f"gradients differ from TRL's by {gradient:.3g} relative"


def test_lora_log_probs_and_gradients_equal_trls(tiny_model_dir: Path, training_set, tmp_path: Path) -> None:
    assert_equal_to_trl(trainer_on(tiny_model_dir, training_set, tmp_path))


def test_full_fine_tune_gradients_equal_trls(tiny_model_dir: Path, training_set, tmp_path: Path) -> None:
    assert_equal_to_trl(trainer_on(tiny_model_dir, training_set, tmp_path, use_lora=False))


def test_chunks_of_a_batch_equal_trls(tiny_model_dir: Path, training_set, tmp_path: Path) -> None:
    """The old policy's and the reference's log-probs are taken in chunks of rows: a chunk holds part of a group."""
    assert_equal_to_trl(trainer_on(tiny_model_dir, training_set, tmp_path), batch_size=3)


def test_eager_attention_equals_trls(tiny_model_dir: Path, training_set, tmp_path: Path) -> None:
    """eager attention takes the mask additive, sdpa boolean."""
    trainer = trainer_on(tiny_model_dir, training_set, tmp_path)
    trainer.model.config._attn_implementation = "eager"
    assert_equal_to_trl(trainer)


def test_qwen2_equals_trls(tiny_model_dir: Path, training_set, tmp_path: Path) -> None:
    """The gpu profile's model family beside the cpu profile's Llama."""
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=1024,
        pad_token_id=tokenizer.pad_token_id,
    )
    Qwen2ForCausalLM(config).save_pretrained(tmp_path / "qwen2")
    tokenizer.save_pretrained(tmp_path / "qwen2")
    assert_equal_to_trl(trainer_on(tmp_path / "qwen2", training_set, tmp_path / "work"))


def test_bf16_stays_within_bf16_rounding_of_trls(tiny_model_dir: Path, training_set, tmp_path: Path) -> None:
    trainer = trainer_on(tiny_model_dir, training_set, tmp_path, dtype="bfloat16")
    ids, mask, completion_length = grouped_batch(trainer.model.config.vocab_size)
    value, gradient = differences(trainer, ids, mask, completion_length)
    assert value <= 0.05 and gradient <= 0.05


def test_a_wrong_prompt_mask_breaks_the_equality(tiny_model_dir: Path, training_set, tmp_path: Path) -> None:
    """The same check, the shared path given one prompt token too few: it fails, so its passing above proves
    something."""
    trainer = trainer_on(tiny_model_dir, training_set, tmp_path)
    ids, mask, completion_length = grouped_batch(trainer.model.config.vocab_size)
    wrong = mask.clone()
    row = int(mask[:, 0].argmax())  # a row of the longest prompt, whose first token is not padding
    wrong[row, 0] = 0
    value, gradient = differences(trainer, ids, mask, completion_length, shared_mask=wrong)
    assert value > 100 * LOGP_TOLERANCE and gradient > 100 * GRADIENT_TOLERANCE


def test_packing_computes_each_prompt_once_and_counts_it(tiny_model_dir: Path, training_set, tmp_path: Path) -> None:
    ids, mask, completion_length = grouped_batch(1000)
    packed = pack_groups(ids, mask, completion_length)
    assert packed.input_ids.size(0) == len(PROMPT_LENGTHS)
    own_tokens = [
        (prompt - 1) + sum(length + 1 for length in group)
        for prompt, group in zip(PROMPT_LENGTHS, COMPLETION_LENGTHS, strict=True)
    ]
    assert sorted((packed.segments >= 0).sum(1).tolist()) == sorted(own_tokens)
    trainer = trainer_on(tiny_model_dir, training_set, tmp_path)
    trainer._metrics["train"].clear()
    log_probs_and_gradients(trainer, ids, mask, completion_length, shared=True)
    counts = {name: trainer._metrics["train"][name] for name in LOSS_TOKENS}
    assert counts == {
        "loss_tokens/computed": [packed.computed_tokens],
        "loss_tokens/unshared": [ids.numel()],
        "loss_tokens/completions": [sum(map(sum, COMPLETION_LENGTHS))],
    }
    assert packed.computed_tokens < ids.numel()


def test_a_gap_in_a_completion_mask_is_left_to_trls_forward() -> None:
    ids, mask, completion_length = grouped_batch(1000)
    holed = mask.clone()
    holed[int(mask[:, -1].argmax()), -2] = 0
    assert pack_groups(ids, holed, completion_length) is None


def test_a_steps_micro_batches_keep_each_group_together() -> None:
    """TRL's shuffled split of two groups of four into two micro-batches, re-split: a group a micro-batch, every
    row once with its own columns, the group whose row came first first."""
    prompts = torch.tensor([[0, 5, 6], [7, 8, 9]])
    shuffled = torch.tensor([1, 0, 0, 1, 1, 0, 1, 0])
    rows = {
        "prompt_ids": prompts[shuffled],
        "prompt_mask": (prompts[shuffled] > 0).long(),
        "advantages": torch.arange(8.0),
        "completions": [f"row {index}" for index in range(8)],
        "num_items_in_batch": torch.tensor(20),
    }
    micro_batches = [{key: value[:4] if key != "num_items_in_batch" else value for key, value in rows.items()}]
    micro_batches.append({key: value[4:] if key != "num_items_in_batch" else value for key, value in rows.items()})
    together = kept_together(micro_batches)
    assert [batch["prompt_ids"].unique(dim=0).tolist() for batch in together] == [[[7, 8, 9]], [[0, 5, 6]]]
    assert [batch["advantages"].tolist() for batch in together] == [[0.0, 3.0, 4.0, 6.0], [1.0, 2.0, 5.0, 7.0]]
    assert together[0]["completions"] == ["row 0", "row 3", "row 4", "row 6"]
    assert all(int(batch["num_items_in_batch"]) == 20 for batch in together)


def one_step(model_dir: Path, training_set, out: Path, **settings):
    settings = TINY_RUN.model_copy(update={"max_steps": 1, "save_steps": 0, **settings})
    return train_grpo(model_dir, training_set, settings, out / "merged", TrainingRun(out / "w"))


def step_compute(result):
    return grpo_compute(result.log_history, 1, TINY_RUN.prompts_per_step, TINY_RUN.num_generations)


@pytest.mark.parametrize("micro_batches", [2, 4])
def test_one_grpo_step_trains_the_same_loss_and_weights(
    sevens_model_dir: Path, training_set, tmp_path: Path, micro_batches: int
) -> None:
    """A whole step through the project's trainer (TRL's own generation; 2 micro-batches a step, a group each once
    kept together, or 4, each half a group): the same loss and updated weights with the shared prefix on and off,
    and the counts in the compute record."""
    results = {
        shared: one_step(
            sevens_model_dir,
            training_set,
            tmp_path / str(shared),
            shared_prefix=shared,
            gradient_accumulation_steps=micro_batches,
        )
        for shared in (False, True)
    }
    trl, shared = results[False], results[True]
    assert shared.metrics["train_loss"] == pytest.approx(trl.metrics["train_loss"], abs=1e-6)
    trl_weights, shared_weights = (load_file(r.checkpoint_dir / "model.safetensors") for r in (trl, shared))
    for name, weight in trl_weights.items():
        torch.testing.assert_close(shared_weights[name], weight, atol=1e-5, rtol=1e-4)
    computes = {key: step_compute(result) for key, result in results.items()}
    assert computes[True].trained_tokens == computes[False].trained_tokens > 0
    assert computes[True].loss_tokens_unshared == computes[False].loss_tokens_unshared == computes[False].loss_tokens
    assert computes[True].loss_tokens < computes[False].loss_tokens


def test_groups_kept_together_compute_fewer_tokens_than_trls_shuffle(
    sevens_model_dir: Path, training_set, tmp_path: Path
) -> None:
    """The same step's completions (same seed, the loss type changes only how the loss is averaged) split TRL's way
    (bnpo averages over a micro-batch's tokens, so its rows stay shuffled) and a group a micro-batch (dapo)."""
    steps = {
        loss_type: one_step(
            sevens_model_dir, training_set, tmp_path / loss_type, loss_type=loss_type, gradient_accumulation_steps=2
        )
        for loss_type in ("bnpo", "dapo")
    }
    shuffled, together = (step_compute(steps[loss_type]) for loss_type in ("bnpo", "dapo"))
    assert together.trained_tokens == shuffled.trained_tokens
    assert together.loss_tokens < shuffled.loss_tokens


def padding_floor(trainer, ids, mask, completion_length) -> float:
    """How far TRL's own log-probs move when every row gets one more column of left padding: the same computation
    (rotary attention sees only relative positions), so float32's own rounding at this model's depth."""
    trainer.shared_prefix = False
    pad = torch.full((ids.size(0), 1), 0)
    with torch.no_grad():
        logps = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, completion_length)[0]
        padded = trainer._get_per_token_logps_and_entropies(
            trainer.model, torch.cat([pad, ids], 1), torch.cat([torch.zeros_like(pad), mask], 1), completion_length
        )[0]
    return (logps - padded).abs().max().item()


@pytest.mark.slow
def test_smollm2_log_probs_and_gradients_equal_trls(training_set, tmp_path: Path) -> None:
    """SmolLM2's 30 layers: TRL's own forward moves by more than `LOGP_TOLERANCE` under one more padding column, so
    the log-probs are held to twice that floor (and the gradients to `GRADIENT_TOLERANCE`)."""
    from noisy_student_assets.core.checkpoints import SMOLLM2_PACKAGE, materialize_checkpoint

    materialize_checkpoint(SMOLLM2_PACKAGE, tmp_path / "smollm2")
    trainer = trainer_on(tmp_path / "smollm2", training_set, tmp_path / "work")
    ids, mask, completion_length = grouped_batch(trainer.model.config.vocab_size)
    floor = padding_floor(trainer, ids, mask, completion_length)
    value, gradient = differences(trainer, ids, mask, completion_length)
    assert value <= max(LOGP_TOLERANCE, 2 * floor), f"log-probs differ by {value:.3g}, float32's floor {floor:.3g}"
    assert gradient <= GRADIENT_TOLERANCE, f"gradients differ from TRL's by {gradient:.3g} relative"
