# Chores for Terrace. `make demo` and `make test` are the README's two commands; both install
# what they need first (`make demo-tools`, `make tools`).
.PHONY: tools demo-tools demo test schema images test-images check-deploy fmt lint deny deny-advisories ci bench bench-overhead bench-http-backend bench-s3 bench-templates bench-cold-start bench-sweep bench-gcs bench-concurrency bench-log-latency bench-state-server bench-sealing bench-store-latency bench-start-latency bench-amqp-workers bench-policy fuzz clean

tools: ## protoc, the machine's terraform (checked, never wrapped), the testcloud provider, a terraform CLI config, the emulators
	scripts/install-tools.sh

demo-tools: ## what the demo needs: protoc, the machine's terraform (checked), the testcloud provider and its CLI config, rabbitmq-server
	scripts/install-tools.sh --demo

demo: demo-tools ## apply the demo template through the local runner
	scripts/demo.sh

test: tools ## the whole test suite, with real terraform and the cloud emulators
	scripts/searchable-checkout.sh
	cargo build -p local -p aws -p gcp -p azure
	scripts/with-emulators.sh cargo test --workspace --no-fail-fast

schema: ## regenerate docs/schema/ from the record types (a unit test fails while it is stale)
	cargo run -q -p local --bin terrace -- schema --write docs/schema

images: ## the three function images and the worker's, with podman, from this checkout (scripts/build-images.sh)
	scripts/build-images.sh

test-images: tools images ## run a real job in each built image, against the emulators and RabbitMQ
	scripts/with-emulators.sh cargo test -p tests --test aws_lambda --test gcp_service --test azure_job --test amqp -- --ignored the_image

check-deploy: ## terraform fmt, checkov and cfn-lint over deploy/ (terraform validate needs the real providers)
	scripts/check-deploy.sh

fmt:
	cargo fmt --all

lint:
	cargo fmt --all --check
	cargo clippy --workspace --all-targets -- -D warnings
	RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet

deny: ## licenses, bans and sources of every dependency (deny.toml); offline-safe
	scripts/install-cargo-deny.sh
	.cache/cargo-deny/bin/cargo-deny check licenses bans sources

deny-advisories: ## the RustSec advisories: needs the advisory database from github.com
	scripts/install-cargo-deny.sh
	.cache/cargo-deny/bin/cargo-deny check advisories

ci: test test-images check-deploy lint deny

bench: bench-state-server bench-sealing bench-overhead bench-http-backend bench-s3 bench-store-latency bench-start-latency bench-amqp-workers bench-templates bench-cold-start bench-sweep bench-gcs bench-concurrency bench-log-latency bench-policy ## the benchmarks

bench-state-server:
	cargo bench -p shared --bench state_server

bench-policy: ## what holding a plan to the example policies costs, in-process and in the bounded child, for plans of 10, 1,000 and 5,000 changes
	cargo build --release -q -p local
	TERRACE_BIN="$$(scripts/target-dir.sh)/release/terrace" cargo bench -p shared --bench policy

bench-sealing: ## what sealing a state (envelope encryption with a key file) costs per write and read
	cargo bench -p state-backends --bench sealing

bench-overhead: tools
	benches/overhead.sh

bench-http-backend: tools ## what terraform's http backend costs terraform itself, with a trivial server
	benches/http-backend.sh

bench-s3: tools ## terraform's s3 backend vs Terrace's S3 + DynamoDB store, against moto
	benches/s3-backends.sh

bench-store-latency: tools ## a job's store round trips at 0, 20 and 100 ms per request: terraform's s3 (lock file, DynamoDB) and gcs backends vs Terrace, and Terrace on Azure (PROFILE=release, N, DELAYS, SIDES)
	benches/store-latency.sh

bench-start-latency: tools ## enqueue to terraform's first output per trigger (serve's folder queue, SQS -> Lambda, Pub/Sub push, Storage Queue), 100 jobs each: p50/p99, and the runner's own share (PROFILE=release, N, POLL_MS, TRIGGERS)
	benches/start-latency.sh

bench-amqp-workers: tools ## self-hosted workers on RabbitMQ: throughput and enqueue to terraform's first output with 1, 2 and 3 workers (N, PROFILE)
	benches/amqp-workers.sh

bench-templates: tools ## what reading a job's template from a bucket costs, against moto
	benches/template-fetch.sh

bench-cold-start: tools ## terrace-aws's start to its first Runtime API poll, against a minimal lambda_runtime function
	benches/cold-start.sh

bench-sweep: tools ## the backup sweep over 10, 1,000 and 10,000 workspaces, 1 % changed, on S3, GCS and Azure emulators
	scripts/with-emulators.sh cargo run --quiet -p tests --example sweep

bench-gcs: tools ## terraform's gcs backend vs Terrace's GCS store, against fake-gcs-server (azurerm cannot reach Azurite: docs/BENCHMARKS.md)
	benches/gcs-backends.sh

bench-concurrency: tools ## 1, 8, 64 jobs in one runner (LEVELS="1 8 64 256" for 256) vs as many bare terraform applies at once
	benches/concurrency.sh

bench-log-latency: tools ## a line's time from terraform to the runner's stderr and to a stored log chunk
	benches/log-latency.sh

fuzz: ## each fuzz target for FUZZ_SECONDS (30) with cargo-fuzz (nightly), growing fuzz/corpus
	scripts/fuzz.sh $(or $(FUZZ_SECONDS),30)

clean:
	rm -rf .terrace .terrace-demo
