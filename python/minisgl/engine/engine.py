"""The engine: one TP worker's model, KV pool, page table and attention backend, and one forward."""

from __future__ import annotations

import torch

from minisgl.attention import BaseAttnBackend
from minisgl.context import Context
from minisgl.core import Batch, Req
from minisgl.distributed import DistributedCommunicator, init_distributed
from minisgl.kvcache import BaseKVCachePool
from minisgl.linear_attn import create_linear_attn_backend
from minisgl.models import BaseLLMModel
from minisgl.models.base import weight_bytes
from minisgl.multimodal.prompt import MultimodalPrompt
from minisgl.sampling import BatchSamplingArgs, SampleOutput, SamplingState, sample
from minisgl.utils import init_logger
from minisgl.utils.startup import Phases

from .batch import prepare_batch, write_drafts
from .build import build_model, make_pool
from .config import EngineConfig
from .head_graph import HeadGraphRunner
from .images import ImageEncoder
from .loading import load_model_config
from .memory import chain_pages, kv_budget
from .pool_sizes import may_window, size_pools
from .prompt_logprobs import compute_prompt_logprobs
from .state import attach_state_metadata, create_state_pool
from .types import CompilingKernels, ForwardOutput
from .window import check_pool, window

logger = init_logger(__name__)

_KERNEL_WAIT_S = 900  # far beyond any warm-up (a wedged one must not hold the start-up forever)


