"""GRPO's loss with each group's prompt computed once (no Dagster here): the shared-prefix forward of verl's
`use_prefix_grouper` (Prefix Grouper, arXiv 2506.05433), inside TRL's own trainer.

TRL's loss runs its model over every completion with its prompt in front, so a micro-batch of a group's completions
computes that prompt once per completion. `pack_groups` lays a micro-batch out instead as one row per distinct
prompt: the prompt's tokens, then each completion's, every completion led by its own copy of the prompt's last token
(whose hidden state scores the completion's first token). A 4-D attention mask lets the prompt attend causally to
itself and each completion to the prompt and causally to itself, never to its siblings, and every token keeps the
position it has in TRL's layout (a left-padded prompt's padding included), so each scored token sees the same keys
at the same rotary positions as in TRL's forward: the log-probs are TRL's to float rounding, and so are the
gradients, which reach the prompt's weights once per group instead of once per completion. transformers takes a
4-D mask as given (`masking_utils`), and TRL's fused LM head scores pre-shifted labels (`shift_labels`), so only the
layout is this module's: the backbone, the tiled log-softmax and the loss are TRL's and transformers'.

`SharedPrefixGRPOTrainer` overrides TRL's per-token log-prob method (`_get_per_token_logps_and_entropies`), which
the loss, the old policy's and the reference's log-probs all call, and counts per step the positions the loss's
forward ran over beside those TRL's layout would have and the completion tokens trained on (`LOSS_TOKENS`). TRL
shuffles a step's completions before it splits them into micro-batches, so a micro-batch would hold parts of most
groups and compute each prompt again; where the split cannot change the update (one optimizer step whose loss adds
up over completions or the whole batch), the trainer re-splits them a group at a time (`kept_together`).
The prefix-grouper package does the same split inside the attention call, but through an attention implementation
of its own that the model would have to switch to for the loss and back for TRL's own generation.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

LOSS_TOKENS_COMPUTED = "loss_tokens/computed"
"""Logged each step: the token positions the loss's forward and backward ran over (padding included)."""
LOSS_TOKENS_UNSHARED = "loss_tokens/unshared"
"""Logged each step: the positions TRL's own layout runs over for the same completions (each with its prompt)."""
LOSS_TOKENS_COMPLETIONS = "loss_tokens/completions"
"""Logged each step: the completion tokens the loss trained on."""
LOSS_TOKENS = (LOSS_TOKENS_COMPUTED, LOSS_TOKENS_UNSHARED, LOSS_TOKENS_COMPLETIONS)

MASK_FORMATS = ("sdpa", "eager")
"""transformers' attention implementations that take a 4-D mask: sdpa a boolean one, eager an additive one."""

IGNORED = -100
"""A position whose next token is not scored (transformers' and TRL's label for it)."""


@dataclass(frozen=True)
class PackedGroups:
    """A micro-batch of (prompt, completion) rows laid out as one row per distinct prompt (`pack_groups`)."""

    input_ids: torch.Tensor
    """(groups, length): a prompt's tokens but its last, then for each completion that token and the completion's."""
    position_ids: torch.Tensor
    """Each token's position in TRL's layout of its row: a prompt's padding counts, a completion starts after it."""
    segments: torch.Tensor
    """0: the shared prompt; k >= 1: the k-th completion's own tokens; -1: padding."""
    shift_labels: torch.Tensor
    """The token scored at each position (the next one of its completion), `IGNORED` where none is."""
    source: tuple[torch.Tensor, torch.Tensor]
    """For each (row, completion position) of TRL's layout, the packed (group, position) that scores its token."""
    scored: torch.Tensor
    """(rows, completion length), boolean: the completion tokens TRL scores (its completion mask)."""

    def attention_mask(self, implementation: str) -> torch.Tensor:
        """The 4-D mask (groups, 1, length, length) in `implementation`'s format: True (sdpa) or 0.0 (eager, added to
        the scores in float32) where a query may attend a key. Every position attends itself, so that no padding row
        is empty."""
        import torch

        if implementation not in MASK_FORMATS:
            raise ValueError(_unmasked(implementation))
        query, key = self.segments[:, :, None], self.segments[:, None, :]
        length = self.segments.size(1)
        causal = torch.ones(length, length, dtype=torch.bool, device=self.segments.device).tril()
        allowed = causal & (key >= 0) & ((key == 0) | (key == query))
        allowed |= torch.eye(length, dtype=torch.bool, device=self.segments.device)
        allowed = allowed[:, None]
        if implementation == "sdpa":
            return allowed
        return torch.zeros(allowed.shape, device=allowed.device).masked_fill(~allowed, torch.finfo(torch.float32).min)

    def unpack(self, packed: torch.Tensor) -> torch.Tensor:
        """A per-position output of the packed rows (groups, length) in TRL's layout (rows, completion length), 0
        where TRL scores no token (as its fused LM head leaves them)."""
        return packed[self.source].masked_fill(~self.scored, 0)

    @property
    def computed_tokens(self) -> int:
        return self.input_ids.numel()


