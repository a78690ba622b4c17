"""Chats with an image, offline: the time to first token of one chat and the vision tower's share
of it, then many such chats at once, next to transformers in the same run.

    python benchmark/offline/bench_images.py --model benchmark/configs/qwen3.5-9b.json

The model is random weights for a Qwen3.5/3.6 config (``--dummy-weights``) in a directory that
``benchmark/online/dummy_model.py`` writes: a byte-level tokenizer with Qwen's vision tokens, a
chat template placing them and the released ``preprocessor_config.json``. Every chat is one user
turn of a synthetic PNG (noise, ``--image-size`` square; 1024 x 1024 is 1,024 image tokens) and a
question, each with an image of its own: the tower runs for every chat and the prefix cache
cannot hit an image. Preprocessing (transformers' PIL image processor, as the tokenizer worker
runs it) is timed apart, and both engines take the same preprocessed prompts, so the times below
start from the prompt's ids and pixels. transformers (``...ForConditionalGeneration``, SDPA, its
own random weights of the same config and dtype) runs after minisgl, on the same device.

``--device cpu --shrink`` runs a tiny model of the same layout (a smoke run, float32).
"""

from __future__ import annotations

import argparse
import base64
import datetime
import gc
import io
import itertools
import json
import os
import sys
import tempfile
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "online"), os.path.join(HERE, "..", "..", "python")]

from bench_common import gpu_name, project_commit  # noqa: E402
from dummy_model import write_dummy_model  # noqa: E402
from image_timing import TowerClock, serve, summary  # noqa: E402

from minisgl import LLM  # noqa: E402


def shrink(raw: dict) -> dict:
    """``raw``'s layout (layer kinds, M-RoPE, vision tokens, patches) at toy sizes."""
    text = {**raw["text_config"], "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 4, "layer_types": raw["text_config"]["layer_types"][:4],
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
            "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16,
            "linear_value_head_dim": 16, "mtp_num_hidden_layers": 0}
    text["rope_parameters"] = {**text["rope_parameters"], "partial_rotary_factor": 0.5,
                               "mrope_section": [2, 1, 1]}
    vision = {**raw["vision_config"], "depth": 2, "hidden_size": 32, "intermediate_size": 64,
              "num_heads": 2, "out_hidden_size": 64}
    return {**raw, "text_config": text, "vision_config": vision}


def image_chat(size: int, seed: int) -> list[dict]:
    """One user turn: a ``size`` x ``size`` PNG of noise (a seed, an image) and a question."""
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG", compress_level=1)
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": "What is in this image?"}]}]


def prepare(llm: LLM, chats: list[list[dict]]) -> tuple[list, float]:
    """The chats' prompts (``MultimodalPrompt``) and the milliseconds each took to preprocess."""
    start = time.perf_counter()
    prompts = [llm.apply_chat_template(c) for c in chats]
    return prompts, 1000 * (time.perf_counter() - start) / len(chats)


def release() -> None:
    gc.collect()
    torch.cuda.empty_cache()  # a no-op without CUDA


def run_minisgl(path: str, args, dtype: str) -> tuple[dict, list, list]:
    """minisgl's figures, and the prompts it ran (transformers takes the same)."""
    llm = LLM(path, dummy_weights=True, device=args.device, dtype=dtype, warmup="off")
    encoder = llm.scheduler.engine.images
    clock = TowerClock(encoder.tower, args.device == "cuda")
    seeds = itertools.count()
    chats = lambda n: [image_chat(args.image_size, next(seeds)) for _ in range(n)]  # noqa: E731
    warm, _ = prepare(llm, chats(args.chats))
    serve(llm, warm[:1], 1)  # one chat, then as many as timed: compiles what the timed runs use
    serve(llm, warm[1:], 8)
    del warm
    clock.take_ms()
    singles, runs = [], []
    for _ in range(args.runs):
        [prompt], prep_ms = prepare(llm, chats(1))
        res = serve(llm, [prompt], 1)
        runs.append((1000 * res["ttft_s"][0], clock.take_ms(), prep_ms))
        singles.append(prompt)
    batch_prompts, prep_ms = prepare(llm, chats(args.chats))
    encoded = encoder.num_encoded
    batch = serve(llm, batch_prompts, args.max_tokens)
    result = summary(runs, batch, clock.take_ms())
    result.update(images_encoded=encoder.num_encoded - encoded, batch_preprocess_ms=prep_ms)
    llm.close()
    del llm, encoder, clock
    release()
    return result, singles, batch_prompts


