#!/usr/bin/env bash
# Installs the real vLLM and SGLang wheels that tests/integration runs against (and FlashAttention-4 with the CuTe
# DSL, pinned as the [sm100] extra pins them), and exactly the small packages
# their imported modules need on a CPU machine, into the active Python environment (tests/integration/peers.txt
# lists them, pinned).
#
# - Every package is installed with --no-deps: vLLM and SGLang depend on a CUDA torch, flashinfer, CUTLASS DSL,
#   ... which must never replace the CPU torch this project builds against, and which the spec-decode modules we
#   call do not import.
# - Quick when everything is present: versions are checked with importlib.metadata first, and pip only runs
#   for what is missing or at another version (pip's wheel cache serves repeated installs).
# - Then, every time (not only when something was installed), check_imports.py imports every peer module the
#   tests use, so a package missing from peers.txt fails here with the import error named, on any machine.
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
fi

"$PY" check_imports.py
