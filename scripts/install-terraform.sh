#!/usr/bin/env bash
# Finds the terraform the demo, the tests and the benchmarks run: a supported client (Terraform
# >= 1.5 or OpenTofu >= 1.6), called directly, never through a wrapper. Prints its absolute path.
#
# Looks at TERRACE_TERRAFORM, else `terraform` on PATH, else `tofu` on PATH. None of the package
# registries these machines reach serves either binary, so nothing is downloaded: where none is
# found, it says in one line what to install and exits 1.
set -euo pipefail

floor_ok() { # flavour version -> 0 when supported
    python3 - "$1" "$2" <<'PY'
import re, sys
flavour, version = sys.argv[1], sys.argv[2]
m = re.match(r"v?(\d+)\.(\d+)\.(\d+)(-)?", version)
floor = (1, 6, 0) if flavour == "opentofu" else (1, 5, 0)
ok = m and ((tuple(map(int, m.groups()[:3])) > floor) or (tuple(map(int, m.groups()[:3])) == floor and not m.group(4)))
sys.exit(0 if ok else 1)
PY
}

candidates=()
if [[ -n "${TERRACE_TERRAFORM:-}" ]]; then
    candidates+=("$TERRACE_TERRAFORM")
else
    for name in terraform tofu; do
        command -v "$name" >/dev/null 2>&1 && candidates+=("$(command -v "$name")")
    done
fi

for bin in "${candidates[@]}"; do
    path="$(command -v "$bin" 2>/dev/null || true)"
    [[ -n "$path" && -x "$path" ]] || continue
    version="$(CHECKPOINT_DISABLE=1 "$path" version -json 2>/dev/null |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["terraform_version"])' 2>/dev/null || true)"
    flavour=terraform
    [[ "$(basename "$path")" == tofu* ]] && flavour=opentofu
    if [[ -n "$version" ]] && floor_ok "$flavour" "$version"; then
        echo "using $flavour $version at $path" >&2
        echo "$path"
        exit 0
    fi
    echo "skipping $path: ${version:+$flavour $version is }not a supported client (Terraform >= 1.5, OpenTofu >= 1.6)" >&2
done

echo "no supported terraform found: install Terraform >= 1.5 or OpenTofu >= 1.6 as \`terraform\` or \`tofu\` on PATH, or set TERRACE_TERRAFORM to its path" >&2
exit 1
