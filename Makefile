# Developer entry points. `make demo` and `make test` start the local emulators
# (kinesis-mock + DynamoDB Local, no Docker) and leave them running; `make down`
# stops them. With KCL_EMULATORS=external the environment is used as is (for
# example LocalStack from docker-compose.yml with AWS_ENDPOINT_URL set).

SHELL := bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

CARGO ?= cargo
KCL_EMULATORS ?= local

# Runs a command with the emulators' environment: after localstack/up, with the
# variables it wrote to localstack/.run/env exported; with external emulators,
# in the caller's environment unchanged.
ifeq ($(KCL_EMULATORS),external)
with_emulators = $(1)
else ifeq ($(KCL_EMULATORS),local)
with_emulators = localstack/up >/dev/null && . localstack/.run/env && $(1)
else
$(error KCL_EMULATORS must be "local" (default) or "external", not "$(KCL_EMULATORS)")
endif

.PHONY: help
help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-6s %s\n", $$1, $$2}'

.PHONY: up
up: ## start the local emulators (idempotent) and print their environment
	localstack/up

.PHONY: down
down: ## stop the local emulators
	localstack/down

.PHONY: test
# Four tests at a time in each binary on CI's two cores: the end-to-end
# tests spend most of their time waiting (on the emulators, lease durations,
# the Java KCL), not computing; the e2e binary took 490 s at two, 276 s and
# 269 s at four, every test passing.
test: ## start the emulators, then cargo test the whole workspace (doctests too: the README's quickstart)
	$(call with_emulators,$(CARGO) test --workspace --all-targets --no-fail-fast -- --test-threads=4)
	$(CARGO) test --workspace --doc

.PHONY: layout
layout: ## check the library's layout rules: short functions and files, no import circle
	python3 .ci/layout.py

.PHONY: sim
sim: ## run the seeded fleet simulator over SEEDS random seeds (default 200; SIM_BASE=n replays from n)
	SIM_SEEDS=$(or $(SEEDS),200) $(CARGO) test --release -p kcl-core --test sim random_seeds -- --nocapture

.PHONY: check-model
check-model: ## model-check the lease protocol deeper (MODEL_HORIZON seconds, default 40; make test runs 26)
	MODEL_HORIZON=$(or $(MODEL_HORIZON),40) $(CARGO) test --release -p kcl-core --lib leases::model -- --nocapture

.PHONY: demo
demo: ## start the emulators, then run the demo (produce and consume a stream)
	$(call with_emulators,$(CARGO) run -p kcl-examples --bin demo)

.PHONY: bench
bench: ## start the emulators, run every benchmark (release), write docs/benchmarks.json and render the docs from it
	$(CARGO) build --release -p kcl-tests --bin latency-bench \
		|| echo "latency-bench did not build: its section of the report says so"
	$(CARGO) build --release -p kcl-tests --bin kcl-bench
	# Run as a binary, not through cargo run: its protocol section runs
	# cargo test itself, which would wait for cargo run's lock.
	$(call with_emulators,target/release/kcl-bench)

.PHONY: fmt
fmt: ## format the workspace
	$(CARGO) fmt --all

.PHONY: lint
lint: ## clippy on every target, warnings as errors
	$(CARGO) clippy --workspace --all-targets -- -D warnings

.PHONY: figures
figures: ## render docs/BENCHMARKS.md and the figures the README and the guide quote, from docs/benchmarks.json
	$(CARGO) run -p kcl-tests --bin kcl-bench -- render
