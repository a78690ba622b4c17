"""Checkpoint tensor names onto a model's parameters: one declarative table per family.

A family's ``CheckpointNames`` says where its checkpoint differs from the module tree:

* ``prefixes``: checkpoint prefixes and what they become, the first that matches (the text model
  under a multimodal checkpoint's ``model.language_model.``); with ``strict``, a name under none
  of them is not loaded;
* ``skipped``: prefixes of tensors that are not loaded (a vision tower);
* ``renames``: a checkpoint name after its ``layers.N.`` -> (ours, shard id). A key names a whole
  tensor, or a module all of whose tensors (``weight``, ``bias``, ``weight_scale_inv``) follow it;
  in a key, ``experts.*.`` stands for one expert's index, which its shard id then carries
  (``(e, id)``, or ``e`` where the id is None).

Every other name is kept, with shard id None.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Mapping

_LAYER = re.compile(r"(.*?layers\.\d+\.)(.+)$")
_EXPERT = re.compile(r"experts\.(\d+)\.")

# q/k/v into the merged QKV projection, gate/up into the merged gate-up one (Llama's layout)
MERGED: dict[str, tuple[str, object]] = {
    "self_attn.q_proj": ("self_attn.qkv_proj", "q"),
    "self_attn.k_proj": ("self_attn.qkv_proj", "k"),
    "self_attn.v_proj": ("self_attn.qkv_proj", "v"),
    "mlp.gate_proj": ("mlp.gate_up_proj", 0),
    "mlp.up_proj": ("mlp.gate_up_proj", 1),
}


def expert_names(ckpt: str, ours: str) -> dict[str, tuple[str, object]]:
    """Per-expert ``{ckpt}.E.{gate,up,down}_proj`` (weights and block scales) into the stacked
    ``{ours}.w13`` (gate rows, then up rows) and ``{ours}.w2`` of a ``layers.moe.MoELayer``."""
    table: dict[str, tuple[str, object]] = {}
    for leaf, suffix in (("weight", ""), ("weight_scale_inv", "_scale_inv")):
        table[f"{ckpt}.*.gate_proj.{leaf}"] = (f"{ours}.w13{suffix}", 0)
        table[f"{ckpt}.*.up_proj.{leaf}"] = (f"{ours}.w13{suffix}", 1)
        table[f"{ckpt}.*.down_proj.{leaf}"] = (f"{ours}.w2{suffix}", None)
    return table


@dataclass(frozen=True)
class CheckpointNames:
    renames: Mapping[str, tuple[str, object]] = field(default_factory=lambda: dict(MERGED))
    prefixes: tuple[tuple[str, str], ...] = (("model.", ""),)
    skipped: tuple[str, ...] = ()
    strict: bool = False

    def map(self, name: str) -> tuple[str, object] | None:
        """(our parameter's name, shard id), or None for a tensor that is not loaded."""
        if name.startswith(self.skipped):
            return None
        for old, new in self.prefixes:
            if name.startswith(old):
                name = new + name[len(old):]
                break
        else:
            if self.strict:
                return None
        match = _LAYER.match(name)
        head, rest = match.groups() if match else ("", name)
        expert = _EXPERT.search(rest)
        if expert is not None:
            rest = rest[:expert.start()] + "experts.*." + rest[expert.end():]
        module, _, leaf = rest.rpartition(".")
        if rest in self.renames:
            ours, shard = self.renames[rest]
        elif module in self.renames:
            ours, shard = self.renames[module]
            ours = f"{ours}.{leaf}"
        else:
            return name, None
        if expert is not None:
            e = int(expert.group(1))
            shard = e if shard is None else (e, shard)
        return head + ours, shard
