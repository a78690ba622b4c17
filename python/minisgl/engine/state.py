"""The recurrent-state pool of a hybrid model's engine, sized at start-up from the same memory
budget as the KV pool (its bytes come off the top, the KV pages get the rest), its backend, and
each batch's ``StateMetadata``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from minisgl.kvcache.state_metadata import StateMetadata
from minisgl.kvcache.state_pool import StatePool
from minisgl.utils import init_logger

if TYPE_CHECKING:
    from minisgl.core import Batch
    from minisgl.kvcache.spec import CacheSpec

    from .config import EngineConfig

logger = init_logger(__name__)


def create_state_pool(spec: CacheSpec, config: EngineConfig,
                      device: torch.device) -> StatePool | None:
    """One slot per page-table row (the dummy row's is scratch) plus the prefix cache's snapshot
    slots; None for a model without linear-attention layers (``spec.has_state``)."""
    if spec.state_shape is None:  # spec.has_state
        return None
    snapshots = config.num_state_snapshots
    if snapshots is None:  # a quarter of the request slots: a slot is ~1.5-3k tokens of KV
        snapshots = max(1, config.max_running_reqs // 4)
    pool = StatePool(spec.state_shape, spec.num_state_layers, config.max_running_reqs,
                     snapshots, config.dtype, device, ssm_dtype=config.state_dtype,
                     num_draft_groups=config.spec_state_groups,
                     draft_group_size=config.spec_group_size)
    logger.info("state pool: %d slots (%d requests + %d snapshots + %d draft) of %.2f MiB "
                "(%s state), %.2f GiB", pool.num_slots, config.max_running_reqs,
                pool.num_snapshots, pool.num_slots - pool.first_draft_slot,
                pool.bytes_per_slot / (1 << 20), str(config.state_dtype).removeprefix("torch."),
                pool.total_bytes / (1 << 30))
    return pool


def attach_state_metadata(batch: Batch, device: torch.device) -> None:
    """Slots are page-table rows; a request starts from zeros when nothing of it is cached; a
    request verifying drafts (right after the decode rows) leaves its per-token states in its
    draft slots (``Feed.draft_slot``)."""
    feeds = batch.feeds
    batch.state_metadata = StateMetadata.build(
        [f.table_idx for f in feeds], [f.extend_len for f in feeds],
        [f.cached_len == 0 for f in feeds], batch.num_decode_rows, device,
        draft_slots=[f.draft_slot for f in feeds if f.drafts])
