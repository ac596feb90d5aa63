#!/usr/bin/env bash
# bench/run.sh: rl's system benchmark (run by `make bench`).
#
# Builds the release module and the peers (bench/peers.sh: the floor
# module and redis-cell renamed CELL.THROTTLE, built once into
# target/peers/), starts one redis-server with all three on a free
# 127.0.0.1 port (no persistence), loads the project's Lua baseline
# (bench/baseline.lua), and runs redis-benchmark (50 clients, 100k random
# keys) for INCR, RL.TAKE (allowed, allowed on a stored key, throttled,
# boxed, with ALSO, without STRIKES), rl's CL.THROTTLE, RL.WINDOW
# (sliding, exact, fixed), RL.LEASE ACQUIRE, the Lua baseline via EVALSHA,
# redis-cell's CELL.THROTTLE and FLOOR.TAKE with the arguments of each rl
# command it is compared with. The workloads are interleaved
# (A B C A B C ...) over $RL_BENCH_ROUNDS rounds at pipeline 1 and 32,
# then again at pipeline 32 with a replica attached (which loads the same
# modules). It also measures memory per key (used_memory delta over 50k
# keys, and MEMORY USAGE of a sample key), rl's and the peers' alike.
#
# It prints a table of median throughput, the median of the per-round
# ratios to INCR (same server, same round, same pipeline), usec_per_call
# from INFO commandstats (reset before each run), the CPU time per call of
# the server's main thread (from /proc/PID/schedstat) and its ratio to
# INCR's, that thread's CPU use during the run and the share of calls that
# took the intended path (from INFO rl), then the memory table, then
# `RATIO name x` lines (rl against each peer, medians of per-round ratios
# of this run; rl's CL.THROTTLE and CELL.THROTTLE also head to head, in
# back-to-back pairs of runs) and `TARGET` lines: each compares two
# measurements of this run against a target written in bench/report.sh
# (the speed and memory targets). A peer that could not be
# built is said so, and its rows and ratios are left out. The results of
# runs, with the machine and the date: bench/RESULTS.md. Absolute numbers
# depend on the machine and on what else runs on it: read the ratios.
#
# Environment (all optional):
#   RL_MODULE=path           use this module instead of building one
#   RL_SHARED=dir            where the peers' sources are (default
#                            ../shared from the repository root; see
#                            bench/peers.sh)
#   RL_BENCH_ROUNDS=3        rounds per configuration
#   RL_BENCH_SECS=1          target seconds per redis-benchmark run (1 keeps
#                            the whole run around 5 minutes on 2 cores)
#   RL_BENCH_PIPELINES="1 32"      pipelines without a replica
#   RL_BENCH_REPLICA_PIPELINES=32  pipelines with a replica ("" to skip)
#   RL_BENCH_KEYSPACE=100000       -r of redis-benchmark
#   RL_BENCH_MEM_KEYS=50000        keys per memory measurement
#   RL_BENCH_SCALE=1         also run RL.TAKE at 1k, 100k and 1M keys
#   RL_BENCH_PAIRS=6         head-to-head pairs of runs of rl's CL.THROTTLE
#                            and CELL.THROTTLE after each configuration's
#                            rounds (0: none); the target uses them
#   RL_BENCH_ONLY="take lua"       run only these workloads (incr always runs):
#                            take take_live take_thr take_box take_also
#                            take_plain throttle win_s win_e win_f lease lua
#                            cell floor_take floor_plain floor_throttle
#                            floor_window floor_lease
#   RL_BENCH_OUT=file        also write the report there
#
# Needs redis-server, redis-cli and redis-benchmark (Debian redis-tools);
# cc and cargo for the peers.

set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