def hf_inputs(prompts: list, device: str) -> dict:
    """What transformers' processor gives for these prompts (of one length: one text, one image
    size, so no padding)."""
    ids = torch.tensor([p.input_ids for p in prompts], device=device)
    images = [image for p in prompts for image in p.images]
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids),
            "pixel_values": torch.cat([i.pixels() for i in images]).to(device),
            "image_grid_thw": torch.tensor([i.grid for i in images], device=device),
            "mm_token_type_ids": (ids == prompts[0].image_token_id).int()}


def run_hf(path: str, args, dtype: torch.dtype, singles: list, batch_prompts: list) -> dict:
    """transformers' generate, greedy without EOS, on the prompts minisgl ran: one chat with
    ``max_new_tokens=1`` for the time to first token, then the chats ``--hf-batch`` at a time."""
    import transformers as tf

    config = tf.AutoConfig.from_pretrained(path)
    with torch.device(args.device):
        model = getattr(tf, config.architectures[0])._from_config(config, dtype=dtype).eval()
    clock = TowerClock(model.model.visual, args.device == "cuda")

    def generate(prompts: list, steps: int) -> tuple[float, float]:
        """The prompts' generate; the seconds from its start to its first step's logits."""
        marks = [time.perf_counter()]

        def first_step(input_ids, scores):
            if len(marks) == 1:
                if args.device == "cuda":
                    torch.cuda.synchronize()
                marks.append(time.perf_counter())
            return scores

        gen = tf.GenerationConfig(do_sample=False, max_new_tokens=steps, min_new_tokens=steps,
                                  pad_token_id=0, eos_token_id=None)
        with torch.no_grad():
            model.generate(**hf_inputs(prompts, args.device), generation_config=gen,
                           logits_processor=tf.LogitsProcessorList([first_step]))
        if args.device == "cuda":
            torch.cuda.synchronize()
        return marks[1] - marks[0], time.perf_counter() - marks[0]

    generate(singles[:1], 1)  # warm-up: one chat, then the batch
    generate(batch_prompts[:args.hf_batch or len(batch_prompts)], 8)
    clock.take_ms()
    runs = []
    for prompt in singles:
        _, seconds = generate([prompt], 1)
        runs.append((1000 * seconds, clock.take_ms(), 0.0))
    ttft, start, tokens = [], time.perf_counter(), 0
    size = args.hf_batch or len(batch_prompts)
    for b in range(0, len(batch_prompts), size):
        part = batch_prompts[b:b + size]
        offset = time.perf_counter() - start
        first, _ = generate(part, args.max_tokens)
        ttft += [offset + first] * len(part)
        tokens += len(part) * args.max_tokens
    batch = {"seconds": time.perf_counter() - start, "output_tokens": tokens, "ttft_s": ttft}
    result = summary(runs, batch, clock.take_ms())
    result.pop("preprocess_ms")
    result["hf_batch"] = size
    return result  # the model goes with this frame (the caller then empties the cache)


