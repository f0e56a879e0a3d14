#!/usr/bin/env bash
# Prints cargo's target folder for this workspace (honours CARGO_TARGET_DIR and cargo config),
# for scripts that run the binaries they built.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cargo metadata --format-version 1 --no-deps |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])'
