"""Where the engine tests run: ``MINISGL_TEST_DEVICE=cuda`` runs them on the GPU (float32, against
CPU transformers). A module of its own, not the root conftest: spawned TP ranks import test
modules by name, and with the whole tree collected ``conftest`` may resolve to another folder's."""

import os

TEST_DEVICE = os.environ.get("MINISGL_TEST_DEVICE", "cpu")

# an engine test's LLM on the GPU, unless the test says otherwise: no warm-up (it compiles every
# kernel variant the engine can reach and runs synthetic waves, for every engine a test builds;
# tests/warmup covers it) and CUDA graphs up to 16 requests (the parity tests' batches are
# smaller: 256 would capture twenty sizes an engine)
GPU_TEST_OPTIONS = dict(warmup="off", cuda_graph_max_bs=16) if TEST_DEVICE == "cuda" else {}
