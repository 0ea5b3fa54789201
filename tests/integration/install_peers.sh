#!/usr/bin/env bash
# Installs the real vLLM and SGLang wheels that tests/integration runs against, and exactly the small packages
# their imported modules need on a CPU machine, into the active Python environment (tests/integration/peers.txt
# lists them, pinned).
#
# - Every package is installed with --no-deps: vLLM and SGLang depend on a CUDA torch, flashinfer, CUTLASS DSL,
#   ... which must never replace the CPU torch this project builds against, and which the spec-decode modules we
#   call do not import.
# - Idempotent and quick when everything is present: versions are checked with importlib.metadata first, and
#   pip only runs for what is missing or at another version (pip's wheel cache serves repeated installs).
# - After installing, imports the modules the tests call, so a package missing from peers.txt fails here with
#   its import error (skipped when nothing was installed: the import alone takes ~30 s on 2 cores).
#
# Usage: bash tests/integration/install_peers.sh   (PYTHON=/path/to/python to choose the interpreter)
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python}

mapfile -t pins < <(grep -v '^\s*\(#\|$\)' peers.txt)

mapfile -t todo < <("$PY" - "${pins[@]}" <<'EOF'
import sys
from importlib import metadata

for pin in sys.argv[1:]:
    name, version = pin.split("==")
    try:
        have = metadata.version(name)
    except metadata.PackageNotFoundError:
        have = None
    if have != version:
        print(pin)
EOF
)

if ((${#todo[@]})); then
  echo "install_peers: installing ${#todo[@]} of ${#pins[@]} pinned packages (--no-deps): ${todo[*]}"
  "$PY" -m pip install --no-deps --disable-pip-version-check -q "${todo[@]}"
else
  echo "install_peers: all ${#pins[@]} pinned packages present"
  exit 0
fi

# The modules tests/integration imports (vLLM's spec-decode structures and adaptive verification, SGLang's
# DSpark schedule and ragged verify layout, its EAGLE chain-tree builder).
"$PY" - <<'EOF'
import importlib
import logging
import os

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # vLLM warns that its CUDA extension is absent
logging.disable(logging.WARNING)
for name in (
    "vllm.v1.spec_decode.metadata",
    "vllm.v1.attention.backend",
    "vllm.v1.sample.rejection_sampler",
    "vllm.v1.worker.gpu.spec_decode.adaptive_verification",
    "sglang.kernels.ops.speculative.dspark.dspark_schedule",
    "sglang.kernels.ops.speculative.eagle",
    "sglang.srt.speculative.ragged_verify",
):
    importlib.import_module(name)
print("install_peers: vLLM and SGLang modules import")
EOF