ROUNDS=${RL_BENCH_ROUNDS:-3}
SECS=${RL_BENCH_SECS:-1}
PIPELINES=${RL_BENCH_PIPELINES:-"1 32"}
REPLICA_PIPELINES=${RL_BENCH_REPLICA_PIPELINES-32}
KEYSPACE=${RL_BENCH_KEYSPACE:-100000}
MEM_KEYS=${RL_BENCH_MEM_KEYS:-50000}
SCALE=${RL_BENCH_SCALE:-0}
PAIRS=${RL_BENCH_PAIRS:-6}
ONLY=${RL_BENCH_ONLY:-}
OUT=${RL_BENCH_OUT:-}
CLIENTS=50
HOST=127.0.0.1


for tool in redis-server redis-cli redis-benchmark; do
    command -v "$tool" >/dev/null || { echo "bench: $tool not found (make deps)" >&2; exit 1; }
done

# Helpers (bench/lib.sh): log, use_module, stop_pids, starting servers, ...
source "$ROOT/bench/lib.sh"
use_module

WORK=$(mktemp -d "${TMPDIR:-/tmp}/rl-bench.XXXXXX")
PIDS=()
cleanup() {
    stop_pids
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM


# The peers (bench/peers.sh), pipe_keys TEMPLATE COUNT REPEAT
# (bench/pipe_keys.sh) and the report (bench/report.sh).
source "$ROOT/bench/peers.sh"
source "$ROOT/bench/pipe_keys.sh"
source "$ROOT/bench/report.sh"

build_peers
log "starting redis-server with $MODULE${FLOOR_SO:+, $FLOOR_SO}${CELL_SO:+, $CELL_SO}"
start_server master --repl-diskless-sync-delay 0 \
    --client-output-buffer-limit "replica 0 0 0"
PORT=$PORT_master
MASTER_PID=$PID_master
cli() { redis-cli -h "$HOST" -p "$PORT" "$@"; }
REDIS_VERSION=$(cli INFO server | tr -d '\r' | awk -F: '$1 == "redis_version" { print $2 }')

SHA=$(cli SCRIPT LOAD "$(cat "$ROOT/bench/baseline.lua")")
[[ "$SHA" =~ ^[0-9a-f]{40}$ ]] || { echo "bench: SCRIPT LOAD failed: $SHA" >&2; exit 1; }

# ---------------------------------------------------------------------------
# Workloads: name | label | cmdstat name | INFO rl counter prefix and the
# outcome it should have | the command (__rand_int__: a random key number).
# ---------------------------------------------------------------------------
P="STRIKES 20 60 BOX 300 3600 86400"
declare -A LABEL CMD STAT PATHOK
WORKLOADS=()
add() {
    WORKLOADS+=("$1")
    LABEL[$1]=$2
    STAT[$1]=$3
    PATHOK[$1]=$4
    CMD[$1]=$5
}
add incr "INCR" incr - \
    "INCR bench:n:__rand_int__"
add take "RL.TAKE allowed" rl.take take_allowed \
    "RL.TAKE rl:{k:__rand_int__} 3000 3000 60 COST 1 $P"
add take_live "RL.TAKE allowed live" rl.take take_allowed \
    "RL.TAKE rl:{kl:__rand_int__} 3000 3000 3600 COST 1 $P"
add take_thr "RL.TAKE throttled" rl.take take_throttled \
    "RL.TAKE rl:{th:__rand_int__} 1 1 86400 COST 1 STRIKES 1000000000 60 BOX 300 3600 86400"
add take_box "RL.TAKE boxed" rl.take take_boxed \
    "RL.TAKE rl:{bx:__rand_int__} 3000 3000 60 COST 1 $P"
add take_also "RL.TAKE +ALSO" rl.take take_allowed \
    "RL.TAKE rl:{ka:__rand_int__} 3000 3000 60 COST 1 ALSO rl:{t:__rand_int__}:tenant 100000 100000 3600 $P"
# The work CL.THROTTLE does (one bucket, no penalty box), as RL.TAKE and
# as rl's own CL.THROTTLE (redis-cell's command and reply).
add take_plain "RL.TAKE no STRIKES" rl.take take_allowed \
    "RL.TAKE rl:{kp:__rand_int__} 3000 3000 60 COST 1"
add throttle "CL.THROTTLE (rl)" cl.throttle throttle_allowed \
    "CL.THROTTLE rl:{c:__rand_int__} 2999 3000 60 1"
add win_s "RL.WINDOW sliding" rl.window window_allowed \
    "RL.WINDOW rl:{ws:__rand_int__} 3000 60 COST 1"
add win_e "RL.WINDOW EXACT" rl.window window_allowed \
    "RL.WINDOW rl:{we:__rand_int__} 3000 60 EXACT COST 1"
add win_f "RL.WINDOW FIXED" rl.window window_allowed \
    "RL.WINDOW rl:{wf:__rand_int__} 3000 60 FIXED COST 1"
add lease "RL.LEASE ACQUIRE" "rl.lease|acquire" lease_granted \
    "RL.LEASE ACQUIRE rl:{l:__rand_int__} 1000 1"
add lua "Lua EVALSHA" evalsha - \
    "EVALSHA $SHA 4 lua:{__rand_int__}:b lua:{__rand_int__}:x lua:{__rand_int__}:s lua:{__rand_int__}:o 3000 3000 60 1 20 60 300 3600 86400 86400"
# The peers, same key shapes. redis-cell: the same call as rl's
# CL.THROTTLE. The floor: FLOOR.TAKE with the very arguments of the rl
# command it is compared with (it ignores them, Redis still reads them).
if [[ -n "$CELL_SO" ]]; then
    add cell "CELL.THROTTLE (cell)" cell.throttle - \
        "CELL.THROTTLE cl:{c:__rand_int__} 2999 3000 60 1"
fi
if [[ -n "$FLOOR_SO" ]]; then
    add floor_take "FLOOR.TAKE (take)" floor.take - \
        "FLOOR.TAKE fl:{k:__rand_int__} 3000 3000 60 COST 1 $P"
    add floor_plain "FLOOR.TAKE (plain)" floor.take - \
        "FLOOR.TAKE fl:{kp:__rand_int__} 3000 3000 60 COST 1"
    add floor_throttle "FLOOR.TAKE (throttle)" floor.take - \
        "FLOOR.TAKE fl:{c:__rand_int__} 2999 3000 60 1"
    add floor_window "FLOOR.TAKE (window)" floor.take - \
        "FLOOR.TAKE fl:{ws:__rand_int__} 3000 60 COST 1"
    add floor_lease "FLOOR.TAKE (lease)" floor.take - \
        "FLOOR.TAKE fl:{l:__rand_int__} ACQUIRE 1000 1"
fi

if [[ -n "$ONLY" ]]; then
    kept=(incr)
    for w in "${WORKLOADS[@]}"; do
        [[ $w != incr && " $ONLY " == *" $w "* ]] && kept+=("$w")
    done
    WORKLOADS=("${kept[@]}")
fi
has() { [[ " ${WORKLOADS[*]} " == *" $1 "* ]]; }

RESULTS=$WORK/results.tsv   # phase pipeline round workload rps usec cpu ok cpu_us
: >"$RESULTS"

# ---------------------------------------------------------------------------
# 1. Memory per key: FLUSHALL, create MEM_KEYS keys (or clients), delta.
# ---------------------------------------------------------------------------
MEMORY=$WORK/memory.tsv   # label keys_per_call bytes_per_key memory_usage_sample
: >"$MEMORY"
log "memory: $MEM_KEYS keys per measurement"
measure "SET key v EX 60 (string)" "str:{s:{I}}" 1 "SET str:{s:{I}} 1 EX 60"
measure "INCR (string, no TTL)" "bench:n:{I}" 1 "INCR bench:n:{I}"
# COST 1000: the bucket is full again (and its key gone) 20 s later, not
# 20 ms later as with COST 1, so every key is still there when counted.
measure "RL.TAKE bucket" "rl:{k:{I}}" 1 "RL.TAKE rl:{k:{I}} 3000 3000 60 COST 1000 $P"
# Two calls per key: one allowed, one throttled that trips the box.
measure "RL.TAKE bucket+strikes+box" "rl:{bx:{I}}" 2 \
    "RL.TAKE rl:{bx:{I}} 1 1 60 COST 1 STRIKES 1 60 BOX 300 3600 86400"
measure "RL.TAKE +ALSO (2 buckets)" "rl:{t:{I}}:tenant" 1 \
    "RL.TAKE rl:{ka:{I}} 3000 3000 60 COST 1000 ALSO rl:{t:{I}}:tenant 100000 100000 3600 $P"
# Quantity 1000 for the same reason as COST 1000 above.
measure "CL.THROTTLE (rl) bucket" "rl:{c:{I}}" 1 "CL.THROTTLE rl:{c:{I}} 2999 3000 60 1000"
if [[ -n "$CELL_SO" ]]; then
    measure "CELL.THROTTLE (redis-cell)" "cl:{c:{I}}" 1 "CELL.THROTTLE cl:{c:{I}} 2999 3000 60 1000"
fi
if [[ -n "$FLOOR_SO" ]]; then
    measure "FLOOR.TAKE (floor)" "fl:{k:{I}}" 1 "FLOOR.TAKE fl:{k:{I}} 3000 3000 60 COST 1000 $P"
fi
measure "RL.WINDOW sliding" "rl:{ws:{I}}" 1 "RL.WINDOW rl:{ws:{I}} 3000 60 COST 1"
measure "RL.WINDOW EXACT (1 entry)" "rl:{we:{I}}" 1 "RL.WINDOW rl:{we:{I}} 3000 60 EXACT COST 1"
measure "RL.WINDOW FIXED" "rl:{wf:{I}}" 1 "RL.WINDOW rl:{wf:{I}} 3000 60 FIXED COST 1"
measure "RL.LEASE 1 lease (generated id)" "rl:{l:{I}}" 1 "RL.LEASE ACQUIRE rl:{l:{I}} 1000 3600"
measure "Lua bucket (hash)" "lua:{{I}}:b" 1 \
    "EVALSHA $SHA 4 lua:{{I}}:b lua:{{I}}:x lua:{{I}}:s lua:{{I}}:o 3000 3000 60 1 20 60 300 3600 86400 86400"
# One call per client: cost 2 never fits in a bucket of 1, and threshold 1
# trips the box at once (bucket hash, box and offenses keys).
measure "Lua boxed client (3 keys)" "lua:{{I}}:b" 1 \
    "EVALSHA $SHA 4 lua:{{I}}:b lua:{{I}}:x lua:{{I}}:s lua:{{I}}:o 1 1 60 2 1 60 300 3600 86400 86400"

# ---------------------------------------------------------------------------
# 2. Throughput: prepare the keyspaces, then interleaved rounds.
# ---------------------------------------------------------------------------
cli FLUSHALL >/dev/null
log "preparing $KEYSPACE keys per workload"
has take_thr && pipe_keys \
    "RL.TAKE rl:{th:{I}} 1 1 86400 COST 1 STRIKES 1000000000 60 BOX 300 3600 86400" "$KEYSPACE" 1
has take_box && pipe_keys "RL.BOX TRIP rl:{bx:{I}} 1 0" "$KEYSPACE" 1
# A drained bucket refilling at 3000 points an hour stays stored for the
# whole run (take_live); the buckets of take and take_also are full again
# (and their keys expire) 20 ms after a call of cost 1, so most of their
# calls create the key anew.
has take_live && pipe_keys "RL.TAKE rl:{kl:{I}} 3000 3000 3600 COST 2000 $P" "$KEYSPACE" 1
# The tenant buckets of take_also are drained likewise (a tenant bucket is
# shared by many keys, so it is usually stored); the per-key bucket is
# created anew, as in take.
has take_also && pipe_keys "RL.TAKE rl:{t:{I}}:tenant 100000 100000 3600 COST 50000" "$KEYSPACE" 1

# The pairs with a throughput target, back to back after each phase.
HEAD_TO_HEAD=$WORK/head_to_head.tsv   # phase pipeline k a b rps_a rps_b cpu_us_a cpu_us_b
: >"$HEAD_TO_HEAD"
duel() { # duel PHASE PIPELINE
    if (( PAIRS > 0 )) && has throttle && has cell; then head_to_head "$1" "$2" throttle cell "$PAIRS"; fi
}

for pipe in $PIPELINES; do
    run_phase plain "$pipe"
    duel plain "$pipe"
done

if [[ -n "$REPLICA_PIPELINES" ]]; then
    log "starting a replica (full sync of $(cli DBSIZE) keys)"
    start_server replica --replicaof "$HOST" "$PORT"
    for _ in $(seq 1 600); do
        st=$(redis-cli -h "$HOST" -p "$PORT_replica" INFO replication | tr -d '\r')
        if grep -q '^master_link_status:up' <<<"$st" && grep -q '^master_sync_in_progress:0' <<<"$st"; then
            break
        fi
        sleep 0.1
    done
    grep -q '^master_link_status:up' <<<"$st" || { echo "bench: the replica did not sync" >&2; exit 1; }
    cli INFO replication | tr -d '\r' | grep -q '^slave0:.*state=online' \
        || { echo "bench: the master does not see its replica online" >&2; exit 1; }
    wait_replica_caught_up
    for pipe in $REPLICA_PIPELINES; do
        run_phase replica "$pipe"
        duel replica "$pipe"
    done
    link=$(redis-cli -h "$HOST" -p "$PORT_replica" INFO replication | tr -d '\r' | grep '^master_link_status')
    seen=$(cli INFO replication | tr -d '\r' | grep -c '^slave0:.*state=online' || true)
    log "replica after the runs: $link, online at the master: $seen"
fi

# ---------------------------------------------------------------------------
# 3. Optional: RL.TAKE at 1k, 100k and 1M keys (O(1) in the number of keys).
# ---------------------------------------------------------------------------
SCALE_RESULTS=$WORK/scale.tsv
: >"$SCALE_RESULTS"
if [[ "$SCALE" == 1 ]]; then
    if [[ -n "$REPLICA_PIPELINES" ]]; then
        redis-cli -h "$HOST" -p "$PORT_replica" REPLICAOF NO ONE >/dev/null
    fi
    cli FLUSHALL >/dev/null
    # Stored, drained buckets (as take_live), so every call finds its key;
    # one key prefix per size, all in the server at once, runs interleaved.
    SIZES="1000 100000 1000000"
    for keys in $SIZES; do
        log "scale: storing $keys keys"
        pipe_keys "RL.TAKE rl:{s$keys:{I}} 3000 3000 3600 COST 2000 $P" "$keys" 1
        CMD[s$keys]="RL.TAKE rl:{s$keys:__rand_int__} 3000 3000 3600 COST 1 $P"
        STAT[s$keys]=rl.take
        PATHOK[s$keys]=take_allowed
        # INCR on as many stored keys, for comparison (Redis' own growth).
        pipe_keys "SET bench:i$keys:{I} 1" "$keys" 1
        CMD[i$keys]="INCR bench:i$keys:__rand_int__"
        STAT[i$keys]=incr
        PATHOK[i$keys]=-
    done
    saved=$KEYSPACE
    declare -A n_scale=([s]=300000 [i]=1000000)
    for r in $(seq 1 "$ROUNDS"); do
        log "scale: round $r of $ROUNDS"
        for keys in $SIZES; do
            KEYSPACE=$keys
            for kind in s i; do
                line=$(run_bench "$kind$keys" 32 "${n_scale[$kind]}")
                echo "$keys $r $kind $line" >>"$SCALE_RESULTS"
                n_scale[$kind]=$(awk -v r="${line%% *}" -v s="$SECS" 'BEGIN { print int(r * s) }')
            done
        done
    done
    KEYSPACE=$saved
fi


# ---------------------------------------------------------------------------
# 4. Report (bench/report.sh)
# ---------------------------------------------------------------------------
if [[ -n "$OUT" ]]; then
    report | tee "$OUT"
else
    report
fi
log "done"