def _unmasked(implementation: str) -> str:
    return (
        f"the shared-prefix loss needs a 4-D attention mask, which attention {implementation!r} does not take (one of "
        f"{MASK_FORMATS} does); set grpo.shared_prefix false"
    )


def pack_groups(input_ids: torch.Tensor, attention_mask: torch.Tensor, completion_length: int) -> PackedGroups | None:
    """TRL's loss inputs (rows of a left-padded prompt and a right-padded completion of `completion_length`
    positions, `attention_mask` 1 on their tokens) as one packed row per distinct prompt. None where a row is laid out
    otherwise than this packing reproduces (a row with no prompt token, or a completion mask with a gap): TRL's own
    forward serves those."""
    import torch

    prompt_length = input_ids.size(1) - completion_length
    prompt_ids, completion_ids = input_ids[:, :prompt_length], input_ids[:, prompt_length:]
    prompt_mask, completion_mask = attention_mask[:, :prompt_length].bool(), attention_mask[:, prompt_length:].bool()
    lengths = completion_mask.sum(1)
    contiguous = torch.arange(completion_length, device=input_ids.device)[None, :] < lengths[:, None]
    if not torch.equal(completion_mask, contiguous) or not prompt_mask.any(1).all():
        return None
    _, group_of = torch.unique(prompt_ids.masked_fill(~prompt_mask, -1), dim=0, return_inverse=True)
    source_group = torch.zeros_like(completion_ids)
    source_position = torch.zeros_like(completion_ids)
    rows = []
    for group in range(int(group_of.max()) + 1):
        members = (group_of == group).nonzero().flatten().tolist()
        row, offset = _packed_row(prompt_ids, prompt_mask, completion_ids, lengths, members, prompt_length)
        for member in members:
            source_group[member] = group
            source_position[member, : lengths[member]] = offset[member] + torch.arange(int(lengths[member]))
        rows.append(row)
    return PackedGroups(
        **_padded(rows, input_ids.device),
        source=(source_group, source_position),
        scored=completion_mask,
    )


def _packed_row(prompt_ids, prompt_mask, completion_ids, lengths, members, prompt_length):
    """One group's packed row (its four per-position columns) and where each member's completion tokens are scored:
    the position of its copy of the prompt's last token (which scores the completion's first token)."""
    import torch

    positions = prompt_mask[members[0]].nonzero().flatten()
    shared, last = positions[:-1], positions[-1:]
    ids, position_ids = [prompt_ids[members[0], shared]], [shared]
    segments, labels = [torch.zeros_like(shared)], [torch.full_like(shared, IGNORED)]
    offset, start = {}, shared.numel()
    for segment, member in enumerate(members, start=1):
        length = int(lengths[member])
        completion = completion_ids[member, :length]
        ids.append(torch.cat([prompt_ids[member, last], completion]))
        position_ids.append(torch.cat([last, prompt_length + torch.arange(length, device=last.device)]))
        segments.append(torch.full((length + 1,), segment, device=last.device))
        labels.append(torch.cat([completion, torch.full_like(last, IGNORED)]))
        offset[member] = start
        start += length + 1
    columns = (ids, position_ids, segments, labels)
    return tuple(torch.cat(column) for column in columns), offset


