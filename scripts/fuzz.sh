#!/usr/bin/env bash
# Fuzzes each target for SECONDS (default 30) with cargo-fuzz (libFuzzer, nightly), starting
# from the checked-in corpus (fuzz/corpus/<target>/, which it grows with every input that
# reaches new code) and the named seeds and regressions (fuzz/seeds/<target>/, never changed
# by the fuzzer). Then minimises the corpus back in place (cargo fuzz cmin), so what is
# checked in stays small. A crash stops with its input in fuzz/artifacts/<target>/: once
# fixed, add it to fuzz/seeds/<target>/ under a name that says what it found. The stable test `cargo test -p fuzz-targets` replays the corpus.
# Usage: scripts/fuzz.sh [SECONDS] [TARGET...]   (targets: job tfstate state_server)
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root/fuzz"
mkdir -p "$repo_root/target"
seconds="${1:-30}"
shift || true
if [[ ! "$seconds" =~ ^[0-9]+$ ]] || (( seconds == 0 )); then
    echo "usage: scripts/fuzz.sh [SECONDS] [TARGET...]: SECONDS is a number above 0" >&2
    exit 64
fi
targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=(job tfstate state_server)

if ! command -v c++ >/dev/null 2>&1; then
    echo "installing a C++ compiler (libFuzzer is C++) with apt-get" >&2
    sudo=""
    [[ "$(id -u)" == 0 ]] || sudo="sudo"
    $sudo apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq g++ >&2
fi
if ! cargo +nightly --version >/dev/null 2>&1; then
    echo "fuzz: libFuzzer needs a nightly Rust toolchain (rustup toolchain install nightly)" >&2
    exit 1
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked --version 0.13.2
fi
# With debug assertions, as the stable replay of the corpus runs: an overflow is found here,
# not by the next `make test`.
cargo +nightly fuzz build -O -a
for t in "${targets[@]}"; do
    mkdir -p "corpus/$t" "seeds/$t"
    before=$(ls "corpus/$t" | wc -l)
    # One job, a fixed number of seconds; -max_len keeps inputs the size of real ones.
    cargo +nightly fuzz run -O -a "$t" "corpus/$t" "seeds/$t" -- \
        -max_total_time="$seconds" -max_len=65536 -print_final_stats=1 2>"$repo_root/target/fuzz-$t.log" \
        || { tail -40 "$repo_root/target/fuzz-$t.log" >&2; exit 1; }
    runs=$(grep -m1 -o 'stat::number_of_executed_units: *[0-9]*' "$repo_root/target/fuzz-$t.log" | grep -o '[0-9]*$' || echo '?')
    # cmin says when it fails but exits 0: read what it says.
    cargo +nightly fuzz cmin -O -a "$t" "corpus/$t" >"$repo_root/target/fuzz-$t-cmin.log" 2>&1
    if grep -q "Failed to minimize" "$repo_root/target/fuzz-$t-cmin.log"; then
        tail -20 "$repo_root/target/fuzz-$t-cmin.log" >&2
        exit 1
    fi
    echo "fuzz $t: ${seconds}s, $runs inputs run, no crash; corpus $before -> $(ls "corpus/$t" | wc -l) inputs"
done
