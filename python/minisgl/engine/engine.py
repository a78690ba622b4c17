"""The engine: one TP worker's model, KV pool, page table and attention backend, and one forward."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minisgl.attention import create_attention_backend
from minisgl.core import Batch, Context
from minisgl.distributed import DistributedCommunicator
from minisgl.kvcache import create_kvcache_pool
from minisgl.models import BaseLLMModel, ModelConfig, get_model_class
from minisgl.models.weight import init_dummy_weights, iter_weights
from minisgl.moe import create_moe_backend
from minisgl.utils import init_logger

from .config import EngineConfig
from .sample import BatchSamplingArgs, SampleOutput, sample

logger = init_logger(__name__)


@dataclass
class ForwardOutput:
    """What one forward hands back to the scheduler: one row per sampled request."""

    next_tokens: torch.Tensor  # [B] int64, on the CPU
    sample: SampleOutput  # device tensors, including log-probabilities when asked
    logits: torch.Tensor  # [B, vocab] on the device (for tests and debugging)


class Engine:
    def __init__(self, config: EngineConfig, comm: DistributedCommunicator | None = None) -> None:
        self.config = config
        self.device = config.device
        self.comm = comm or DistributedCommunicator(config.tp)
        self.model_config = ModelConfig.from_path(config.model_path)
        self.model = self._build_model()
        max_pos = self.model_config.max_position
        self.max_seq_len = min(config.max_seq_len or max_pos, max_pos)
        self.num_pages = config.num_pages or self._pages_from_memory()
        mc = self.model_config
        self.kv_pool = create_kvcache_pool(
            num_layers=mc.num_layers,
            num_kv_heads=self.model.layers[0].self_attn.qkv_proj.local_kv,
            head_dim=mc.head_dim,
            num_pages=self.num_pages,
            page_size=config.page_size,
            dtype=config.dtype,
            device=self.device,
        )
        # one row per running request, plus a dummy row (padding for CUDA graphs)
        self.page_table = torch.zeros(
            config.max_running_reqs + 1, self.max_seq_len, dtype=torch.int32, device=self.device
        )
        self.attn_backend = create_attention_backend(
            config.attention_backend, self.kv_pool, self.page_table, mc.head_dim**-0.5
        )
        self.ctx = Context(self.page_table, self.kv_pool, self.attn_backend)
        logger.info(
            "engine ready: %s on %s (%s), %d KV pages of %d tokens",
            mc.architecture, self.device, config.dtype, self.num_pages, config.page_size,
        )

    def _build_model(self) -> BaseLLMModel:
        cls = get_model_class(self.model_config.architecture)
        with torch.device(self.device):
            model = cls(self.model_config, self.comm, create_moe_backend(self.config.moe_backend))
        model = model.to(self.config.dtype).eval()
        if self.config.dummy_weights:
            init_dummy_weights(model, self.config.seed)
        else:
            model.load_weights(iter_weights(self.config.model_path))
        return model

    def _pages_from_memory(self) -> int:
        mc = self.model_config
        local_kv = self.model.layers[0].self_attn.qkv_proj.local_kv
        bytes_per_token = 2 * mc.num_layers * local_kv * mc.head_dim * self.config.dtype.itemsize
        if self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)
            budget = free - (1 - self.config.mem_fraction) * total
        else:
            budget = self.config.kv_cache_memory_gb * (1 << 30)
        pages = int(budget // (bytes_per_token * self.config.page_size))
        # more than every request at full length could ever use is wasted memory
        pages = min(pages, -(-self.config.max_running_reqs * self.max_seq_len // self.config.page_size))
        if pages < 1:
            raise RuntimeError("no memory left for the KV cache; lower the model size or raise the budget")
        return pages

    @property
    def vocab_size(self) -> int:
        return self.model_config.vocab_size

    @torch.inference_mode()
    def forward(self, batch: Batch, args: BatchSamplingArgs) -> ForwardOutput:
        with self.ctx.forward_batch(batch):
            self.attn_backend.prepare_metadata(batch)
            hidden = self.model(batch.input_ids, batch.positions, self.ctx)
        logits = self.model.compute_logits(hidden[batch.logits_idx])
        out = sample(logits, args)
        return ForwardOutput(next_tokens=out.next_tokens.cpu(), sample=out, logits=logits)
