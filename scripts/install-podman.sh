#!/usr/bin/env bash
# Installs podman (with buildah, runc and debootstrap) to build and run the function images
# without a container registry or a Docker daemon, configures it for these machines, and makes
# the local base image `localhost/terrace-base:bookworm` from the Debian mirror apt uses.
# The Debian mirror is TERRACE_DEBIAN_MIRROR (default deb.debian.org). Idempotent. Prints the path of the containers.conf to export as CONTAINERS_CONF.
#
# Debian's default runtime (crun) cannot start containers on hosts with hybrid cgroups, and the
# default ulimits ask for more than such hosts allow: the config below picks runc and sets both.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
conf="$repo_root/.cache/podman/containers.conf"
base="localhost/terrace-base:bookworm"
sudo=""
[[ "$(id -u)" == 0 ]] || sudo="sudo"

missing=()
for cmd in podman buildah runc debootstrap; do
    command -v "$cmd" >/dev/null 2>&1 || missing+=("$cmd")
done
if ((${#missing[@]})); then
    echo "installing ${missing[*]} with apt-get" >&2
    $sudo apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq podman buildah runc debootstrap >&2
fi

mkdir -p "$(dirname "$conf")"
cat > "$conf" <<'CONF'
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]

[engine]
runtime = "runc"
CONF
export CONTAINERS_CONF="$conf"

if ! podman image exists "$base"; then
    mirror="${TERRACE_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
    rootfs="$(mktemp -d)"
    trap 'rm -rf "$rootfs"' EXIT
    echo "making $base with debootstrap from $mirror" >&2
    $sudo debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >/dev/null
    $sudo tar -C "$rootfs" -c . | podman import - "$base" >/dev/null
fi
echo "$conf"
