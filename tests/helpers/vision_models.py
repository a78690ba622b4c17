"""Tiny random vision-language checkpoints built the way the released ones are: the tower and
projector under the checkpoint's own names, a ``preprocessor_config.json`` for transformers'
image processor, and a byte-level tokenizer whose chat template emits the family's image
placeholder (``<|vision_start|><|image_pad|><|vision_end|>`` for Qwen3.5/3.6,
``<start_of_image>`` for Gemma 3, ``<|image|>`` for Gemma 4). Every parameter is perturbed
(``hf_models``' scheme). ``arch``: ``qwen3_5``, ``qwen3_5_moe``, ``gemma3`` or ``gemma4``.

Gemma 3's tower is saved as the released checkpoints hold it (``vision_tower.vision_model.``;
transformers 5 itself writes ``vision_tower.``), with ``vision_use_head`` off as released."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import torch

from helpers.gemma_models import GEMMA4_TEXT
from helpers.gemma_models import TEXT as GEMMA3_TEXT
from helpers.hf_models import _perturb_parameters, _perturb_seed
from helpers.hybrid_models import _MOE, reference_on_torch_kernels
from helpers.hybrid_models import _TEXT as QWEN_TEXT

VOCAB = 272  # 256 byte tokens, then the specials
QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>",
                 "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
GEMMA_SPECIALS = ["<bos>", "<eos>", "<pad>", "<start_of_turn>", "<end_of_turn>",
                  "<start_of_image>", "<end_of_image>", "<image_soft_token>", "<|image|>",
                  "<|image>", "<image|>", "<|audio|>", "<|audio>", "<audio|>"]

QWEN_TEMPLATE = (
    "{%- for m in messages %}{{ '<|im_start|>' + m.role + '\\n' }}"
    "{%- if m.content is string %}{{ m.content }}{%- else %}{%- for item in m.content %}"
    "{%- if item.type == 'image' or 'image' in item or 'image_url' in item %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{%- elif item.type == 'text' %}{{ item.text }}{%- endif %}{%- endfor %}{%- endif %}"
    "{{ '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)


def gemma_template(placeholder: str) -> str:
    return (
        "{{ bos_token }}{%- for m in messages %}<start_of_turn>"
        "{{ ('model' if m.role == 'assistant' else m.role) + '\\n' }}"
        "{%- if m.content is string %}{{ m.content | trim }}{%- else %}"
        "{%- for item in m.content %}{%- if item.type == 'image' %}" + placeholder +
        "{%- elif item.type == 'text' %}{{ item.text | trim }}{%- endif %}{%- endfor %}"
        "{%- endif %}{{ '<end_of_turn>\\n' }}{%- endfor %}"
        "{%- if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{%- endif %}"
    )


QWEN_VISION = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2,
                   out_hidden_size=QWEN_TEXT["hidden_size"], patch_size=4, spatial_merge_size=2,
                   temporal_patch_size=2, num_position_embeddings=36)  # a 6 x 6 table
# a 32 x 32 image: 8 x 8 patches of 4, pooled 2 x 2 into 16 tokens
GEMMA3_VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                     num_attention_heads=2, image_size=32, patch_size=4, vision_use_head=False)
GEMMA4_VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                     num_attention_heads=2, num_key_value_heads=2, head_dim=16, patch_size=4,
                     pooling_kernel_size=2, position_embedding_size=64, standardize=True,
                     use_clipped_linears=True,
                     rope_parameters={"rope_type": "default", "rope_theta": 100.0})


def byte_tokenizer(specials: list[str], template: str, **special_names):
    """Every byte one token, then ``specials`` in order (ids 256, 257, ...)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {ch: i for i, ch in enumerate(pre_tokenizers.ByteLevel.alphabet())}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens(specials)
    tok = PreTrainedTokenizerFast(tokenizer_object=core, **special_names)
    assert tok.convert_tokens_to_ids(specials) == list(range(256, 256 + len(specials)))
    tok.chat_template = template
    return tok


def qwen_ids() -> dict[str, int]:
    ids = {name: 256 + i for i, name in enumerate(QWEN_SPECIALS)}
    return dict(image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
                vision_start_token_id=ids["<|vision_start|>"],
                vision_end_token_id=ids["<|vision_end|>"])


def gemma_id(token: str) -> int:
    return 256 + GEMMA_SPECIALS.index(token)


def _qwen(arch: str):
    import transformers as tf

    rope = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
            "mrope_section": [2, 1, 1], "mrope_interleaved": True}
    eos = 256 + QWEN_SPECIALS.index("<|im_end|>")
    text = {**QWEN_TEXT, "vocab_size": VOCAB, "rope_parameters": rope, "bos_token_id": None,
            "eos_token_id": eos}
    if arch == "qwen3_5":
        cfg = tf.Qwen3_5Config(text_config=text, vision_config=QWEN_VISION, **qwen_ids())
        model = tf.Qwen3_5ForConditionalGeneration(cfg)
    else:
        cfg = tf.Qwen3_5MoeConfig(text_config={**text, **_MOE}, vision_config=QWEN_VISION,
                                  **qwen_ids())
        model = tf.Qwen3_5MoeForConditionalGeneration(cfg)
    tok = byte_tokenizer(QWEN_SPECIALS, QWEN_TEMPLATE, eos_token="<|im_end|>",
                         pad_token="<|endoftext|>")
    pre = {"image_processor_type": "Qwen2VLImageProcessor", "processor_class": "Qwen3VLProcessor",
           "patch_size": 4, "temporal_patch_size": 2, "merge_size": 2,
           "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
           "size": {"shortest_edge": 16 * 16, "longest_edge": 64 * 64}}
    return model, tok, pre


