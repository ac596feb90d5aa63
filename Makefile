# rl: rate limiting as a native Redis feature.
#
#   make run    install deps, build the module, run redis-server with it on 6379
#   make test   install deps, then fmt + clippy + release build + all tests
#
# Deps are installed by .ci/deps (apt, only what is missing; rustfmt/clippy).

SHELL        := /bin/bash
CARGO        ?= cargo
MODULE       := $(CURDIR)/target/release/librl.so
PORT         ?= 6379
# Integration tests start real redis-servers (up to 6 for a cluster test) and
# some assert timings: 2 test threads suit a 2-core machine.
TEST_THREADS ?= 2

export PATH := $(HOME)/.cargo/bin:$(PATH)

.PHONY: all deps build run test bench clean

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
	$(CARGO) build --release
	@set -o pipefail; \
	RL_MODULE=$(MODULE) $(CARGO) test --release --no-fail-fast \
		-- --test-threads=$(TEST_THREADS) 2>&1 | tee target/test-output.log; \
	rc=$$?; \
	awk '/^test result:/ { p += $$4; f += $$6; s += $$8 } \
		END { printf "tests: %d passed, %d failed, %d skipped\n", p, f, s }' \
		target/test-output.log; \
	exit $$rc

bench:
	@echo "bench: not yet: there are no benchmarks yet"

clean:
	$(CARGO) clean
	rm -rf "$${TMPDIR:-/tmp}"/rl-test-*
