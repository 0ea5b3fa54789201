"""A small but real engine for adaptive verification: a byte-level target model and a DSpark-style
drafter, trained in-repo on the Python standard library's sources (``python -m
adaptive_verify.engine.train``), with weights shipped in ``weights/`` (see ``weights/report.json`` for
their held-out quality).

    from adaptive_verify.engine import load_pretrained, PagedKV
    target, drafter = load_pretrained()
    drafts, conf_hidden, markov = drafter.draft(h, anchor)          # h [R, 256], anchor [R]
    survival = drafter.confidence(conf_hidden, markov, survival=True)  # [R, K] -> av.plan_verification

Draft trees (EAGLE-2 style, k alternatives per node, the best N nodes): ``engine.tree.draft_tree`` and
``generate(..., mode="tree" | "tree-fixed", tree_topk=k, tree_nodes=N)``; see docs/engine.md.
"""
from __future__ import annotations

import os
from typing import Optional, Tuple

import torch

from .drafter import DrafterConfig, DSparkDrafter
from .model import PagedKV, TargetConfig, TinyTarget

WEIGHTS_DIR = os.path.join(os.path.dirname(__file__), "weights")

__all__ = ["DSparkDrafter", "DrafterConfig", "PagedKV", "TargetConfig", "TinyTarget", "WEIGHTS_DIR",
           "load_pretrained"]


def _load(path: str):
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"adaptive_verify.engine: no weights at {path}; train them with "
            f"`python -m adaptive_verify.engine.train --out {os.path.dirname(path)}` (about 20 minutes on 1 core) "
            f"or reinstall a package that ships adaptive_verify/engine/weights/*.pt")
    return torch.load(path, map_location="cpu", weights_only=True)


def load_pretrained(device="cpu", weights_dir: Optional[str] = None) -> Tuple[TinyTarget, DSparkDrafter]:
    """(target, drafter) in eval mode, float32, on ``device``, from ``weights_dir`` (default: the shipped
    weights). Raises FileNotFoundError naming the missing file."""
    weights_dir = WEIGHTS_DIR if weights_dir is None else weights_dir
    t = _load(os.path.join(weights_dir, "target.pt"))
    d = _load(os.path.join(weights_dir, "drafter.pt"))
    target = TinyTarget(TargetConfig(**t["config"]))
    target.load_state_dict({k: v.float() for k, v in t["state_dict"].items()})
    drafter = DSparkDrafter(DrafterConfig(**d["config"]))
    drafter.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in d["state_dict"].items()})
    return (target.to(device).eval().requires_grad_(False), drafter.to(device).eval().requires_grad_(False))
