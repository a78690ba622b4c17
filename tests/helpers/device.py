"""Where the engine tests run: ``MINISGL_TEST_DEVICE=cuda`` runs them on the GPU (float32, against
CPU transformers). A module of its own, not the root conftest: spawned TP ranks import test
modules by name, and with the whole tree collected ``conftest`` may resolve to another folder's."""

import os

TEST_DEVICE = os.environ.get("MINISGL_TEST_DEVICE", "cpu")
