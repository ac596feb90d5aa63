# Sourced by bench/run.sh and bench/gateway.sh: the log, the module,
# stopping what they started, starting servers, reading INFO, one
# redis-benchmark run, the interleaved rounds of a configuration and one
# memory measurement. They use run.sh's globals: HOST, WORK, MODULE,
# PEER_ARGS, PIDS, PORT (the master's, through `cli`), MASTER_PID,
# CLIENTS, KEYSPACE, SECS, ROUNDS, MEM_KEYS, WORKLOADS, CMD, STAT, PATHOK,
# RESULTS and MEMORY, and its `log` and `cli` functions.

T_START=$(date +%s)
log() { printf '[%4ds] %s\n' "$(( $(date +%s) - T_START ))" "$*" >&2; }

# use_module: MODULE is $RL_MODULE, else the release module, built now.
use_module() {
    if [[ -z "${RL_MODULE:-}" ]]; then
        log "building the release module"
        cargo build --release --quiet
        MODULE="${CARGO_TARGET_DIR:-$ROOT/target}/release/librl.so"
    else
        MODULE=$RL_MODULE
    fi
    [[ -f "$MODULE" ]] || { echo "bench: no module at $MODULE" >&2; exit 1; }
}

# stop_pids: TERM to every process of PIDS, then wait for each.
stop_pids() {
    local pid
    for pid in "${PIDS[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${PIDS[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
}

port_is_free() { ! (exec 3<>"/dev/tcp/$HOST/$1") 2>/dev/null; }

# random_port: a port to try, 20000-32767: below Linux's ephemeral range
# (32768-60999 by default), where the outgoing connections of wrk, the
# clients and the servers take their local ports, so that no connection
# takes a chosen port between its check and its bind.
random_port() { echo $(( 20000 + RANDOM % 12768 )); }

# start_server NAME [redis-server args...]: a redis-server with rl and the
# peers (PEER_ARGS) on a free port; sets PORT_<NAME> and PID_<NAME>.
start_server() {
    local name=$1 port pid try
    shift
    mkdir -p "$WORK/$name"
    for try in 1 2 3 4 5 6 7 8; do
        port=$(random_port)
        port_is_free "$port" || continue
        redis-server --port "$port" --bind "$HOST" --dir "$WORK/$name" \
            --save "" --appendonly no --logfile "$WORK/$name/redis.log" \
            --loadmodule "$MODULE" "${PEER_ARGS[@]}" "$@" &
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

info_field() { # info_field SECTION FIELD
    cli INFO "$1" | tr -d '\r' | awk -F: -v f="$2" '$1 == f { print $2 }'
}

# The master's main thread's CPU time in ns (/proc/PID/schedstat: exact,
# where /proc/PID/stat counts 10 ms ticks). Commands run on that thread.
cpu_ns() { awk '{ print $1 }' "/proc/$MASTER_PID/schedstat"; }
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

# path_calls PREFIX: the calls INFO rl has counted for a command (leases
# count granted and denied acquires, the others PREFIX_calls).
path_calls() {
    if [[ $1 == lease ]]; then
        echo $(( $(rl_counter lease_granted) + $(rl_counter lease_denied) ))
    else
        rl_counter "$1_calls"
    fi
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
        calls_before=$(path_calls "$prefix")
    fi
    cli CONFIG RESETSTAT >/dev/null
    c0=$(cpu_ns)
    t0=$(now_s)
    rps=$(redis-benchmark -h "$HOST" -p "$PORT" -c "$CLIENTS" -P "$pipe" -n "$n" \
        -r "$KEYSPACE" --csv "${cmd[@]}" 2>/dev/null | awk -F'","' 'NR == 2 { print $2 }')
    t1=$(now_s)
    c1=$(cpu_ns)
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
        calls_after=$(path_calls "$prefix")
        okp=$(awk -v a=$((ok_after - ok_before)) -v c=$((calls_after - calls_before)) \
            'BEGIN { printf "%.1f", (c > 0 ? 100 * a / c : 0) }')
    fi
    awk -v r="$rps" -v u="${usec:-0}" -v c=$((c1 - c0)) -v a="$t0" -v b="$t1" -v o="$okp" -v n="${calls:-0}" \
        'BEGIN { printf "%s %s %.0f %s %.3f\n", r, u, 100 * c / 1e9 / (b - a), o, (n > 0 ? c / 1e3 / n : 0) }'
}


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

# head_to_head PHASE PIPELINE A B COUNT: COUNT pairs of runs of A and B
# back to back (A B, then B A, ...: a drift in the load favours neither),
# sized like their last runs in run_phase. Appends "phase pipeline k A B
# rps_A rps_B cpu_us_A cpu_us_B" to HEAD_TO_HEAD.
head_to_head() {
    local phase=$1 pipe=$2 a=$3 b=$4 count=$5 k la lb fa fb
    log "$phase, pipeline $pipe: $a and $b head to head, $count pairs"
    for k in $(seq 1 "$count"); do
        if (( k % 2 )); then
            la=$(run_bench "$a" "$pipe" "${LAST_N[$pipe $a]}")
            lb=$(run_bench "$b" "$pipe" "${LAST_N[$pipe $b]}")
        else
            lb=$(run_bench "$b" "$pipe" "${LAST_N[$pipe $b]}")
            la=$(run_bench "$a" "$pipe" "${LAST_N[$pipe $a]}")
        fi
        if [[ $phase == replica ]]; then wait_replica_caught_up; fi
        read -r -a fa <<<"$la"
        read -r -a fb <<<"$lb"
        echo "$phase $pipe $k $a $b ${fa[0]} ${fb[0]} ${fa[4]} ${fb[4]}" >>"$HEAD_TO_HEAD"
    done
}

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
