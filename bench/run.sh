#!/usr/bin/env bash
# bench/run.sh: rl's system benchmark (run by `make bench`).
#
# Builds the release module, starts one redis-server with it on a free
# 127.0.0.1 port (no persistence), loads the project's Lua baseline
# (bench/baseline.lua), and runs redis-benchmark (50 clients, 100k random
# keys) for INCR, RL.TAKE (allowed, allowed on a stored key, throttled,
# boxed, with ALSO),
# RL.WINDOW (sliding, exact, fixed), RL.LEASE ACQUIRE and the Lua baseline
# via EVALSHA. The workloads are interleaved (A B C A B C ...) over
# $RL_BENCH_ROUNDS rounds at pipeline 1 and 32, then again at pipeline 32
# with a replica attached. It also measures memory per key (used_memory
# delta over 200k keys, and MEMORY USAGE of a sample key).
#
# It prints a table of median throughput, the median of the per-round
# ratios to INCR (same server, same round, same pipeline), usec_per_call
# from INFO commandstats (reset before each run), the server's CPU time per
# call and its ratio to INCR's (from /proc), the server's CPU use during the
# run and the share of calls that took the intended path (from INFO rl),
# then the memory table and where the targets of issue 6 stand. The
# results of a run, with the machine and the date: bench/RESULTS.md.
# Absolute numbers depend on the machine and on what else runs on it: read
# the ratios.
#
# Environment (all optional):
#   RL_MODULE=path           use this module instead of building one
#   RL_BENCH_ROUNDS=3        rounds per configuration
#   RL_BENCH_SECS=1.5        target seconds per redis-benchmark run (1.5 keeps
#                            the whole run under 5 minutes on 2 cores)
#   RL_BENCH_PIPELINES="1 32"      pipelines without a replica
#   RL_BENCH_REPLICA_PIPELINES=32  pipelines with a replica ("" to skip)
#   RL_BENCH_KEYSPACE=100000       -r of redis-benchmark
#   RL_BENCH_MEM_KEYS=200000       keys per memory measurement
#   RL_BENCH_SCALE=1         also run RL.TAKE at 1k, 100k and 1M keys
#   RL_BENCH_ONLY="take lua"       run only these workloads (incr always runs):
#                            take take_live take_thr take_box take_also
#                            take_plain throttle
#                            win_s win_e win_f lease lua
#   RL_BENCH_OUT=file        also write the report there
#
# Needs redis-server, redis-cli and redis-benchmark (Debian redis-tools).

set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

ROUNDS=${RL_BENCH_ROUNDS:-3}
SECS=${RL_BENCH_SECS:-1.5}
PIPELINES=${RL_BENCH_PIPELINES:-"1 32"}
REPLICA_PIPELINES=${RL_BENCH_REPLICA_PIPELINES-32}
KEYSPACE=${RL_BENCH_KEYSPACE:-100000}
MEM_KEYS=${RL_BENCH_MEM_KEYS:-200000}
SCALE=${RL_BENCH_SCALE:-0}
ONLY=${RL_BENCH_ONLY:-}
OUT=${RL_BENCH_OUT:-}
CLIENTS=50
HOST=127.0.0.1

# Figures quoted in issue 6 (same kind of machine, Redis 7.0.15): redis-cell
# is not available here, so RL.TAKE is compared with these numbers.
CELL_RATIO_P32=0.34
CELL_USEC=1.9

for tool in redis-server redis-cli redis-benchmark; do
    command -v "$tool" >/dev/null || { echo "bench: $tool not found (make deps)" >&2; exit 1; }
done

T_START=$(date +%s)
log() { printf '[%4ds] %s\n' "$(( $(date +%s) - T_START ))" "$*" >&2; }

if [[ -z "${RL_MODULE:-}" ]]; then
    log "building the release module"
    cargo build --release --quiet
    MODULE="${CARGO_TARGET_DIR:-$ROOT/target}/release/librl.so"
else
    MODULE=$RL_MODULE
