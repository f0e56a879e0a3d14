#!/usr/bin/env bash
# The cloud functions run as root run each job's terraform as a user of its own (uid 61000 and
# up): in the tests that user must reach what the checkout holds for terraform (the testcloud
# provider's mirror in .cache, terrace-aws as the AWS credential_process). A checkout under a
# private folder (mktemp -d makes 0700 ones) hides them. As root, this lets every user search
# (o+x, not read or list) the checkout's parent folders, saying which it changed.
set -euo pipefail
[[ "$(id -u)" == 0 ]] || exit 0
dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
while [[ "$dir" != / ]]; do
    if [[ "$(stat -c %A "$dir")" != ?????????[xt] ]]; then
        chmod o+x "$dir"
        echo "searchable-checkout: made $dir searchable by every user (o+x), for terraform's per-job users"
    fi
    dir="$(dirname "$dir")"
done