def _padded(rows: list[tuple], device) -> dict:
    """The packed rows as tensors of the longest one's length: padding is token 0 at position 0 in segment -1,
    unscored."""
    import torch

    length = max(row[0].numel() for row in rows)
    fills = {"input_ids": 0, "position_ids": 0, "segments": -1, "shift_labels": IGNORED}
    padded = {}
    for column, (name, fill) in enumerate(fills.items()):
        padded[name] = torch.full((len(rows), length), fill, dtype=torch.long, device=device)
        for index, row in enumerate(rows):
            padded[name][index, : row[column].numel()] = row[column]
    return padded


def kept_together(micro_batches: list[dict]) -> list[dict]:
    """A generation batch's micro-batches (TRL's, of shuffled rows) re-split so that each group's rows are adjacent:
    the groups in the order their first rows came, each group's rows in theirs. A micro-batch then holds as few
    groups as the split allows, and `pack_groups` computes each of its prompts once."""
    import torch
    from trl.trainer.utils import split_tensor_dict

    rows = {key: _joined([batch[key] for batch in micro_batches]) for key in micro_batches[0]}
    prompt_ids = rows["prompt_ids"].masked_fill(~rows["prompt_mask"].bool(), -1)
    _, group_of = torch.unique(prompt_ids, dim=0, return_inverse=True)
    first_row = torch.full((int(group_of.max()) + 1,), group_of.numel()).scatter_reduce(
        0, group_of, torch.arange(group_of.numel()), reduce="amin"
    )
    order = torch.sort(first_row[group_of], stable=True).indices
    reordered = {key: _reordered(value, order) for key, value in rows.items()}
    return split_tensor_dict(reordered, len(micro_batches))


def _joined(values: list):
    """One column of a batch's micro-batches as one column: tensors and lists joined, a 0-d tensor or None kept."""
    import torch

    first = values[0]
    if isinstance(first, list):
        return [item for value in values for item in value]
    if isinstance(first, torch.Tensor) and first.ndim > 0:
        return torch.cat(values)
    return first


def _reordered(value, order):
    import torch

    if isinstance(value, list):
        return [value[index] for index in order.tolist()]
    if isinstance(value, torch.Tensor) and value.ndim > 0:
        return value[order]
    return value


def groups_kept_together(trainer) -> bool:
    """Whether a step's micro-batches may keep each group's completions together instead of TRL's shuffle: where the
    step is one optimizer step whose loss adds up per completion or over the whole batch, how its rows are split does
    not change the update (a per-micro-batch token mean, an entropy bonus or mask, or several optimizer steps a
    generation would)."""
    return (
        trainer.shared_prefix
        and trainer.num_iterations == 1
        and trainer.args.steps_per_generation == trainer.args.gradient_accumulation_steps
        and trainer.loss_type != "bnpo"
        and trainer.top_entropy_quantile == 1.0
        and not trainer._entropy_bonus_enabled
        and "pixel_values" not in trainer._buffered_inputs[0]
    )


def packed_logps(model, packed: PackedGroups, implementation: str, compute_entropy: bool):
    """The per-token log-probs (and entropies, if asked) of a packed micro-batch's completions, each group's prompt
    computed once, in the rows' own layout."""
    outputs = model(
        input_ids=packed.input_ids,
        attention_mask=packed.attention_mask(implementation),
        position_ids=packed.position_ids,
        shift_labels=packed.shift_labels,
        fused_lm_head=True,
    )
    return packed.unpack(outputs.log_probs), packed.unpack(outputs.entropy) if compute_entropy else None


