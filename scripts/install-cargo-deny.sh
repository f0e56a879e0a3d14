#!/usr/bin/env bash
# Installs cargo-deny (pinned) into .cache/cargo-deny, once: built from crates.io, the only
# registry these machines reach (about 3 minutes on 2 cores).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
version=0.20.2
bin=.cache/cargo-deny/bin/cargo-deny
if [[ -x "$bin" ]] && "$bin" --version | grep -q " $version\$"; then
    exit 0
fi
echo "installing cargo-deny $version into .cache/cargo-deny"
cargo install --quiet --locked cargo-deny --version "$version" --root .cache/cargo-deny
