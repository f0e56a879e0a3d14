#!/bin/sh
# Records what a terraform (or tofu) binary answers to `version -json`, with what identifies its
# file (its real path, size and modification time), for TERRACE_TERRAFORM_VERSION_FILE: a runner
# then reads its client from the record instead of starting terraform once per process, while the
# binary is still that file (deploy/Dockerfile records the image's; docs/BENCHMARKS.md, row 8).
#
# Usage: deploy/record-terraform-version.sh BINARY OUT
set -eu
if [ "$#" -ne 2 ]; then
    echo "usage: $0 BINARY OUT" >&2
    exit 2
fi
bin="$(command -v "$1")" || { echo "$1: no such binary" >&2; exit 1; }
real="$(readlink -f "$bin")"
case "$real" in
*'"'* | *'\'*)
    echo "$real: a path with a quote or a backslash cannot be recorded" >&2
    exit 1
    ;;
esac
version="$(CHECKPOINT_DISABLE=1 "$real" version -json 2>/dev/null)" || {
    echo "$real version -json failed" >&2
    exit 1
}
tmp="$2.tmp.$$"
printf '{"binary":"%s","size":%s,"mtime":%s,"version":%s}\n' \
    "$real" "$(stat -c %s "$real")" "$(stat -c %Y "$real")" "$version" > "$tmp"
mv "$tmp" "$2"
