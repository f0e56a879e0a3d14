#!/usr/bin/env bash
# Builds the testcloud Terraform provider (debug profile) and installs it into a
# filesystem provider mirror usable with `terraform init -plugin-dir=DIR`.
#
# Usage: scripts/install-testcloud-provider.sh [DIR]   (default: <repo>/.cache/plugins)
# Prints the mirror directory. Idempotent.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mirror="${1:-$repo_root/.cache/plugins}"
mkdir -p "$mirror"
mirror="$(cd "$mirror" && pwd)" # absolute, before changing directory

version="0.1.0"
platform="linux_amd64"
binary="terraform-provider-testcloud"

cd "$repo_root"
# Ask cargo where the binary is: honours CARGO_TARGET_DIR and cargo config alike.
src="$(
    cargo build --quiet -p testcloud-provider --bin "$binary" --message-format=json-render-diagnostics |
        sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n 1
)"
if [[ -z "$src" || ! -x "$src" ]]; then
    echo "install-testcloud-provider: built binary not found (got '${src}')" >&2
    exit 1
fi

dest_dir="$mirror/registry.terraform.io/terrace/testcloud/$version/$platform"
mkdir -p "$dest_dir"
# Copy then rename so a concurrently running terraform never sees a partial binary.
tmp="$(mktemp "$dest_dir/.${binary}.XXXXXX")"
cp "$src" "$tmp"
chmod 0755 "$tmp"
mv -f "$tmp" "$dest_dir/${binary}_v${version}"

echo "$mirror"