@cache
def shared_prefix_trainer_class() -> type:
    """`SharedPrefixGRPOTrainer`, defined on first use: TRL is imported only where a GRPO run trains."""
    from trl import GRPOTrainer

    class SharedPrefixGRPOTrainer(GRPOTrainer):
        """TRL's GRPOTrainer whose per-token log-probs compute each group's prompt once (`pack_groups`), over
        micro-batches that keep a group together where that leaves the update as it is (`kept_together`), when
        `shared_prefix` is on, and that logs the loss's token counts (`LOSS_TOKENS`) either way."""

        def __init__(self, *args, shared_prefix: bool = True, **kwargs):
            super().__init__(*args, **kwargs)
            self.shared_prefix = shared_prefix
            implementation = self.accelerator.unwrap_model(self.model).config._attn_implementation
            if shared_prefix and implementation not in MASK_FORMATS:  # refused before the first step, not at it
                raise ValueError(_unmasked(implementation))

        def _prepare_inputs(self, generation_batch):
            buffered = self._buffered_inputs
            inputs = super()._prepare_inputs(generation_batch)
            # TRL's own schedule decides when a step generates: a new buffer of micro-batches is the sign
            if self._buffered_inputs is not buffered and groups_kept_together(self):
                self._buffered_inputs = kept_together(self._buffered_inputs)
                inputs = self._buffered_inputs[self._step % self.args.steps_per_generation]
            return inputs

        def _get_per_token_logps_and_entropies(
            self, model, input_ids, attention_mask, logits_to_keep, batch_size=None, compute_entropy=False, **extra
        ):
            # a call asking for more than text log-probs (images, a mixture-of-experts loss) is TRL's own forward's
            if not self.shared_prefix or any(value not in (None, False) for value in extra.values()):
                self._count_loss_tokens(input_ids.numel(), input_ids.numel(), attention_mask[:, -logits_to_keep:])
                return super()._get_per_token_logps_and_entropies(
                    model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy, **extra
                )
            return self._shared_prefix_logps(
                model, input_ids, attention_mask, logits_to_keep, batch_size or input_ids.size(0), compute_entropy
            )

        def _shared_prefix_logps(self, model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy):
            import torch

            implementation = self.accelerator.unwrap_model(model).config._attn_implementation
            logps, entropies = [], []
            for start in range(0, input_ids.size(0), batch_size):
                rows = slice(start, start + batch_size)
                packed = pack_groups(input_ids[rows], attention_mask[rows], logits_to_keep)
                if packed is None:
                    chunk_logps, chunk_entropies, _ = super()._get_per_token_logps_and_entropies(
                        model, input_ids[rows], attention_mask[rows], logits_to_keep, compute_entropy=compute_entropy
                    )
                    computed = input_ids[rows].numel()
                else:
                    with self.accelerator.autocast():
                        chunk_logps, chunk_entropies = packed_logps(model, packed, implementation, compute_entropy)
                    computed = packed.computed_tokens
                self._count_loss_tokens(computed, input_ids[rows].numel(), attention_mask[rows, -logits_to_keep:])
                logps.append(chunk_logps)
                entropies.append(chunk_entropies)
            return torch.cat(logps), torch.cat(entropies) if compute_entropy else None, None

        def _count_loss_tokens(self, computed: int, unshared: int, completion_mask) -> None:
            """Add a loss forward's counts, over every training process, to the step's (`LOSS_TOKENS`, summed until
            TRL logs and clears its metrics); the old policy's and the reference's forwards, outside the gradient,
            are not the loss's."""
            import torch

            if not torch.is_grad_enabled():
                return
            counts = torch.tensor([computed, unshared, int(completion_mask.sum())], device=self.accelerator.device)
            if self.accelerator.num_processes > 1:  # every process runs as many loss forwards, so all take part
                counts = self.accelerator.reduce(counts, reduction="sum")
            metrics = self._metrics["train"]
            for name, count in zip(LOSS_TOKENS, counts.tolist(), strict=True):
                metrics[name] = [sum(metrics[name]) + count]

    return SharedPrefixGRPOTrainer
