# rl: rate limiting as a native Redis feature.
#
#   make run    install deps, build the module, run redis-server with it on 6379
#   make test   install deps, then fmt + clippy + release build + all tests
#               on redis-server (Debian's 7.0), then the integration tests
#               again on Redis 7.4 and on Valkey 8.1
#   make test-redis74  only the integration tests, on Redis 7.4 (.ci/get-redis)
#   make test-valkey  only the integration tests, on Valkey 8.1 (.ci/get-valkey)
#   make bench  system benchmark (bench/run.sh); bench-core: criterion
#   make bench-gateway  the gateway's speed against a plain nginx proxy (bench/gateway.sh)
#   make bench-app  rl in the application against the stores people use (Node and Python halves)
#   make bench-gateway-instructions  the gateway's instructions per request, by target
#                       (callgrind: steady on a shared machine; bench/gateway_instructions.sh)
#   make test-gateway  the gateway's Lua unit tests, then its end-to-end tests
#                       (nginx + Redis + HTTP)
#   make test-gateway-unit  only the gateway's Lua unit tests (LuaJIT and
#                       busted, no nginx, no Redis, a second; gateway/test/unit/run.sh)
#   make test-sdk      only the SDKs' tests (sdk/python, sdk/python-server, sdk/typescript, sdk/node-server)
#   make bench-envoy  rl-envoy through Envoy against no limiting, Envoy's local
#                     limiter and a floor service (bench/envoy.sh)
#   make test-rlctl    only rlctl's tests (the alert worker and operator CLI)
#   make test-envoy    only envoy-ratelimit's tests (Envoy's rate-limit service on rl)
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
FIGURES_REDIS74 := $(CURDIR)/target/reliability-figures-redis74.txt
FIGURES_VALKEY := $(CURDIR)/target/reliability-figures-valkey.txt
# cargo's output of the three runs; the summary line sums them.
TEST_LOG     := $(CURDIR)/target/test-output.log
TEST_LOG_REDIS74 := $(CURDIR)/target/test-output-redis74.log
TEST_LOG_VALKEY := $(CURDIR)/target/test-output-valkey.log
# Where .ci/get-redis and .ci/get-valkey (called by .ci/deps) put the
# servers and their clients.
REDIS74_DIR  ?= $(HOME)/.cache/rl/redis-7.4.1
VALKEY_DIR   ?= $(HOME)/.cache/rl/valkey-8.1.8
export REDIS74_DIR VALKEY_DIR
# Every test binary of tests/ starts servers: the runs on Redis 7.4 and
# Valkey are these, without the crate's unit tests, proptests and
# doc-tests.
INTEGRATION_TESTS := $(patsubst tests/%.rs,--test %,$(wildcard tests/*.rs))
# Prints "tests: N passed, N failed, N skipped" summed over cargo's
# "test result:" lines of the logs given as arguments.
SUMMARY      = awk '/^test result:/ { p += $$4; f += $$6; s += $$8 } \
		END { printf "tests: %d passed, %d failed, %d skipped\n", p, f, s }'

# sdk/test.sh writes one cargo-style "test result:" line per SDK here.
SDK_COUNTS   := $(CURDIR)/target/sdk-test-counts.txt
# gateway/test/unit/run.sh writes the Lua unit tests' counts here, likewise.
LUA_COUNTS   := $(CURDIR)/target/lua-unit-counts.txt

export PATH := $(HOME)/.cargo/bin:$(PATH)

.PHONY: all deps build run test test-redis74 test-valkey redis74-integration valkey-integration integration-on test-gateway test-gateway-unit test-sdk test-rlctl test-envoy bench bench-core bench-profile bench-gateway bench-gateway-instructions bench-app bench-app-node bench-app-python bench-envoy clean reliability reliability-report

all: build

deps:
	@bash .ci/deps

build:
	$(CARGO) build --release

# Foreground server with the module; Ctrl-C stops it. Its dump.rdb (if any)
# goes to target/run/. Installs only what building and running need
# (`.ci/deps run`), not the test dependencies.
run:
	@bash .ci/deps run
	$(CARGO) build --release
	@mkdir -p target/run
	redis-server --port $(PORT) --bind 127.0.0.1 --dir $(CURDIR)/target/run \
		--loadmodule $(MODULE)

# First the gateway's Lua unit tests (once: they use no server). The
# integration tests load the release module (RL_MODULE). They start real
# redis-servers and talk to them; they do not link the crate, so the module
# they load is the one just built, with Redis' allocator; then rlctl's tests
# and envoy-ratelimit's (workspace members; cargo test at the root runs the
# root crate's only), the integration tests again on Redis 7.4
# (redis74-integration) and on Valkey (valkey-integration), then the SDKs'
# tests (sdk/test.sh). The last line sums up every test binary of these runs
# (cargo's own last line is the doc-tests' count), the SDKs' counts and the
# Lua unit tests' count, after the wall time of each run; the exit status is
# the first failure. rlctl's binary is built before the runs: the gateway
# tests run it, and building it inside a test would slow the tests around it.
test: deps
	$(CARGO) fmt --all --check
	$(CARGO) clippy --all-targets -- -D warnings
	$(CARGO) clippy -p rlctl --all-targets -- -D warnings
	$(CARGO) clippy -p envoy-ratelimit --all-targets -- -D warnings
	$(CARGO) clippy --features system-alloc --bench core -- -D warnings
	$(CARGO) build --release
	$(CARGO) build --release -p rlctl
	@rm -f $(FIGURES) $(FIGURES_REDIS74) $(FIGURES_VALKEY) $(TEST_LOG_REDIS74) \
		$(TEST_LOG_VALKEY) $(SDK_COUNTS) $(LUA_COUNTS)
	@set -o pipefail; \
	started=$$SECONDS; \
	RL_UNIT_COUNTS=$(LUA_COUNTS) bash gateway/test/unit/run.sh; \
	lua_rc=$$?; \
	RL_MODULE=$(MODULE) RL_RELIABILITY_OUT=$(FIGURES) $(CARGO) test --release --no-fail-fast \
		-- --test-threads=$(TEST_THREADS) 2>&1 | tee $(TEST_LOG); \
	rc=$$?; \
	[ $$rc -ne 0 ] || rc=$$lua_rc; \
	RL_MODULE=$(MODULE) $(CARGO) test --release -p rlctl --no-fail-fast \
		-- --test-threads=$(TEST_THREADS) 2>&1 | tee -a $(TEST_LOG); \
	rc_rlctl=$$?; \
	[ $$rc -ne 0 ] || rc=$$rc_rlctl; \
	RL_MODULE=$(MODULE) $(CARGO) test --release -p envoy-ratelimit --no-fail-fast \
		-- --test-threads=$(TEST_THREADS) 2>&1 | tee -a $(TEST_LOG); \
	rc_envoy=$$?; \
	[ $$rc -ne 0 ] || rc=$$rc_envoy; \
	redis_s=$$((SECONDS - started)); \
	$(MAKE) --no-print-directory redis74-integration; \
	redis74_rc=$$?; \
	redis74_s=$$((SECONDS - started - redis_s)); \
	[ $$rc -ne 0 ] || rc=$$redis74_rc; \
	$(MAKE) --no-print-directory valkey-integration; \
	valkey_rc=$$?; \
	valkey_s=$$((SECONDS - started - redis_s - redis74_s)); \
	[ $$rc -ne 0 ] || rc=$$valkey_rc; \
	$(MAKE) --no-print-directory reliability-report; \
	$(MAKE) --no-print-directory reliability-report FIGURES=$(FIGURES_REDIS74); \
	$(MAKE) --no-print-directory reliability-report FIGURES=$(FIGURES_VALKEY); \
	RL_MODULE=$(MODULE) RL_SDK_COUNTS=$(SDK_COUNTS) bash sdk/test.sh; \
	sdk_rc=$$?; \
	[ $$rc -ne 0 ] || rc=$$sdk_rc; \
	touch $(SDK_COUNTS) $(LUA_COUNTS); \
	echo "runs: all tests on redis-server $$redis_s s, integration tests on Redis 7.4" \
		"$$redis74_s s and on Valkey $$valkey_s s"; \
	$(SUMMARY) $(TEST_LOG) $(TEST_LOG_REDIS74) $(TEST_LOG_VALKEY) $(SDK_COUNTS) $(LUA_COUNTS); \
	exit $$rc

# The integration tests alone, on Redis 7.4 or on Valkey 8.1 instead of
# redis-server (the binaries .ci/get-redis built into $(REDIS74_DIR)/bin,
# .ci/get-valkey fetched into $(VALKEY_DIR)/bin); summary line of this run
# only. By hand, on any server:
#   REDIS_SERVER=/path/valkey-server REDIS_CLI=/path/valkey-cli \
#     RL_MODULE=$PWD/target/release/librl.so cargo test --release --test take
test-redis74: deps build
	@rm -f $(TEST_LOG_REDIS74) $(FIGURES_REDIS74)
	@$(MAKE) --no-print-directory redis74-integration; \
	rc=$$?; \
	$(SUMMARY) $(TEST_LOG_REDIS74); \
	exit $$rc

test-valkey: deps build
	@rm -f $(TEST_LOG_VALKEY) $(FIGURES_VALKEY)
	@$(MAKE) --no-print-directory valkey-integration; \
	rc=$$?; \
	$(SUMMARY) $(TEST_LOG_VALKEY); \
	exit $$rc

# The runs on Redis 7.4 and on Valkey behind `test`, `test-redis74` and
# `test-valkey` (no deps, no build: they have done both).
redis74-integration:
	@$(MAKE) --no-print-directory integration-on SERVER_BIN=$(REDIS74_DIR)/bin \
		SERVER=redis LOG=$(TEST_LOG_REDIS74) RUN_FIGURES=$(FIGURES_REDIS74)

valkey-integration:
	@$(MAKE) --no-print-directory integration-on SERVER_BIN=$(VALKEY_DIR)/bin \
		SERVER=valkey LOG=$(TEST_LOG_VALKEY) RUN_FIGURES=$(FIGURES_VALKEY)

# The integration tests on $(SERVER_BIN)/$(SERVER)-server and -cli, then
# rlctl's region tests (the sync worker against that server); output also
# in $(LOG), reliability figures in $(RUN_FIGURES).
integration-on:
	@mkdir -p $(dir $(LOG)) && : > $(LOG)
	@test -x $(SERVER_BIN)/$(SERVER)-server -a -x $(SERVER_BIN)/$(SERVER)-cli || \
		{ echo "no $(SERVER)-server/$(SERVER)-cli in $(SERVER_BIN): run make deps" >&2; exit 1; }
	@echo "--- integration tests on $$($(SERVER_BIN)/$(SERVER)-server --version) ---"
	@set -o pipefail; \
	REDIS_SERVER=$(SERVER_BIN)/$(SERVER)-server REDIS_CLI=$(SERVER_BIN)/$(SERVER)-cli \
	RL_MODULE=$(MODULE) RL_RELIABILITY_OUT=$(RUN_FIGURES) \
		$(CARGO) test --release --no-fail-fast $(INTEGRATION_TESTS) \
		-- --test-threads=$(TEST_THREADS) 2>&1 | tee $(LOG); \
	rc=$$?; \
	REDIS_SERVER=$(SERVER_BIN)/$(SERVER)-server REDIS_CLI=$(SERVER_BIN)/$(SERVER)-cli \
	RL_MODULE=$(MODULE) $(CARGO) test --release -p rlctl --no-fail-fast --test regions \
		-- --test-threads=$(TEST_THREADS) 2>&1 | tee -a $(LOG); \
	rc_regions=$$?; \
	[ $$rc -ne 0 ] || rc=$$rc_regions; \
	exit $$rc

# The gateway's tests alone (gateway/TESTING.md): its Lua unit tests, then
# its end-to-end tests: nginx with the Lua library and the Kong plugin
# under its PDK shim, in front of a local upstream, against redis-server
# with the release module. `make test` runs them too.
# Every tests/gateway*.rs.
GATEWAY_TESTS = $(patsubst tests/%.rs,--test %,$(wildcard tests/gateway*.rs))

test-gateway: deps build
	bash gateway/test/unit/run.sh
	RL_MODULE=$(MODULE) $(CARGO) test --release $(GATEWAY_TESTS) \
		-- --test-threads=$(TEST_THREADS)

# The gateway's Lua unit tests alone (gateway/test/unit/run.sh): busted
# under LuaJIT, the ngx API stubbed, without nginx or Redis, in a second.
# `make test` and `make test-gateway` run them too.
test-gateway-unit:
	bash gateway/test/unit/run.sh

# The SDKs' tests alone (sdk/test.sh): the client SDKs (sdk/python: pytest +
# mypy; sdk/typescript: tsc + node --test; unit tests with a fake clock and
# end-to-end tests against nginx + Redis with the release module) and the
# server-side packages (sdk/python-server, sdk/node-server: real framework
# servers and Redis), the four in parallel. `make test` runs them too.
test-sdk: deps build
	@RL_MODULE=$(MODULE) RL_SDK_COUNTS=$(SDK_COUNTS) bash sdk/test.sh

# rlctl's tests alone (rlctl/README.md, "Tests"): redis-server with the
# release module (one server, a 3-primary cluster), loopback webhook and
# SMTP receivers, the rlctl binary. `make test` runs them too.
test-rlctl: deps build
	RL_MODULE=$(MODULE) $(CARGO) test --release -p rlctl -- --test-threads=$(TEST_THREADS)

# envoy-ratelimit's tests alone (envoy-ratelimit/README.md, "Tests"): the
# rl-envoy service against redis-server with the release module, over gRPC
# and through the real Envoy (.ci/get-envoy) with a loopback upstream.
# `make test` runs them too, once (on redis-server).
test-envoy: deps build
	RL_MODULE=$(MODULE) $(CARGO) test --release -p envoy-ratelimit -- --test-threads=$(TEST_THREADS)

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

# System benchmark (bench/run.sh, 5-10 minutes): one redis-server with
# the module and its peers, the floor module (FLOOR.TAKE) and redis-cell
# renamed CELL.THROTTLE (built once into target/peers/ from a shared/ folder by
# bench/peers.sh; RL_SHARED=dir overrides the location; a peer that cannot
# be built is reported and left out), redis-benchmark for INCR,
# RL.TAKE/WINDOW/LEASE, CL.THROTTLE, CELL.THROTTLE, FLOOR.TAKE and the Lua
# baseline at pipeline 1 and 32, then with a replica; prints throughput
# ratios to INCR, usec/call, bytes/key, RATIO lines between rl and each
# peer measured side by side in that run, and TARGET lines for the speed
# and memory targets. Results: bench/RESULTS.md. The criterion benchmarks
# of the pure core are a separate target, bench-core (they build the
# dev-dependencies, and link the crate outside Redis, hence the system
# allocator); bench-profile counts instructions and allocations per call
# under callgrind, rl's workloads with their peers in the same server
# (WORKLOAD="take throttle ...", or all or targets; see bench/profile.sh),
# and checks the instruction targets against the floor.
bench: deps
	bash bench/run.sh

# The application benchmark (`make bench-app`: both halves, about 1 minute
# each; not part of `make test`). Node: the same Express route with
# express-rate-limit + rate-limit-redis, with rl's store, and with rl's
# middleware, in interleaved rounds on one Redis (requests per second, p99,
# Redis command time and CPU per decision, Express's CPU per request; then
# the three limiters alone, without HTTP, CPU per decision;
# sdk/node-server/bench/app.mjs). Results: bench/RESULTS.md.
bench-app: bench-app-node bench-app-python

bench-app-node: deps build
	cd sdk/node-server && npm run --silent build && RL_MODULE=$(MODULE) node bench/app.mjs

bench-core:
	$(CARGO) bench --features system-alloc --bench core

WORKLOAD ?= take
bench-profile: deps
	bash bench/profile.sh $(WORKLOAD)

# The gateway's speed (bench/gateway.sh, about 4 minutes; not part of
# `make test`): wrk on the upstream direct, a plain nginx proxy, the proxy
# with one pooled INCR per request (the floor), the proxy with rl (the
# sample policy's allowed path) and with nginx's limit_req, in interleaved
# rounds; prints RATIO lines (to the plain proxy, and rl to the floor),
# p50/p99 and CPU time per request. Results: bench/RESULTS.md.
bench-gateway: deps build
	RL_MODULE=$(MODULE) bash bench/gateway.sh

bench-gateway-instructions: deps build
	RL_MODULE=$(MODULE) bash bench/gateway_instructions.sh

# The application benchmark's Python half: slowapi with limits' Redis storage against slowapi with
# rl's storage and rl's ASGI middleware, the same Starlette route under
# uvicorn, interleaved wrk rounds, one redis-server (bench/app_python.py:
# requests/s, p99, Redis command time and CPU per decision, the app's CPU
# per request, RATIO and TARGET lines).
bench-app-python: deps build
	RL_MODULE=$(MODULE) target/sdk-venv/bin/python bench/app_python.py

# Envoy's rate limiting with rl (bench/envoy.sh, about 2 minutes; not part
# of `make test`): wrk through one Envoy 1.40 with no rate limiting, with
# its local rate limit filter, with the rate-limit filter asking a floor
# service (the same gRPC stack answering OK without Redis) and asking
# rl-envoy, in interleaved rounds; prints RATIO lines (to the plain proxy,
# and rl to the floor), p99 and the CPU time per request of Envoy, the
# service and Redis. Results: bench/RESULTS.md.
bench-envoy: deps build
	RL_MODULE=$(MODULE) bash bench/envoy.sh

clean:
	$(CARGO) clean
	rm -rf "$${TMPDIR:-/tmp}"/rl-test-*
