# rl: rate limiting as a native Redis feature.
#
#   make run    install deps, build the module, run redis-server with it on 6379
#   make test   install deps, then fmt + clippy + release build + all tests
#   make bench  system benchmark (bench/run.sh); bench-core: criterion
#   make test-gateway  only the gateway end-to-end tests (nginx + Redis + HTTP)
#
# Deps are installed by .ci/deps (apt, only what is missing; rustfmt/clippy).

SHELL        := /bin/bash
CARGO        ?= cargo
MODULE       := $(CURDIR)/target/release/librl.so
PORT         ?= 6379
# Integration tests start real redis-servers (up to 6 for a cluster test) and
# some assert timings: 2 test threads suit a 2-core machine.
TEST_THREADS ?= 2
# The reliability tests (tests/reliability_*.rs) append one
# `property | how tested | figure` line each to this file.
FIGURES      := $(CURDIR)/target/reliability-figures.txt

export PATH := $(HOME)/.cargo/bin:$(PATH)

.PHONY: all deps build run test test-gateway bench bench-core bench-profile clean reliability reliability-report

all: build

deps:
	@bash .ci/deps

build:
	$(CARGO) build --release

# Foreground server with the module; Ctrl-C stops it. Its dump.rdb (if any)
# goes to target/run/.
run: deps build
	@mkdir -p target/run
	redis-server --port $(PORT) --bind 127.0.0.1 --dir $(CURDIR)/target/run \
		--loadmodule $(MODULE)

# The integration tests load the release module (RL_MODULE). They start real
# redis-servers and talk to them; they do not link the crate, so the module
# they load is the one just built, with Redis' allocator. The last line sums
# up every test binary (cargo's own last line is the doc-tests' count).
test: deps
	$(CARGO) fmt --check
	$(CARGO) clippy --all-targets -- -D warnings
	$(CARGO) clippy --features system-alloc --bench core -- -D warnings
	$(CARGO) build --release
	@rm -f $(FIGURES)
	@set -o pipefail; \
	RL_MODULE=$(MODULE) RL_RELIABILITY_OUT=$(FIGURES) $(CARGO) test --release --no-fail-fast \
		-- --test-threads=$(TEST_THREADS) 2>&1 | tee target/test-output.log; \
	rc=$$?; \
	$(MAKE) --no-print-directory reliability-report; \
	awk '/^test result:/ { p += $$4; f += $$6; s += $$8 } \
		END { printf "tests: %d passed, %d failed, %d skipped\n", p, f, s }' \
		target/test-output.log; \
	exit $$rc

# The gateway's end-to-end tests alone (gateway/README.md): nginx with the
# Lua library and the Kong plugin under its PDK shim, in front of a local
# upstream, against redis-server with the release module. `make test` runs
# them too.
test-gateway: deps build
	RL_MODULE=$(MODULE) $(CARGO) test --release --test gateway --test gateway_routes \
		--test gateway_logins --test gateway_modes --test gateway_kong \
		--test gateway_rules --test gateway_examples --test gateway_ledger \
		--test gateway_cluster --test gateway_sentinel \
		-- --test-threads=$(TEST_THREADS)

# Prints the figures of the last run (make test or make reliability).
reliability-report:
	@echo "--- reliability figures (tests/RELIABILITY.md; $(FIGURES)) ---"
	@if [ -s $(FIGURES) ]; then sort $(FIGURES); else echo "(no figures: run make test or make reliability)"; fi

# Runs only the reliability suite, prints its figures and rewrites the
# table of tests/RELIABILITY.md (between its figures markers) from them.
reliability: deps build
	@rm -f $(FIGURES)
	RL_MODULE=$(MODULE) RL_RELIABILITY_OUT=$(FIGURES) $(CARGO) test --release --no-fail-fast \
		$(patsubst tests/%.rs,--test %,$(wildcard tests/reliability_*.rs)) \
		-- --test-threads=$(TEST_THREADS)
	@$(MAKE) --no-print-directory reliability-report
	@sort $(FIGURES) | awk -F' [|] ' '{ printf "| %s | %s | %s |\n", $$1, $$2, $$3 }' \
		> target/reliability-rows.md
	@awk 'FNR == NR { rows = rows $$0 "\n"; next } \
		/<!-- figures:end -->/ { skip = 0 } \
		!skip { print } \
		/<!-- figures:begin -->/ { print "| property | how it is tested | figure |"; \
			print "| --- | --- | --- |"; printf "%s", rows; skip = 1 }' \
		target/reliability-rows.md tests/RELIABILITY.md > target/RELIABILITY.md.new
	@mv target/RELIABILITY.md.new tests/RELIABILITY.md
	@echo "tests/RELIABILITY.md: table rewritten from $(FIGURES)"

# System benchmark (bench/run.sh, under 5 minutes): redis-server with the
# module, redis-benchmark for INCR, RL.TAKE/WINDOW/LEASE and the Lua
# baseline at pipeline 1 and 32, then with a replica; prints throughput
# ratios to INCR, usec/call, bytes/key and the issue-6 targets. Results:
# bench/RESULTS.md. The criterion benchmarks of the pure core are a
# separate target, bench-core (they build the dev-dependencies, and link
# the crate outside Redis, hence the system allocator); bench-profile
# counts instructions and allocations per call under callgrind
# (WORKLOAD=take|take_live|take_also|window|lease|incr|lua).
bench: deps
	bash bench/run.sh

bench-core:
	$(CARGO) bench --features system-alloc --bench core

WORKLOAD ?= take
bench-profile: deps
	bash bench/profile.sh $(WORKLOAD)

clean:
	$(CARGO) clean
	rm -rf "$${TMPDIR:-/tmp}"/rl-test-*
