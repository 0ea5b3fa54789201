"""Training text for the engine's models: the Python standard library's own ``.py`` sources, which
every machine with Python has. Files are split into held-in / held-out by a hash of their path relative
to the stdlib root (about 1 in 10 held out), so the split is the same on every machine with the same
Python version and does not depend on file order or size."""
from __future__ import annotations

import os
import sys
import sysconfig
import zlib
from typing import Dict, Tuple

import torch

HELD_OUT_MOD = 10  # crc32(path) % 10 == 0 -> held out
SKIP_DIRS = ("site-packages", "dist-packages", "__pycache__")
SEPARATOR = b"\n\n"


def stdlib_root() -> str:
    return sysconfig.get_paths()["stdlib"]


def load_stdlib(max_bytes_per_file: int = 200_000) -> Tuple[torch.Tensor, torch.Tensor, Dict]:
    """(held_in [N] uint8, held_out [M] uint8, description). Files are read in sorted path order and
    joined with a blank line; files over ``max_bytes_per_file`` are truncated (a few generated tables
    would otherwise dominate)."""
    root = stdlib_root()
    parts = {True: [], False: []}
    counts = {True: 0, False: 0}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        for name in sorted(filenames):
            if not name.endswith(".py"):
                continue
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root).replace(os.sep, "/")
            try:
                with open(path, "rb") as f:
                    text = f.read(max_bytes_per_file)
            except OSError:
                continue
            held_out = zlib.crc32(rel.encode()) % HELD_OUT_MOD == 0
            parts[held_out].append(text + SEPARATOR)
            counts[held_out] += 1

    def to_tensor(chunks):
        return torch.frombuffer(bytearray(b"".join(chunks)), dtype=torch.uint8)

    held_in, held_out = to_tensor(parts[False]), to_tensor(parts[True])
    description = {
        "source": f"Python {sys.version.split()[0]} standard library .py files under {root} "
                  f"(excluding {', '.join(SKIP_DIRS)}), each truncated to {max_bytes_per_file} bytes",
        "split": f"held out iff zlib.crc32(relative path) % {HELD_OUT_MOD} == 0",
        "held_in_files": counts[False], "held_out_files": counts[True],
        "held_in_bytes": int(held_in.numel()), "held_out_bytes": int(held_out.numel()),
    }
    return held_in, held_out, description


def sample_windows(data: torch.Tensor, batch: int, length: int, generator: torch.Generator) -> torch.Tensor:
    """[batch, length] int64 windows of ``data`` at random offsets."""
    starts = torch.randint(0, data.numel() - length, (batch,), generator=generator)
    return torch.stack([data[s:s + length] for s in starts.tolist()]).long()