def _gemma(arch: str):
    import transformers as tf

    specials = dict(bos_token="<bos>", eos_token="<eos>", pad_token="<pad>")
    if arch == "gemma3":
        ids = {"boi": gemma_id("<start_of_image>"), "eoi": gemma_id("<end_of_image>")}
        text = tf.Gemma3TextConfig(**{**GEMMA3_TEXT, "vocab_size": VOCAB, "bos_token_id": 256,
                                      "eos_token_id": 257, "pad_token_id": 258})
        cfg = tf.Gemma3Config(text_config=text, vision_config=GEMMA3_VISION, mm_tokens_per_image=16,
                              image_token_index=gemma_id("<image_soft_token>"),
                              boi_token_index=ids["boi"], eoi_token_index=ids["eoi"])
        model = tf.Gemma3ForConditionalGeneration(cfg)
        tok = byte_tokenizer(GEMMA_SPECIALS, gemma_template("<start_of_image>"), **specials,
                             extra_special_tokens={"boi_token": "<start_of_image>",
                                                   "eoi_token": "<end_of_image>",
                                                   "image_token": "<image_soft_token>"})
        pre = {"image_processor_type": "Gemma3ImageProcessor", "processor_class": "Gemma3Processor",
               "size": {"height": 32, "width": 32}, "resample": 2, "do_pan_and_scan": False,
               "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}
        return model, tok, pre
    # as the released ones: an image's tokens see each other both ways in the sliding layers
    text = {**GEMMA4_TEXT, "vocab_size": VOCAB, "bos_token_id": 256, "eos_token_id": 257,
            "pad_token_id": 258, "use_bidirectional_attention": "vision"}
    cfg = tf.Gemma4Config(text_config=text, vision_config=GEMMA4_VISION, audio_config=None,
                          image_token_id=gemma_id("<|image|>"), boi_token_id=gemma_id("<|image>"),
                          eoi_token_id=gemma_id("<image|>"), vision_soft_tokens_per_image=16)
    model = tf.Gemma4ForConditionalGeneration(cfg)
    tok = byte_tokenizer(GEMMA_SPECIALS, gemma_template("<|image|>"), **specials,
                         extra_special_tokens={"boi_token": "<|image>", "eoi_token": "<image|>",
                                               "image_token": "<|image|>",
                                               "audio_token": "<|audio|>", "boa_token": "<|audio>",
                                               "eoa_token": "<audio|>"})
    pre = {"image_processor_type": "Gemma4ImageProcessor", "processor_class": "Gemma4Processor",
           "patch_size": 4, "max_soft_tokens": 70, "pooling_kernel_size": 2}
    return model, tok, pre


def _legacy_gemma3_names(out: Path) -> None:
    """Rewrite transformers 5's ``vision_tower.X`` as the releases'
    ``vision_tower.vision_model.X``."""
    from safetensors.torch import load_file, save_file

    for f in out.glob("*.safetensors"):
        tensors = load_file(str(f))
        renamed = {("vision_tower.vision_model." + k[len("vision_tower."):]
                    if k.startswith("vision_tower.") else k): v for k, v in tensors.items()}
        save_file(renamed, str(f), metadata={"format": "pt"})


def make_vision_checkpoint(arch: str, out_dir: str | Path, seed: int = 0) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if arch.startswith("qwen"):
        reference_on_torch_kernels()
    torch.manual_seed(seed)
    model, tok, pre = (_qwen if arch.startswith("qwen") else _gemma)(arch)
    model = model.to(torch.float32).eval()
    _perturb_parameters(model, _perturb_seed(f"vision-{arch}", seed))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):  # as hybrid_models: some heads forget fast
                p.copy_(torch.linspace(-1.0, 1.0, p.numel()))
        for name, buf in model.named_buffers():
            if name.endswith("layer_scalar"):
                buf.fill_(0.5 + (zlib.crc32(name.encode()) % 100) / 100)
            elif name.endswith(("std_bias", "std_scale")):  # Gemma 4's standardization
                gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))
                base = 1.0 if name.endswith("std_scale") else 0.0
                buf.copy_(base + 0.3 * torch.randn(buf.shape, generator=gen))
            elif name.endswith(("input_min", "input_max", "output_min", "output_max")):
                sign = -1.0 if name.endswith("min") else 1.0  # clips that bite now and then
                buf.fill_(sign * (1.0 + (zlib.crc32(name.encode()) % 100) / 100))
    if hasattr(model, "tie_weights"):
        model.tie_weights()
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    (out / "preprocessor_config.json").write_text(json.dumps(pre, indent=2) + "\n")
    if arch == "gemma3":
        _legacy_gemma3_names(out)
    gen = {"eos_token_id": tok.eos_token_id, "do_sample": False}
    (out / "generation_config.json").write_text(json.dumps(gen) + "\n")
    return out
