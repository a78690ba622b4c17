"""On a GPU machine: start the server with --device cuda and ask it one chat question.

The model is a tiny random Llama with the default model's tokenizer (its files passed with --tok),
so the check needs no large download: it shows the whole server stack running on CUDA.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

from helpers.hf_models import make_tiny_checkpoint  # noqa: E402
from helpers.server_utils import start_server  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tok", required=True, help="directory with tokenizer*.json files")
    args = parser.parse_args()
    root = tempfile.mkdtemp()
    path = make_tiny_checkpoint("llama", os.path.join(root, "tiny"), vocab_size=49152)
    for name in os.listdir(args.tok):
        shutil.copy(os.path.join(args.tok, name), path)
    srv = start_server(str(path), "--device", "cuda", "--dtype", "bfloat16", log_dir=root)
    try:
        from openai import OpenAI

        client = OpenAI(base_url=f"{srv.url}/v1", api_key="none")
        out = client.chat.completions.create(model=str(path), max_tokens=16, temperature=0,
                                             messages=[{"role": "user", "content": "Hello?"}])
        print("chat answer:", repr(out.choices[0].message.content), out.usage)
    finally:
        print("exit code:", srv.stop(signal.SIGTERM))
        print(srv.log()[-2000:])


if __name__ == "__main__":
    main()
