#!/usr/bin/env bash
# Builds the three function images and the worker's (localhost/terrace-{aws,gcp,azure,worker}:dev)
# with podman from deploy/Dockerfile, out of this checkout's own pieces, as the image tests run
# them:
#
# - the function binaries and `terrace` built here (`cargo build`; with `--release`, a release build), their
#   debug info stripped;
# - the machine's terraform (scripts/install-terraform.sh), called `terraform` in the image;
# - the templates (the demo and the test templates) and the provider mirror holding the
#   testcloud provider (scripts/install-testcloud-provider.sh);
# - the base image made locally from the Debian mirror (scripts/install-podman.sh).
#
# The production build (`--target aws|gcp|azure` with the Dockerfile's defaults) compiles the
# functions in the Rust image and downloads OpenTofu, which needs a registry and github.com;
# these machines reach neither. Prints the image names.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
profile=debug
[[ "${1:-}" == "--release" ]] && profile=release

CONTAINERS_CONF="$(scripts/install-podman.sh)"
export CONTAINERS_CONF
terraform="$(scripts/install-terraform.sh)"
mirror="$(scripts/install-testcloud-provider.sh)"
cargo_flags=()
[[ "$profile" == release ]] && cargo_flags+=(--release)
cargo build --quiet "${cargo_flags[@]}" -p aws -p gcp -p azure -p local

stage="$repo_root/.image"
rm -rf "$stage"
mkdir -p "$stage/bin" "$stage/tools/bin" "$stage/tools/templates" "$stage/tools/providers"
for bin in terrace-aws terrace-gcp terrace-azure terrace; do
    objcopy --strip-debug "target/$profile/$bin" "$stage/bin/$bin"
done
cp "$terraform" "$stage/tools/bin/terraform"
cp -r templates/demo "$stage/tools/templates/"
for t in tests/templates/*/; do
    cp -r "$t" "$stage/tools/templates/"
done
cp -r "$mirror"/. "$stage/tools/providers/"

# The worker's image is the `terrace` target.
for cloud in aws gcp azure worker; do
    target="$cloud"
    [[ "$cloud" == worker ]] && target=terrace
    echo "building localhost/terrace-$cloud:dev" >&2
    podman build --quiet --file deploy/Dockerfile --target "$target" \
        --build-arg BASE=localhost/terrace-base:bookworm \
        --build-arg BINARIES=prebuilt --build-arg TOOLS=prebuilt --build-arg TERRAFORM=terraform \
        --build-arg TEMPLATES=.image/tools/templates --build-arg TARGETARCH=amd64 \
        --tag "localhost/terrace-$cloud:dev" . >/dev/null
    # No setuid or setgid program may be left in an image.
    privileged="$(podman run --rm --entrypoint /usr/bin/find "localhost/terrace-$cloud:dev" \
        / -xdev -perm /6000 -type f)"
    if [[ -n "$privileged" ]]; then
        echo "localhost/terrace-$cloud:dev has setuid or setgid programs: $privileged" >&2
        exit 1
    fi
    # The image's record of terraform's version is of its own binary, as a container sees it
    # (the same path, size and time), or every fresh container would start terraform to ask.
    if ! podman run --rm --entrypoint /bin/sh "localhost/terrace-$cloud:dev" -c \
        'b="$(readlink -f "$TERRACE_TERRAFORM")" &&
         grep -q "\"binary\":\"$b\",\"size\":$(stat -c %s "$b"),\"mtime\":$(stat -c %Y "$b")," \
             "$TERRACE_TERRAFORM_VERSION_FILE"'; then
        echo "localhost/terrace-$cloud:dev: its terraform-version.json is not of its terraform" >&2
        exit 1
    fi
    echo "localhost/terrace-$cloud:dev"
done
podman image ls --filter reference='localhost/terrace-*' --format '{{.Repository}}:{{.Tag}} {{.Size}}' >&2