def write(records: list[dict], out_dir: str, stem: str, command: str) -> str:
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, stem + ".json")
    with open(path, "w") as f:
        json.dump(records, f, indent=1)
    r0 = records[0]
    lines = [f"`{command}` on {r0['gpu']}, commit `{r0['commit']}`, {r0['date']}.", "",
             f"One chat: a {r0['image_size']}x{r0['image_size']} PNG ({r0['image_tokens']} image "
             f"tokens, {r0['prompt_tokens']} prompt tokens); its time to first token is the "
             f"median of {len(r0['ttft_ms_runs'])} chats after a warm-up, each with an image of "
             "its own (the tower runs every time, the prefix cache cannot hit an image), from the "
             f"preprocessed prompt (preprocessing, the same for both: {r0['preprocess_ms']:.0f} ms "
             f"an image). {r0['chats']} chats at once, {r0['max_tokens']} output tokens each, "
             "distinct images.", "",
             f"| engine | TTFT, 1 chat (ms) | tower (ms) | tower's share | {r0['chats']} chats (s) "
             "| output tok/s | TTFT p50 / p90 / max (s) | tower in the batch (s) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in records:
        if "error" in r:
            lines.append(f"| {r['engine']} | {r['error']} | | | | | | |")
            continue
        t = r["batch_ttft_s"]
        lines.append(f"| {r['engine']} | {r['ttft_ms']:,.1f} | {r['encoder_ms']:,.1f} | "
                     f"{r['encoder_share']:.0%} | {r['batch_seconds']:.2f} | "
                     f"{r['output_tok_per_s']:,.0f} | {t['p50']:.2f} / {t['p90']:.2f} / "
                     f"{t['max']:.2f} | {r['batch_encoder_s']:.2f} |")
    if len(records) == 2 and "error" not in records[1]:
        ours, hf = records
        lines.append(f"| speed-up over transformers (same run) | "
                     f"{hf['ttft_ms'] / ours['ttft_ms']:.2f}x | "
                     f"{hf['encoder_ms'] / ours['encoder_ms']:.2f}x | | "
                     f"{hf['batch_seconds'] / ours['batch_seconds']:.2f}x | "
                     f"{ours['output_tok_per_s'] / hf['output_tok_per_s']:.2f}x | | |")
    with open(os.path.join(out_dir, stem + ".md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return path


def main(argv: list[str] | None = None) -> str:
    """Run the benchmark; the path of its JSON results."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=os.path.join(HERE, "..", "configs", "qwen3.5-9b.json"),
                        help="a Qwen3.5/3.6 config.json with a vision_config (random weights)")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--shrink", action="store_true", help="toy sizes (a CPU smoke run)")
    parser.add_argument("--image-size", type=int, default=1024)
    parser.add_argument("--chats", type=int, default=64, help="chats at once, offline")
    parser.add_argument("--max-tokens", type=int, default=64, help="output tokens of each chat")
    parser.add_argument("--runs", type=int, default=3, help="single chats timed (the median)")
    parser.add_argument("--hf", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--hf-batch", type=int, default=0,
                        help="transformers' chats per generate (0: all at once)")
    parser.add_argument("--out", default="bench-out", help="results (./bench-out)")
    args = parser.parse_args(argv)

    with open(args.model) as f:
        raw = json.load(f)
    name = os.path.basename(args.model).removesuffix(".json") + ("-tiny" if args.shrink else "")
    tmp = tempfile.mkdtemp(prefix="minisgl-bench-images-")
    with open(os.path.join(tmp, "config.json"), "w") as f:
        json.dump(shrink(raw) if args.shrink else raw, f)
    path = write_dummy_model(os.path.join(tmp, "config.json"), os.path.join(tmp, "model"))
    gpu = gpu_name() if args.device == "cuda" else "cpu"
    dtype = "bfloat16" if args.device == "cuda" else "float32"
    ours, singles, batch_prompts = run_minisgl(path, args, dtype)
    p = singles[0]
    base = {"model": name, "gpu": gpu, "date": datetime.date.today().isoformat(),
            "commit": project_commit(), "device": args.device, "dtype": dtype,
            "image_size": args.image_size, "image_tokens": p.images[0].num_tokens,
            "prompt_tokens": len(p.input_ids), "chats": args.chats, "max_tokens": args.max_tokens}
    records = [{**base, "engine": "minisgl", **ours}]
    if args.hf:
        try:
            hf = run_hf(path, args, getattr(torch, dtype), singles, batch_prompts)
        except torch.cuda.OutOfMemoryError as e:  # noted in the table, minisgl's figures kept
            hf = {"error": f"out of memory ({str(e).splitlines()[0][:80]}); try --hf-batch"}
        release()
        records.append({**base, "engine": "transformers", **hf})
    for r in records:
        print(json.dumps(r), flush=True)
    command = " ".join(["python", os.path.relpath(__file__), *(argv or sys.argv[1:])])
    return write(records, args.out, f"offline_images_{name}_{gpu}", command)


if __name__ == "__main__":
    main()
