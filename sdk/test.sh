#!/usr/bin/env bash
# Runs the SDKs' tests (after .ci/deps-sdk and `cargo build --release`):
#   - Python: pytest over sdk/python/tests (unit, then end-to-end against
#     nginx + Redis started by sdk/e2e/launcher.py), then mypy --strict;
#   - Python server side: pytest over sdk/python-server/tests (typed
#     commands, the limits storage, slowapi, flask-limiter, the ASGI
#     middleware, against real servers), then mypy --strict;
#   - TypeScript: tsc build of the package, tsc of the tests, then node's
#     test runner over the unit and end-to-end tests;
#   - Node server side (sdk/node-server, @rl/server): the same, over its
#     tests (redis-server and Valkey, Express and Fastify, the gateway).
# The four run in parallel (each end-to-end suite has its own nginx and
# Redis on free ports; their long scenarios overlap), logs shown one after
# the other. Writes one cargo-style `test result: ... N passed; N failed;
# N ignored;` line per SDK to $RL_SDK_COUNTS (default
# target/sdk-test-counts.txt) for the Makefile's total. Exit status: 0 only
# when all passed.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
counts=${RL_SDK_COUNTS:-$root/target/sdk-test-counts.txt}
python=$root/target/sdk-venv/bin/python
export RL_MODULE=${RL_MODULE:-$root/target/release/librl.so}
export RL_SDK_PYTHON=$python
mkdir -p target
: > "$counts"
rm -f target/sdk-python.log target/sdk-python-server.log target/sdk-typescript.log target/sdk-typescript.tap
rm -f target/sdk-node-server.log target/sdk-node-server.tap

(
    cd sdk/python &&
    RL_SDK_COUNTS=$counts "$python" -m pytest -q -rxX -p no:cacheprovider tests &&
    "$python" -m mypy
) > target/sdk-python.log 2>&1 &
py_pid=$!

(
    cd sdk/python-server &&
    RL_SDK_COUNTS=$counts "$python" -m pytest -q -rxX -p no:cacheprovider tests &&
    "$python" -m mypy
) > target/sdk-python-server.log 2>&1 &
pys_pid=$!

(
    cd sdk/typescript &&
    npm run --silent build &&
    npm run --silent build:test &&
    node --test --test-reporter=spec --test-reporter-destination=stdout \
        --test-reporter=tap --test-reporter-destination="$root/target/sdk-typescript.tap" \
        build-test/test/unit/*.test.js build-test/test/e2e/*.test.js
) > target/sdk-typescript.log 2>&1 &
ts_pid=$!

(
    cd sdk/node-server &&
    npm run --silent build &&
    npm run --silent build:test &&
    node --test --test-concurrency=2 --test-reporter=spec --test-reporter-destination=stdout \
        --test-reporter=tap --test-reporter-destination="$root/target/sdk-node-server.tap" \
        build-test/test/*.test.js
) > target/sdk-node-server.log 2>&1 &
ns_pid=$!

wait "$py_pid"; py_rc=$?
wait "$ts_pid"; ts_rc=$?
wait "$ns_pid"; ns_rc=$?
wait "$pys_pid"; pys_rc=$?

echo "--- sdk/python (pytest, mypy): exit $py_rc ---"
cat target/sdk-python.log
echo "--- sdk/python-server (pytest, mypy): exit $pys_rc ---"
cat target/sdk-python-server.log
echo "--- sdk/typescript (tsc, node --test): exit $ts_rc ---"
cat target/sdk-typescript.log
echo "--- sdk/node-server (tsc, node --test): exit $ns_rc ---"
cat target/sdk-node-server.log

# node's TAP summary: "# pass N", "# fail N", "# cancelled N", "# skipped N", "# todo N"
for suite in sdk-typescript sdk-node-server; do
    if [ -s "target/$suite.tap" ]; then
        awk -v suite="$suite" '/^# pass / { p = $3 } /^# fail / { f += $3 } /^# cancelled / { f += $3 }
             /^# skipped / { s += $3 } /^# todo / { s += $3 }
             END { printf "test result: %s. %d passed; %d failed; %d ignored;\n", suite, p, f, s }' \
            "target/$suite.tap" >> "$counts"
    fi
done
echo "--- sdk counts ($counts) ---"
cat "$counts"
[ "$py_rc" -eq 0 ] && [ "$ts_rc" -eq 0 ] && [ "$pys_rc" -eq 0 ] && [ "$ns_rc" -eq 0 ]
