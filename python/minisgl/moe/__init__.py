"""MoE backends, chosen by name; ``torch`` is the reference every device runs."""

from __future__ import annotations

from minisgl.utils import Registry

from .base import BaseMoeBackend

MOE_BACKENDS: Registry[BaseMoeBackend] = Registry("MoE backend")


@MOE_BACKENDS.register("torch")
def _create_torch() -> BaseMoeBackend:
    from .reference import TorchMoeBackend

    return TorchMoeBackend()


def create_moe_backend(name: str) -> BaseMoeBackend:
    return MOE_BACKENDS.get(name)()


__all__ = ["MOE_BACKENDS", "BaseMoeBackend", "create_moe_backend"]