class Engine:
    """Model, KV pool, page table and attention backend of one TP worker.

    Page 0 of the pool is a scratch page that no request owns: padding rows of CUDA-graph batches
    and the profiling run write their K/V there. The page table's last row is the dummy request.
    """

    def __init__(self, config: EngineConfig, comm: DistributedCommunicator | None = None,
                 kernels: CompilingKernels | None = None) -> None:
        self.config = config
        self.device = config.device
        phases = Phases()  # where the start-up's seconds go (the "engine ready" line)
        if self.device.type == "cuda":
            if self.device.index is None:
                self.device = torch.device("cuda", torch.cuda.current_device())
            torch.cuda.set_device(self.device)
        if comm is None:
            comm = (init_distributed(config.tp, config.dist_init_addr, self.device)
                    if config.tp.size > 1 else DistributedCommunicator(config.tp))
        self.comm = comm
        # compiling the kernel variants on every core while the weights load (``minisgl.warmup``)
        self.kernels = kernels
        self.model_config = mc = window(load_model_config(config, self.device), config.max_seq_len)
        self.model = self._build_model()
        phases.mark("weights")
        if self.kernels is not None and not self.kernels.wait_ready(_KERNEL_WAIT_S):
            # the forwards' kernels, before any forward runs; else they compile on first use
            logger.warning("the kernel warm-up is not done after %d s; going on without it",
                           _KERNEL_WAIT_S)
        phases.mark("kernels")
        # the model declares its caches: KV layers and their shapes, windows, recurrent state
        self.cache_spec = self.model.cache_spec()
        # a vision-language checkpoint's tower (None: the model takes no images), loaded before
        # the pool is sized from what memory is left
        self.images = ImageEncoder.load(
            config.model_path, mc.rotary.mrope is not None,
            any(spec.image_blocks for spec in self.cache_spec.attention), config.dtype,
            self.device, config.dummy_weights, config.max_image_tokens)
        self.max_seq_len = config.max_seq_len or mc.max_position
        self.dummy_row = config.max_running_reqs
        table_shape = (config.max_running_reqs + 1, self.max_seq_len)
        self.page_table = torch.zeros(table_shape, dtype=torch.int32, device=self.device)
        # token_pool[row, pos]: the token at position pos of the request in that row, written on the
        # device by sampling, read by the next decode (see batch.py)
        self.token_pool = torch.zeros(table_shape, dtype=torch.int32, device=self.device)
        # penalty counts and logit biases of the request in each row (allocated on first use)
        self.sampling_state = SamplingState(table_shape[0], mc.vocab_size, self.device)
        self.state_pool = create_state_pool(self.cache_spec, config, self.device)
        self.linear_attn = None if self.state_pool is None else create_linear_attn_backend(
            config.linear_attn_backend, self.state_pool, self.device)
        # the sliding layers in a slot space of their own whose pages past the window go back
        # (``scheduler/window.py``), when ``pool_sizes.py`` finds that it pays: its page table
        # exists while the pool is sized (the profiling run reads it)
        windowed = may_window(self.cache_spec, config.sliding_pool_ratio,
                              self.images is not None and self.images.image_blocks)
        self.window_page_table = (torch.zeros(table_shape, dtype=torch.int32, device=self.device)
                                  if windowed else None)
        draft_pages = chain_pages(config, self.cache_spec)  # after the scheduler's
        # every rank must hold the same number of pages: the schedulers make identical decisions
        budget = None if config.num_pages else self.comm.min_int(int(kv_budget(self)))
        sizes = size_pools(self.cache_spec, config, self.max_seq_len, budget, windowed)
        self.num_pages = sizes.full_pages - (draft_pages if budget is not None else 0)
        self.window_pages = sizes.window_pages
        if self.window_pages is None:
            self.window_page_table = None
        if windowed:  # the sizes chosen and why (``pool_sizes.py``)
            pools = (f"{self.num_pages} full-attention pages and {self.window_pages} "
                     "sliding-window pages" if self.window_pages else
                     f"one pool of {self.num_pages} pages")
            logger.info("KV: %s of %d tokens; %s", pools, config.page_size, sizes.why)
        check_pool(config.max_seq_len, self.max_seq_len, (self.num_pages - 1) * config.page_size,
                   config.page_size, self.kv_bytes_per_token, self.device.type == "cpu")
        self.kv_pool, self.attn_backend = self.make_pool(self.num_pages + draft_pages,
                                                         self.window_pages)
        phases.mark("memory")
        self.draft_slots = torch.arange(
            self.num_pages * config.page_size, (self.num_pages + draft_pages) * config.page_size,
            dtype=torch.int32, device=self.device)
        self.ctx = Context(self.page_table, self.kv_pool, self.attn_backend, self.state_pool,
                           self.linear_attn)
        # eager forwards' token counts are rounded up to this (batch.py says why)
        self.pad_tokens = (config.pad_tokens if self.device.type == "cuda"
                           and self.attn_backend.supports_padding else 1)
        self.graph_runner = self.piecewise = None
        self.head_graphs: HeadGraphRunner | None = None  # a draft head's chain step (head_graph.py)
        # a hybrid model's graphs need a linear-attention backend that can be captured; decode
        # graphs read the sliding layers' own page table, a static buffer, as they read the other
        graphs = self.linear_attn is None or self.linear_attn.supports_cuda_graph
        max_bs = min(config.cuda_graph_max_bs, config.max_running_reqs)
        if (self.device.type == "cuda" and max_bs > 0 and graphs
                and self.attn_backend.supports_cuda_graph):
            from .graph import GraphRunner

            self.graph_runner = GraphRunner(self.model, self.ctx, self.token_pool,
                                            self.dummy_row, max_bs, config.pdl,
                                            self.window_page_table, config.cuda_graph_sizes,
                                            mrope=mc.rotary.mrope is not None,
                                            keep=self.keeps_rows)
            self.graph_runner.capture()
        # piecewise graphs share one set of q/k/v buffers: every attention layer alike
        same_shapes = len({(a.num_qo_heads, a.num_kv_heads, a.head_dim)
                           for a in self.cache_spec.attention}) == 1
        if (self.device.type == "cuda" and self.attn_backend.supports_padding and graphs
                and same_shapes):
            from .piecewise import piecewise_runner

            self.piecewise = piecewise_runner(self.model, self.ctx, config,
                                              self.window_pages is not None)
            if self.piecewise is not None:
                self.piecewise.capture()
        phases.mark("graphs")
        if self.kernels is not None:
            self.kernels.engine_built()
        logger.info(
            "engine ready: %s on %s (%s), %d KV pages of %d tokens, attention %s%s%s (%s)",
            mc.architecture, self.device, config.dtype, self.num_pages, config.page_size,
            config.attention_backend, ", CUDA graphs" if self.graph_runner else "",
            ", piecewise CUDA graphs" if self.piecewise else "", phases,
        )

    def make_pool(self, num_pages: int, window_pages: int | None = None
                  ) -> tuple[BaseKVCachePool, BaseAttnBackend]:
        """A KV pool of ``num_pages`` pages (and ``window_pages`` for the sliding layers) and its
        attention backend (``memory.py`` builds a throwaway one to measure a forward)."""
        return make_pool(self.config, self.model_config, self.cache_spec, self.model.kv_scales,
                         self.page_table, self.window_page_table, num_pages, window_pages)

    @property
    def kv_bytes_per_token(self) -> float:
        """With a sliding pool: a token of the full layers and its share of the sliding ones."""
        share = self.window_pages / self.num_pages if self.window_pages else None
        return self.cache_spec.kv_bytes_per_token(self.config.kv_dtype, share)

    def _build_model(self) -> BaseLLMModel:
        """The model, loaded. Records ``weight_bytes`` (``models.base.weight_bytes``) and, on CUDA,
        ``load_peak_bytes`` (the most the device held while loading: with weights quantized at
        load, about the quantized model plus one layer unquantized)."""
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        model = self._load_model()
        self.weight_bytes = weight_bytes(model)
        self.load_peak_bytes = (torch.cuda.max_memory_allocated(self.device)
                                if self.device.type == "cuda" else None)
        peak = "" if self.load_peak_bytes is None else \
            f", peak {self.load_peak_bytes / (1 << 30):.2f} GiB while loading"
        logger.info("weights: %.2f GiB on %s%s", self.weight_bytes / (1 << 30), self.device, peak)
        return model

    def _load_model(self) -> BaseLLMModel:
        return build_model(self.config, self.model_config, self.comm, self.device)

    def close(self) -> None:
        """Release the CUDA graphs, then leave the TP group (in this order:
        ``GraphRunner.close``)."""
        for runner in (self.graph_runner, self.piecewise, self.head_graphs):
            if runner is not None:
                runner.close()
        self.graph_runner = self.piecewise = self.head_graphs = None
        self.comm.close()

    @property
    def vocab_size(self) -> int:
        return self.model_config.vocab_size

    def replays_graph(self, batch: Batch) -> bool:
        """Whether ``batch`` is a decode batch that replays a CUDA graph (``graph.py``)."""
        return self.graph_runner is not None and self.graph_runner.can_run(batch)

    def check_images(self, input_ids: list[int], mm: MultimodalPrompt | None) -> None:
        """Raise ``ValueError`` (a 400 naming the field) for images this engine cannot take, or
        image tokens without their image."""
        if self.images is not None:
            self.images.check(input_ids, mm, self.attn_backend)
        elif mm is not None:
            raise ValueError("messages: this model takes no images (it has no vision tower)")

    def forget_images(self, req: Req) -> None:
        """``req`` holds its row no longer (finished, aborted, retracted)."""
        if self.images is not None:
            self.images.forget(req)

    @property
    def keeps_rows(self) -> bool:
        """Whether every forward hands back the rows a draft head reads (``ForwardOutput.hidden``:
        MTP's hidden states, EAGLE-3's aux states)."""
        return self.config.mtp or self.config.draft_model_path is not None

    def verifies_as_rows(self, num_rows: int) -> bool:
        """Whether a verify step of ``num_rows`` rows may run as one-token decode rows
        (``Feed.as_rows``): not for a recurrent model (its rows would share one state slot);
        under CUDA graphs only when a captured graph holds the rows."""
        if self.state_pool is not None:
            return False
        return self.graph_runner is None or num_rows <= self.graph_runner.max_bs

    def prepare(self, batch: Batch) -> None:
        """Build the batch's device inputs (``batch.py``), except for a decode batch that replays a
        CUDA graph: the graph gathers them itself from the rows and positions ``replay`` sends
        (and from the token pool, where a verify step's drafts are written first)."""
        if batch.is_decode:
            write_drafts(self.token_pool, batch)
        if self.replays_graph(batch):
            return
        prepare_batch(batch, self.page_table, self.token_pool, self.pad_tokens,
                      self.window_page_table)
        if self.images is not None:  # the image embeddings and positions (images.py)
            self.images.attach(batch)
        if self.state_pool is not None:
            attach_state_metadata(batch, self.device)

    @torch.inference_mode()
    def forward(self, batch: Batch, args: BatchSamplingArgs) -> ForwardOutput:
        """Run the model on ``batch`` (``prepare`` first) and sample from it."""
        prompt_lps, greedy, rows = None, None, None
        if self.replays_graph(batch):
            assert self.graph_runner is not None
            shifts = self.images.decode_shifts(batch) if self.images is not None else None
            logits, greedy, rows = self.graph_runner.replay(batch, args.argmax_only, shifts)
        else:
            with self.ctx.forward_batch(batch):
                self.attn_backend.prepare_metadata(batch)
                images = batch.images
                if self.piecewise is not None and images is None and self.piecewise.can_run(batch):
                    hidden = self.piecewise.forward(batch)
                else:
                    positions = batch.positions
                    if images is not None and images.positions is not None:
                        positions = images.positions  # M-RoPE: [3, T]
                    hidden = self.model(batch.input_ids, positions, self.ctx)
            hidden, aux = self.model.split_aux(hidden)  # aux: EAGLE-3's, else None
            logits = self.model.compute_logits(hidden[batch.logits_idx])
            if self.keeps_rows:
                rows = hidden if aux is None else aux
            # prompt log-probs, for the requests that ask (prompt_logprobs.py)
            if not batch.is_decode:
                prompt_lps = compute_prompt_logprobs(self.model, hidden, batch, self.vocab_size)
        keep = None
        if rows is not None:  # a copy: graphs' outputs are reused
            keep = rows.clone(), [(f.req, f.cached_len, f.extend_len) for f in batch.feeds]
        if args.late_bitmask is not None:  # the device computes the logits meanwhile
            args.token_bitmask = args.late_bitmask()
        if greedy is not None:  # sampled inside the graph, the tokens already in the pool
            out = SampleOutput(greedy, None, None, None)
        else:
            out = sample(logits, args, args.sampler or self.config.sampler)
            self.token_pool[batch.sample_loc] = out.next_tokens.to(torch.int32)
        non_blocking = self.device.type == "cuda"
        next_tokens, logprobs = out.next_tokens.to("cpu", non_blocking=non_blocking), None
        if out.logprobs is not None:
            logprobs = tuple(t.to("cpu", non_blocking=non_blocking) if t is not None else None
                             for t in (out.logprobs, out.top_ids, out.top_logprobs))
        if prompt_lps is not None:
            prompt_lps = prompt_lps.to_host(non_blocking)
        event = None
        if non_blocking:
            event = torch.cuda.Event()
            event.record()
        return ForwardOutput(next_tokens, out, logits, logprobs, event, prompt_lps, keep)