fi
[[ -f "$MODULE" ]] || { echo "bench: no module at $MODULE" >&2; exit 1; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/rl-bench.XXXXXX")
PIDS=()
cleanup() {
    local pid
    for pid in "${PIDS[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${PIDS[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

port_is_free() { ! (exec 3<>"/dev/tcp/$HOST/$1") 2>/dev/null; }

# start_server NAME [redis-server args...]: sets PORT_<NAME> and PID_<NAME>.
start_server() {
    local name=$1 port pid try
    shift
    mkdir -p "$WORK/$name"
    for try in 1 2 3 4 5 6 7 8; do
        port=$(( 20000 + RANDOM % 40000 ))
        port_is_free "$port" || continue
        redis-server --port "$port" --bind "$HOST" --dir "$WORK/$name" \
            --save "" --appendonly no --logfile "$WORK/$name/redis.log" \
            --loadmodule "$MODULE" "$@" &
        pid=$!
        PIDS+=("$pid")
        for _ in $(seq 1 100); do
            if redis-cli -h "$HOST" -p "$port" PING 2>/dev/null | grep -q PONG; then
                printf -v "PORT_$name" '%s' "$port"
                printf -v "PID_$name" '%s' "$pid"
                return 0
            fi
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.05
        done
        kill "$pid" 2>/dev/null || true
    done
    echo "bench: could not start redis-server ($name); log:" >&2
    cat "$WORK/$name/redis.log" >&2 || true
    exit 1
}

log "starting redis-server with $MODULE"
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
# as rl's own CL.THROTTLE (redis-cell's command and reply, 5 arguments).
add take_plain "RL.TAKE no STRIKES" rl.take take_allowed \
    "RL.TAKE rl:{kp:__rand_int__} 3000 3000 60"
add throttle "CL.THROTTLE (rl)" cl.throttle throttle_allowed \
    "CL.THROTTLE rl:{c:__rand_int__} 2999 3000 60"
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

if [[ -n "$ONLY" ]]; then
    kept=(incr)
    for w in "${WORKLOADS[@]}"; do
        [[ $w != incr && " $ONLY " == *" $w "* ]] && kept+=("$w")
    done
    WORKLOADS=("${kept[@]}")
fi
has() { [[ " ${WORKLOADS[*]} " == *" $1 "* ]]; }

# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------

# pipe_keys TEMPLATE COUNT REPEAT (bench/pipe_keys.sh).
source "$ROOT/bench/pipe_keys.sh"

info_field() { # info_field SECTION FIELD
    cli INFO "$1" | tr -d '\r' | awk -F: -v f="$2" '$1 == f { print $2 }'
}

cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$MASTER_PID/stat"; }
CLK_TCK=$(getconf CLK_TCK)
now_s() { date +%s.%N; }

# usec_per_call and failed calls of a command from INFO commandstats.
cmdstat() {
    cli INFO commandstats | tr -d '\r' | awk -v c="cmdstat_$1" -F'[:,=]' '
        $1 == c { for (i = 2; i < NF; i += 2) v[$i] = $(i + 1)
                  print v["usec_per_call"], v["calls"], v["failed_calls"] + v["rejected_calls"] }'
}

rl_counter() { # the INFO rl counter rl_NAME (0 if absent)
    local v
    v=$(info_field rl "rl_$1")
    echo "${v:-0}"
}

# run_bench WORKLOAD PIPELINE N: one redis-benchmark run. Prints
# "rps usec_per_call cpu_percent path_ok_percent cpu_usec_per_call".
run_bench() {
    local w=$1 pipe=$2 n=$3 ok_before calls_before t0 t1 c0 c1 rps stat usec calls failed
    local ok_after calls_after okp prefix
    # shellcheck disable=SC2206
    local cmd=(${CMD[$w]})
    prefix=${PATHOK[$w]%%_*}
    if [[ ${PATHOK[$w]} != - ]]; then
        ok_before=$(rl_counter "${PATHOK[$w]}")
        if [[ $prefix == lease ]]; then
            calls_before=$(( ok_before + $(rl_counter lease_denied) ))
        else
            calls_before=$(rl_counter "${prefix}_calls")
        fi
    fi
    cli CONFIG RESETSTAT >/dev/null
    c0=$(cpu_ticks)
    t0=$(now_s)
    rps=$(redis-benchmark -h "$HOST" -p "$PORT" -c "$CLIENTS" -P "$pipe" -n "$n" \
        -r "$KEYSPACE" --csv "${cmd[@]}" 2>/dev/null | awk -F'","' 'NR == 2 { print $2 }')
    t1=$(now_s)
    c1=$(cpu_ticks)
    [[ -n "$rps" ]] || { echo "bench: redis-benchmark failed for $w" >&2; exit 1; }
    read -r usec calls failed < <(cmdstat "${STAT[$w]}")
    if [[ "${failed:-0}" != 0 ]]; then
        echo "bench: $w: $failed of $calls calls failed:" >&2
        cli "${cmd[@]//__rand_int__/000000000001}" >&2
        exit 1
    fi
    okp=-
    if [[ ${PATHOK[$w]} != - ]]; then
        ok_after=$(rl_counter "${PATHOK[$w]}")
        if [[ $prefix == lease ]]; then
            calls_after=$(( ok_after + $(rl_counter lease_denied) ))
        else
            calls_after=$(rl_counter "${prefix}_calls")
        fi
        okp=$(awk -v a=$((ok_after - ok_before)) -v c=$((calls_after - calls_before)) \
            'BEGIN { printf "%.1f", (c > 0 ? 100 * a / c : 0) }')
    fi
    awk -v r="$rps" -v u="${usec:-0}" -v c=$((c1 - c0)) -v hz="$CLK_TCK" -v a="$t0" -v b="$t1" -v o="$okp" -v n="${calls:-0}" \
        'BEGIN { printf "%s %s %.0f %s %.3f\n", r, u, 100 * c / hz / (b - a), o, (n > 0 ? 1e6 * c / hz / n : 0) }'
}

RESULTS=$WORK/results.tsv   # phase pipeline round workload rps usec cpu ok cpu_us
: >"$RESULTS"

# Wait until the replica has applied everything the master sent.
wait_replica_caught_up() {
    local i master replica
    for i in $(seq 1 200); do
        master=$(info_field replication master_repl_offset)
        replica=$(cli INFO replication | tr -d '\r' | sed -n 's/^slave0:.*offset=\([0-9]*\).*/\1/p')
        [[ -n "$replica" && "$replica" == "$master" ]] && return 0
        sleep 0.05
    done
    log "warning: the replica is still behind ($replica < $master)"
}

# Run sizes (-n) of the last round, by "pipeline workload".
declare -A LAST_N

# run_phase PHASE PIPELINE: calibrate, then ROUNDS interleaved rounds. Each
# run's -n is sized from the previous run of the same workload.
run_phase() {
    local phase=$1 pipe=$2 w n r line rps cal
    declare -A N
    cal=$(( pipe == 1 ? 10000 : 30000 ))
    if [[ -n "${LAST_N[$pipe incr]:-}" ]]; then
        # Same pipeline measured before: scale those sizes by how INCR
        # compares now (one short run instead of one per workload).
        log "$phase, pipeline $pipe: calibrating (INCR only)"
        line=$(run_bench incr "$pipe" "$cal")
        if [[ $phase == replica ]]; then wait_replica_caught_up; fi
        rps=${line%% *}
        for w in "${WORKLOADS[@]}"; do
            N[$w]=$(awk -v r="$rps" -v s="$SECS" -v i="${LAST_N[$pipe incr]}" -v l="${LAST_N[$pipe $w]}" -v m="$cal" \
                'BEGIN { n = int(l * r * s / i); print (n < m ? m : n) }')
        done
    else
        log "$phase, pipeline $pipe: calibrating"
        for w in "${WORKLOADS[@]}"; do
            line=$(run_bench "$w" "$pipe" "$cal")
            rps=${line%% *}
            N[$w]=$(awk -v r="$rps" -v s="$SECS" -v m="$cal" 'BEGIN { n = int(r * s); print (n < m ? m : n) }')
            if [[ $phase == replica ]]; then wait_replica_caught_up; fi
        done
    fi
    for r in $(seq 1 "$ROUNDS"); do
        log "$phase, pipeline $pipe: round $r of $ROUNDS"
        for w in "${WORKLOADS[@]}"; do
            line=$(run_bench "$w" "$pipe" "${N[$w]}")
            echo "$phase $pipe $r $w $line" >>"$RESULTS"
            # Size the next round's run from this one (the calibration
            # runs are short and noisy).
            rps=${line%% *}
            N[$w]=$(awk -v r="$rps" -v s="$SECS" -v m="$cal" 'BEGIN { n = int(r * s); print (n < m ? m : n) }')
            if [[ $phase == replica ]]; then wait_replica_caught_up; fi
        done
    done
    for w in "${WORKLOADS[@]}"; do
        LAST_N[$pipe $w]=${N[$w]}
    done
}

# ---------------------------------------------------------------------------
# 1. Memory per key: FLUSHALL, create MEM_KEYS keys (or clients), delta.
# ---------------------------------------------------------------------------
MEMORY=$WORK/memory.tsv   # label keys_per_call bytes_per_key memory_usage_sample
: >"$MEMORY"
# measure LABEL SAMPLE_KEY REPEAT TEMPLATE...: each template is piped for
# every key number, REPEAT times in a row.
measure() {
    local label=$1 sample=$2 repeat=$3 before after keys t usage
    shift 3
    cli FLUSHALL >/dev/null
    before=$(info_field memory used_memory)
    for t in "$@"; do
        pipe_keys "$t" "$MEM_KEYS" "$repeat"
    done
    after=$(info_field memory used_memory)
    keys=$(cli DBSIZE)
    usage=$(cli MEMORY USAGE "${sample//\{I\}/000000000007}" SAMPLES 0)
    log "memory: $label"
    awk -v l="$label" -v b="$before" -v a="$after" -v k="$keys" -v n="$MEM_KEYS" -v u="$usage" \
        'BEGIN { printf "%s\t%.1f\t%.1f\t%s\n", l, k / n, (a - b) / k, u }' >>"$MEMORY"
}
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

for pipe in $PIPELINES; do
    run_phase plain "$pipe"
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
# 4. Report
# ---------------------------------------------------------------------------
report() {
    echo "rl system benchmark: $(date -u '+%Y-%m-%d %H:%M UTC'), Redis $REDIS_VERSION, $(nproc) cores,"
    echo "redis-benchmark -c $CLIENTS -r $KEYSPACE, ~${SECS}s per run, $ROUNDS interleaved rounds;"
    echo "module $MODULE"
    echo
    echo "Throughput: median of $ROUNDS runs; 'x INCR' is the median of the per-round ratios to INCR"
    echo "in the same configuration; usec/call from INFO commandstats (the command's own execution,"
    echo "without protocol and network); cpu us = redis-server's CPU time (user + system, from /proc)"
    echo "per call, everything included; 'cpu x' = INCR's cpu us / this one's: the server-side ratio,"
    echo "which redis-benchmark's own limit does not cap (one redis-benchmark thread cannot saturate"
    echo "the server with INCR at pipeline 32 here); cpu% = redis-server's CPU use during the run"
    echo "(100 = one core); path = share of calls with the intended outcome (INFO rl)."
    echo
    # Per round ratio to INCR, then medians.
    awk -v order="${WORKLOADS[*]}" -v labels="$(for w in "${WORKLOADS[@]}"; do printf '%s=%s;' "$w" "${LABEL[$w]}"; done)" '
        function median(list,    n, a, i, j, t) {
            n = split(list, a, " ")
            for (i = 2; i <= n; i++) { t = a[i]; j = i - 1
                while (j > 0 && a[j] + 0 > t + 0) { a[j + 1] = a[j]; j-- } a[j + 1] = t }
            return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
        }
        { key = $1 " " $2 " " $4; rps[key] = rps[key] " " $5; usec[key] = usec[key] " " $6; cus[key] = cus[key] " " $9
          cpu[key] = cpu[key] " " $7; ok[key] = ok[key] " " $8; r[$1 " " $2 " " $3 " " $4] = $5
          if (!($1 " " $2 in seen)) { seen[$1 " " $2] = 1; confs[++nc] = $1 " " $2 }
          if ($3 > rounds) rounds = $3 }
        END {
            nw = split(order, ws, " ")
            nl = split(labels, lp, ";")
            for (i = 1; i <= nl; i++) { split(lp[i], kv, "="); label[kv[1]] = kv[2] }
            printf "%-8s %-20s %3s %9s %7s %10s %7s %6s %5s %6s\n", "replica", "command", "P", "req/s", "x INCR", "usec/call", "cpu us", "cpu x", "cpu%", "path%"
            for (c = 1; c <= nc; c++) {
                split(confs[c], cp, " ")
                for (i = 1; i <= nw; i++) {
                    w = ws[i]; key = confs[c] " " w
                    if (!(key in rps)) continue
                    ratios = ""
                    for (k = 1; k <= rounds; k++) {
                        base = r[confs[c] " " k " incr"]; v = r[confs[c] " " k " " w]
                        if (base > 0 && v != "") ratios = ratios " " v / base
                    }
                    okm = (ok[key] ~ /-/) ? "-" : sprintf("%.1f", median(ok[key]))
                    cu = median(cus[key]); ci = median(cus[confs[c] " incr"])
                    printf "%-8s %-20s %3s %9.0f %7.2f %10.2f %7.2f %6.2f %5.0f %6s\n",
                        (cp[1] == "replica" ? "yes" : "no"), label[w], cp[2], median(rps[key]),
                        median(ratios), median(usec[key]), cu, (cu > 0 ? ci / cu : 0), median(cpu[key]), okm
                    med[key] = median(ratios); medu[key] = median(usec[key])
                    print confs[c], w, median(ratios), median(usec[key]), (cu > 0 ? ci / cu : 0) > "'"$WORK/medians.txt"'"
                }
            }
        }' "$RESULTS"
    echo
    echo "Memory: used_memory delta over $MEM_KEYS calls (FLUSHALL before each), per key created;"
    echo "MEMORY USAGE (SAMPLES 0) of one key."
    echo
    awk -F'\t' '
        BEGIN { printf "%-34s %10s %10s %13s\n", "keys created by", "keys/call", "bytes/key", "MEMORY USAGE" }
        { printf "%-34s %10s %10s %13s\n", $1, $2, $3, $4 }' "$MEMORY"
    if [[ -s "$SCALE_RESULTS" ]]; then
        echo
        echo "By number of keys (all stored, one key prefix per size), pipeline 32, median of $ROUNDS"
        echo "runs: RL.TAKE allowed on stored drained buckets, and INCR on stored strings:"
        awk '{ k = $1 " " $3; v[k] = v[k] " " $4; u[k] = u[k] " " $5; if (!($1 in s)) { s[$1] = 1; o[++n] = $1 } }
            function median(list,    m, a, i, j, t) {
                m = split(list, a, " ")
                for (i = 2; i <= m; i++) { t = a[i]; j = i - 1
                    while (j > 0 && a[j] + 0 > t + 0) { a[j + 1] = a[j]; j-- } a[j + 1] = t }
                return m % 2 ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2 }
            END { printf "%10s %12s %10s %10s %12s %10s\n", "keys", "RL.TAKE/s", "usec/call", "vs first", "INCR/s", "vs first"
                  for (i = 1; i <= n; i++) { m = median(v[o[i] " s"]); mi = median(v[o[i] " i"])
                      if (i == 1) { b = m; bi = mi }
                      printf "%10s %12.0f %10.2f %10.2f %12.0f %10.2f\n", o[i], m, median(u[o[i] " s"]), m / b, mi, mi / bi
                      if (m / b < worst || i == 1) worst = m / b }
                  printf "  %-7s  RL.TAKE throughput within 15%% from %s to %s keys: %.2f of the first\n",
                      (worst >= 0.85 ? "met" : "NOT met"), o[1], o[n], worst }' "$SCALE_RESULTS"
    fi
    echo
    echo "Targets of issue 6 (redis-cell is not installed here: its figures are the issue's,"
    echo "CL.THROTTLE at ${CELL_RATIO_P32}x INCR at pipeline 32 and ${CELL_USEC} usec/call):"
    awk -v cell="$CELL_RATIO_P32" -v cellu="$CELL_USEC" -v memfile="$MEMORY" '
        { m[$1 " " $2 " " $3] = $4; u[$1 " " $2 " " $3] = $5; cx[$1 " " $2 " " $3] = $6 }
        function fig(k) { return sprintf("%.2fx (server CPU per call: %.2fx)", m[k], cx[k]) }
        function verdict(ok) { return ok ? "met" : "NOT met" }
        function line(text, ok) { printf "  %-7s  %s\n", verdict(ok), text }
        END {
            while ((getline l < memfile) > 0) { split(l, f, "\t"); mem[f[1]] = f[3]; mu[f[1]] = f[4] }
            for (conf_i = 1; conf_i <= 2; conf_i++) {
                conf = conf_i == 1 ? "plain 32" : "replica 32"
                if (!((conf " take") in m)) continue
                t = m[conf " take"]
                print "  " (conf_i == 1 ? "pipeline 32, no replica:" : "pipeline 32, with a replica:")
                line("RL.TAKE allowed >= 0.8x INCR: " fig(conf " take"), t >= 0.8)
                line(sprintf("RL.TAKE allowed >= 2x CL.THROTTLE (%.2fx INCR): %.2fx", cell, t / cell), t / cell >= 2)
                if ((conf " take_plain") in m)
                    line(sprintf("CL.THROTTLE-equivalent work (RL.TAKE without STRIKES) >= 2x CL.THROTTLE: %.2fx", m[conf " take_plain"] / cell), m[conf " take_plain"] / cell >= 2)
                if ((conf " throttle") in m)
                    line(sprintf("rl CL.THROTTLE >= 2x redis-cell CL.THROTTLE: %.2fx", m[conf " throttle"] / cell), m[conf " throttle"] / cell >= 2)
                printf "           (usec/call: RL.TAKE %.2f, INCR %.2f here; the issue: CL.THROTTLE %.1f, INCR 0.5)\n",
                    u[conf " take"], u[conf " incr"], cellu
                if ((conf " lua") in m)
                    line(sprintf("RL.TAKE allowed >= 6x Lua: %.2fx (Lua %s; server CPU: %.2fx)", t / m[conf " lua"], fig(conf " lua"), cx[conf " take"] / cx[conf " lua"]), t / m[conf " lua"] >= 6)
                if ((conf " take_live") in m)
                    line("(same, on a stored key: no expiry churn) >= 0.8x INCR: " fig(conf " take_live"), m[conf " take_live"] >= 0.8)
                if ((conf " take_also") in m)
                    line("RL.TAKE +ALSO >= 0.6x INCR: " fig(conf " take_also"), m[conf " take_also"] >= 0.6)
                if ((conf " take_thr") in m)
                    line(sprintf("throttled no slower than allowed: %.2fx vs %.2fx", m[conf " take_thr"], t), m[conf " take_thr"] >= 0.95 * t)
                if ((conf " take_box") in m)
                    line(sprintf("boxed no slower than allowed: %.2fx vs %.2fx", m[conf " take_box"], t), m[conf " take_box"] >= 0.95 * t)
                split("win_s win_e win_f lease", ws, " ")
                split("RL.WINDOW sliding|RL.WINDOW EXACT|RL.WINDOW FIXED|RL.LEASE ACQUIRE", names, "|")
                for (i = 1; i <= 4; i++) if ((conf " " ws[i]) in m)
                    line(names[i] " >= 0.6x INCR: " fig(conf " " ws[i]), m[conf " " ws[i]] >= 0.6)
            }
            print "  memory:"
            b = mem["RL.TAKE bucket"]; x = mem["RL.TAKE bucket+strikes+box"]
            line(sprintf("bucket key with TTL <= 130 bytes: %.0f (MEMORY USAGE %s)", b, mu["RL.TAKE bucket"]), b <= 130)
            line(sprintf("bucket+strikes+active box <= 160 bytes: %.0f (MEMORY USAGE %s)", x, mu["RL.TAKE bucket+strikes+box"]), x <= 160)
            print "  (thresholds: throttled/boxed count as no slower at >= 95% of the allowed ratio, for noise)"
        }' "$WORK/medians.txt"
}

if [[ -n "$OUT" ]]; then
    report | tee "$OUT"
else
    report
fi
log "done"
