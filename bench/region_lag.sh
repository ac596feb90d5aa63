#!/usr/bin/env bash
# The multi-region sync lag: the time from an `RL.QUOTA ... REGION` call in
# one region to its component being visible (`RL.REGION READ`) in each other
# region, under steady traffic in all three, on loopback: regions eu and us
# (one redis-server each) and ap (a cluster of three primaries), each with
# the module, one `rlctl regions sync` worker per region.
#
#   bench/region_lag.sh                     # 1000 calls/s per region, 300 probes
#   RL_LAG_RATE=3000 RL_LAG_PROBES=1000 RL_LAG_KEYS=10000 bench/region_lag.sh
#
# Prints p50, p99 and the maximum over every link, then per link (from->to).
# A probe's lag includes the probe's own polling (every 0.2 ms).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
cargo build --release --quiet
cargo build --release --quiet -p rlctl
RL_MODULE="$ROOT/target/release/librl.so" \
    cargo test --release --quiet -p rlctl --test region_lag -- --ignored --nocapture 2>&1 |
    grep -E '^(sync lag|  )'
