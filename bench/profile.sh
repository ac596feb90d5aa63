#!/usr/bin/env bash
# bench/profile.sh: count the instructions and heap allocations of
# workloads inside redis-server, with valgrind's callgrind (exact and
# repeatable on a noisy machine, unlike wall-clock timings), rl's and its
# peers' side by side in one server.
#
#   bash bench/profile.sh [WORKLOAD|all|targets]... [CALLS]
#   make bench-profile WORKLOAD="take throttle"
#
# rl's workloads (default: take):
#   take       RL.TAKE k 3000 3000 60 COST 1 STRIKES 20 60 BOX 300 3600 86400
#              on random keys (each call finds its bucket gone: created anew)
#   take_live  the same call on a stored, drained bucket (updated in place)
#   take_also  take with one ALSO bucket (a stored tenant bucket)
#   take_plain RL.TAKE k 3000 3000 60 COST 1 (no STRIKES: the work of
#              CL.THROTTLE)
#   take_debt, take_partial, take_reserve
#              take_plain with DEBT, PARTIAL, RESERVE 0 20 (compare with
#              take_plain)
#   take_refund, take_charge_live
#              REFUND 1 / COST 1 on stored, half-spent buckets
#   throttle   CL.THROTTLE k 2999 3000 60 1 (rl's redis-cell command)
#   window     RL.WINDOW k 3000 60 COST 1 (sliding) on stored windows
#   lease      RL.LEASE ACQUIRE k 1000 1 on random keys
#   distinct   RL.DISTINCT k member 100 3600 on stored keys, random members
#              (compare with window)
#   quota      RL.QUOTA k 1000000000 MONTH COST 1 on stored quota keys
#   quota_region
#              the same call with REGION (rl.region eu of eu,us,ap) on stored
#              regional keys holding all three regions' components (the
#              other two merged in): the cost of the region option against
#              quota (target: at most 1.1x)
#   incr       INCR on random keys
#   lua        the Lua baseline (bench/baseline.lua) via EVALSHA
# The peers (bench/peers.sh builds them into target/peers/):
#   cell            redis-cell's CELL.THROTTLE k 2999 3000 60 1
#   floor_take      FLOOR.TAKE with take's arguments, every key created
#   floor_live      the same on stored keys (take_live's peer)
#   floor_plain     FLOOR.TAKE k 3000 3000 60 COST 1, every key created
#   floor_throttle  FLOOR.TAKE k 2999 3000 60 1, every key created
#   floor_window    FLOOR.TAKE k 3000 60 COST 1 on stored keys
#   floor_lease     FLOOR.TAKE k ACQUIRE 1000 1
# Each rl workload named brings its peers along (take: floor_take;
# throttle: floor_throttle and cell; ...), so that its ratios come from
# this run; RL_PROFILE_PEERS=0 leaves them out. `targets` is every
# workload with a target and its peers, `all` every workload.
#
# One redis-server (rl, the floor and redis-cell loaded) runs under
# callgrind on a free 127.0.0.1 port. For each workload: FLUSHALL, the keys
# prepared, 2000 warm-up calls, counters zeroed, CALLS calls (default
# 20000) with redis-benchmark (1 client, pipeline 32, 10000 random keys, or
# 1000000 for a floor whose rl counterpart creates its key on every call:
# the floor's keys live 60 s, rl's expire once full, 20 ms after such a
# call), counters dumped. For each it prints:
#   - instructions per call, for the whole server and inside the command;
#   - keys created per call (DBSIZE + expired_keys deltas: a pair compares
#     like with like when both create, or both update, their keys);
#   - the top functions by instructions (self), per call;
#   - calls per command call of the allocator (RM_Alloc/RM_Free: the
#     module's own heap allocations; zmalloc & co: every allocation of the
#     server, Redis' own included) and of a few module API functions.
#   - the instructions spent deleting expired keys (rl's create-path keys
#     expire 20 ms after the call, inside the run; the floor's live 60 s).
# Then a summary table, `RATIO instr.a/b x` lines (server instructions per
# call of a over b, less the deletion of expired keys: every key created
# is deleted some day, the floor's after the run; the ratio as measured is
# printed beside it) and `TARGET` lines for the instruction targets below,
# from the same figures.
# The callgrind output is kept in target/profile/callgrind.WORKLOAD.out.
#
# RL_MODULE=path uses that module instead of building the release one;
# RL_SHARED=dir: where the peers' sources are (bench/peers.sh).

set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

# The instruction targets: rl's server instructions per call at most this
# many times the floor's with the same arguments, measured in this run.
declare -A TARGET=(
    [quota_region/quota]=1.1
    [take/floor_take]=1.2
    [throttle/floor_throttle]=1.2
    [window/floor_window]=1.3
    [lease/floor_lease]=1.3
)
# Ratios printed besides (no target).
RATIOS="take/floor_take take_live/floor_live take_plain/floor_plain throttle/floor_throttle
throttle/cell cell/floor_throttle window/floor_window lease/floor_lease take/lua take/incr
quota_region/quota"
declare -A PEERS=(
    [take]=floor_take [take_live]=floor_live [take_plain]=floor_plain
    [throttle]="floor_throttle cell" [window]=floor_window [lease]=floor_lease
    [quota_region]=quota
)
ALL="incr lua take take_live take_also take_plain throttle window lease quota quota_region cell floor_take floor_live floor_plain floor_throttle floor_window floor_lease"
TARGETED="take floor_take throttle floor_throttle cell window floor_window lease floor_lease"

CALLS=20000
KEYS=10000
WARMUP=2000
PIPELINE=32
HOST=127.0.0.1
P="STRIKES 20 60 BOX 300 3600 86400"

RUN=()
add_run() { [[ " ${RUN[*]} " == *" $1 "* ]] || RUN+=("$1"); }
for arg in "${@:-take}"; do
    case $arg in
    all) for w in $ALL; do add_run "$w"; done ;;
    targets) for w in $TARGETED; do add_run "$w"; done ;;
    *[!0-9]*) add_run "$arg"
        if [[ ${RL_PROFILE_PEERS:-1} != 0 ]]; then
            for w in ${PEERS[$arg]:-}; do add_run "$w"; done
        fi ;;
    *) CALLS=$arg ;;
    esac
done

for tool in valgrind callgrind_annotate callgrind_control redis-server redis-cli redis-benchmark; do
    command -v "$tool" >/dev/null || { echo "profile: $tool not found" >&2; exit 1; }
done

log() { echo "profile: $*" >&2; }
if [[ -z "${RL_MODULE:-}" ]]; then
    cargo build --release --quiet
    MODULE="${CARGO_TARGET_DIR:-$ROOT/target}/release/librl.so"
else
    MODULE=$RL_MODULE
fi
OUTDIR=${CARGO_TARGET_DIR:-$ROOT/target}/profile
mkdir -p "$OUTDIR"

source "$ROOT/bench/peers.sh"
build_peers
kept=()
for w in "${RUN[@]}"; do
    if [[ ( $w == floor_* && -z "$FLOOR_SO" ) || ( $w == cell && -z "$CELL_SO" ) ]]; then
        log "NOTE: $w left out: its module was not built (see above)"
    else
        kept+=("$w")
    fi
done
RUN=("${kept[@]}")

WORK=$(mktemp -d "${TMPDIR:-/tmp}/rl-profile.XXXXXX")
PID=
cleanup() {
    if [[ -n "$PID" ]]; then
        kill "$PID" 2>/dev/null || true
        wait "$PID" 2>/dev/null || true
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

OUT="$OUTDIR/callgrind.run.out"
rm -f "$OUT" "$OUT".*
# Start redis-server under callgrind on a free port (another one if the
# port was taken meanwhile).
PORT=
for _ in 1 2 3 4 5 6 7 8; do
    # below the ephemeral range (see random_port in bench/lib.sh)
    p=$(( 20000 + RANDOM % 12768 ))
    (exec 3<>"/dev/tcp/$HOST/$p") 2>/dev/null && continue
    valgrind --tool=callgrind --dump-instr=no --callgrind-out-file="$OUT" \
        redis-server --port "$p" --bind "$HOST" --dir "$WORK" --save "" --appendonly no \
        --loadmodule "$MODULE" "${PEER_ARGS[@]}" >"$WORK/valgrind.log" 2>&1 &
    PID=$!
    for _ in $(seq 1 600); do
        if redis-cli -h "$HOST" -p "$p" PING 2>/dev/null | grep -q PONG; then PORT=$p; break; fi
        kill -0 "$PID" 2>/dev/null || break
        sleep 0.1
    done
    [[ -n "$PORT" ]] && break
    kill "$PID" 2>/dev/null || true
    wait "$PID" 2>/dev/null || true
    PID=
done
[[ -n "$PORT" ]] || { echo "profile: could not start redis-server:" >&2; cat "$WORK/valgrind.log" >&2; exit 1; }
cli() { redis-cli -h "$HOST" -p "$PORT" "$@"; }

# pipe_keys TEMPLATE COUNT REPEAT (bench/pipe_keys.sh).
source "$ROOT/bench/pipe_keys.sh"
SHA=$(cli SCRIPT LOAD "$(cat "$ROOT/bench/baseline.lua")")

# stored PREPARE COMMAND: all KEYS keys made by PREPARE (pipe_keys) first,
# so that every call of COMMAND finds its key stored.
stored() {
    RANGE=$KEYS
    pipe_keys "$1" "$KEYS" 1
    CMD=$2
}

# workload NAME: sets CMD, STAT (its INFO commandstats name), SO (the
# module whose own code it runs), RANGE (-r) and prepares its keys.
workload() {
    STAT=rl.take SO=$MODULE RANGE=$KEYS
    case $1 in
    take) CMD="RL.TAKE rl:{k:__rand_int__} 3000 3000 60 COST 1 $P" ;;
    take_live) stored "RL.TAKE rl:{kl:{I}} 3000 3000 3600 COST 2000 $P" \
        "RL.TAKE rl:{kl:__rand_int__} 3000 3000 3600 COST 1 $P" ;;
    take_also)
        pipe_keys "RL.TAKE rl:{t:{I}}:tenant 100000 100000 3600 COST 50000" "$KEYS" 1
        CMD="RL.TAKE rl:{ka:__rand_int__} 3000 3000 60 COST 1 ALSO rl:{t:__rand_int__}:tenant 100000 100000 3600 $P" ;;
    take_plain) CMD="RL.TAKE rl:{kp:__rand_int__} 3000 3000 60 COST 1" ;;
    take_debt) CMD="RL.TAKE rl:{kd:__rand_int__} 3000 3000 60 COST 1 DEBT" ;;
    take_partial) CMD="RL.TAKE rl:{kpa:__rand_int__} 3000 3000 60 COST 1 PARTIAL" ;;
    take_reserve) CMD="RL.TAKE rl:{kr:__rand_int__} 3000 3000 60 COST 1 RESERVE 0 20" ;;
    take_refund) stored "RL.TAKE rl:{kf:{I}} 3000 3000 3600 COST 2000" \
        "RL.TAKE rl:{kf:__rand_int__} 3000 3000 3600 REFUND 1" ;;
    take_charge_live) stored "RL.TAKE rl:{kc:{I}} 3000 3000 3600 COST 2000" \
        "RL.TAKE rl:{kc:__rand_int__} 3000 3000 3600 COST 1" ;;
    throttle) CMD="CL.THROTTLE rl:{c:__rand_int__} 2999 3000 60 1"; STAT=cl.throttle ;;
    window) stored "RL.WINDOW rl:{ws:{I}} 3000 60 COST 1" "RL.WINDOW rl:{ws:__rand_int__} 3000 60 COST 1"
        STAT=rl.window ;;
    lease) CMD="RL.LEASE ACQUIRE rl:{l:__rand_int__} 1000 1"; STAT="rl.lease|acquire" ;;
    quota) stored "RL.QUOTA rl:{qs:{I}} 1000000000 MONTH COST 1" \
        "RL.QUOTA rl:{qs:__rand_int__} 1000000000 MONTH COST 1"; STAT=rl.quota ;;
    quota_region)
        cli CONFIG SET rl.regions eu,us,ap >/dev/null
        cli CONFIG SET rl.region eu >/dev/null
        stored "RL.QUOTA rl:{qr:{I}} 1000000000 MONTH COST 1 REGION" \
            "RL.QUOTA rl:{qr:__rand_int__} 1000000000 MONTH COST 1 REGION"
        # the period end the keys count on, then the other regions' parts
        end=$(cli RL.REGION READ "rl:{qr:000000000000}" | head -1)
        pipe_keys "RL.REGION MERGE rl:{qr:{I}} MONTH $end us 1000 10 ap 2000 20" "$KEYS" 1
        STAT=rl.quota ;;
    distinct) stored "RL.DISTINCT rl:{ds:{I}} seed 100 3600" \
        "RL.DISTINCT rl:{ds:__rand_int__} m:__rand_int__ 100 3600"; STAT=rl.distinct ;;
    incr) CMD="INCR bench:n:__rand_int__"; STAT=incr SO=- ;;
    lua)
        CMD="EVALSHA $SHA 4 lua:{__rand_int__}:b lua:{__rand_int__}:x lua:{__rand_int__}:s lua:{__rand_int__}:o 3000 3000 60 1 20 60 300 3600 86400 86400"
        STAT=evalsha SO=- ;;
    cell) CMD="CELL.THROTTLE cl:{c:__rand_int__} 2999 3000 60 1"; STAT=cell.throttle SO=$CELL_SO ;;
    floor_*)
        STAT=floor.take SO=$FLOOR_SO RANGE=1000000
        case $1 in
        floor_take) CMD="FLOOR.TAKE fl:{k:__rand_int__} 3000 3000 60 COST 1 $P" ;;
        floor_live) stored "FLOOR.TAKE fl:{kl:{I}} 3000 3000 3600 COST 2000 $P" \
            "FLOOR.TAKE fl:{kl:__rand_int__} 3000 3000 3600 COST 1 $P" ;;
        floor_plain) CMD="FLOOR.TAKE fl:{kp:__rand_int__} 3000 3000 60 COST 1" ;;
        floor_throttle) CMD="FLOOR.TAKE fl:{c:__rand_int__} 2999 3000 60 1" ;;
        floor_window) stored "FLOOR.TAKE fl:{ws:{I}} 3000 60 COST 1" "FLOOR.TAKE fl:{ws:__rand_int__} 3000 60 COST 1" ;;
        floor_lease) CMD="FLOOR.TAKE fl:{l:__rand_int__} ACQUIRE 1000 1" ;;
        *) echo "profile: unknown workload $1" >&2; exit 2 ;;
        esac ;;
    *) echo "profile: unknown workload $1" >&2; exit 2 ;;
    esac
}

info_field() { cli INFO "$1" | tr -d '\r' | awk -F: -v f="$2" '$1 == f { print $2 }'; }
SUMMARY=$WORK/summary.tsv   # workload calls total call() module_self created expired_deletion (per call)
: >"$SUMMARY"

# Parse the callgrind output (name-compressed format: "fn=(id) name" the
# first time, "fn=(id)" after): self cost per function and the object it
# lives in, the cost of each call edge (inclusive cost of the callee) and
# call counts.
parse_dump() {
    local dump=$1 calls=$2 so=$3 name=$4 created=$5
    rm -f "$WORK/self.tsv" "$WORK/api.tsv" "$WORK/allocs.tsv"
    touch "$WORK/api.tsv" "$WORK/allocs.tsv"
    awk -v n="$calls" -v module="$( [[ $so == - ]] && echo - || basename "$so")" -v out="$WORK" \
        -v name="$name" -v created="$created" -v summary="$SUMMARY" '
        function resolve(s, table,    id, rest) {
            if (match(s, /^\([0-9]+\)/)) {
                id = substr(s, 1, RLENGTH); rest = substr(s, RLENGTH + 2)
                if (rest != "") table[id] = rest
                return table[id]
            }
            return s
        }
        /^ob=/ { s = $0; sub(/^ob=/, "", s); ob = resolve(s, objs); next }
        /^cob=/ { s = $0; sub(/^cob=/, "", s); resolve(s, objs); next }
        /^fn=/ { s = $0; sub(/^fn=/, "", s); fn = resolve(s, fns); obj[fn] = ob; next }
        /^cfn=/ { s = $0; sub(/^cfn=/, "", s); cfn = resolve(s, fns); next }
        /^calls=/ {
            split($0, a, /[= ]/); ncalls[cfn] += a[2]; incall = 1
            if (cfn ~ /RedisAlloc as core::alloc::global::GlobalAlloc>::alloc$|__rust_alloc$|__rust_alloc_zeroed$|__rust_realloc$/)
                allocs[fn] += a[2]
            next }
        /^[0-9+*-]/ {
            c = $NF
            if (incall) { edge[fn] += c; incall = 0 } else { self[fn] += c; total += c }
            next
        }
        END {
            printf "server total: %.0f instructions per call\n", total / n
            for (f in self) if ((module != "-" && index(obj[f], module))) inmod += self[f]
            if (module != "-")
                printf "in %s (self, all its functions): %.0f instructions per call (%.1f%%)\n", module, inmod / n, 100 * inmod / total
            printf "keys created per call: %.2f\n", created
            d = "deleteExpiredKeyAndPropagate"; del = (d in self) ? (self[d] + edge[d]) / n : 0
            printf "deleting expired keys (%s, inclusive): %.0f instructions per call\n", d, del
            printf "%s\t%d\t%.0f\t%.0f\t%.0f\t%.2f\t%.0f\n", name, n, total / n, ("call" in self ? (self["call"] + edge["call"]) / n : 0),
                inmod / n, created, del >> summary
        split("processInputBuffer processCommand call RedisModuleCommandDispatcher", top, " ")
            for (i = 1; i in top; i++) if (top[i] in self)
                printf "inclusive %-28s %8.0f per call\n", top[i], (self[top[i]] + edge[top[i]]) / n
            for (f in self) if (f ~ /^rl::adapter::commands::[a-z_]*_entry$|^incrCommand$|^evalShaCommand$/ && ncalls[f] > 0)
                printf "inclusive %-28s %8.0f per call (%.2f calls per call)\n", f, (self[f] + edge[f]) / n, ncalls[f] / n
            print ""
            for (f in self) printf "%.1f\t%s\t%s\n", self[f] / n, ((module != "-" && index(obj[f], module)) ? "*" : " "), f > (out "/self.tsv")
            close(out "/self.tsv")
            if (module != "-") print "top functions in the module by instructions (self), per call:"
            if (module != "-") system("grep -F \"\t*\t\" " out "/self.tsv | sort -t \"\t\" -k1,1 -g -r | head -25 | awk -F \"\t\" '"'"'{ printf \"%10s  %s\\n\", $1, $3 }'"'"'")
            print ""
            print "top functions of the whole server by instructions (self), per call (* = in the module):"
            system("sort -t \"\t\" -k1,1 -g -r " out "/self.tsv | head -30 | awk -F \"\t\" '"'"'{ printf \"%10s %s %s\\n\", $1, $2, $3 }'"'"'")
            print ""
            print "Redis module API functions, inclusive instructions per call (calls per call):"
            for (f in self) if (f ~ /^RM_/ && ncalls[f] > 0)
                printf "%.1f\t%.2f\t%s\n", (self[f] + edge[f]) / n, ncalls[f] / n, f > (out "/api.tsv")
            close(out "/api.tsv")
            system("sort -t \"\t\" -k1,1 -g -r " out "/api.tsv | head -20 | awk -F \"\t\" '"'"'{ printf \"%10s  (%5s)  %s\\n\", $1, $2, $3 }'"'"'")
            print ""
            print "module heap allocations per call, by the function that allocates:"
            for (f in allocs) if (f !~ /__rust_(alloc|alloc_zeroed|realloc)$/)
                printf "%.2f\t%s\n", allocs[f] / n, f > (out "/allocs.tsv")
            close(out "/allocs.tsv")
            system("touch " out "/allocs.tsv; sort -t \"\t\" -k1,1 -g -r " out "/allocs.tsv | head -15 | awk -F \"\t\" '"'"'{ printf \"%10s  %s\\n\", $1, $2 }'"'"'")
            print ""
            print "calls per command call (module heap: RM_Alloc/RM_Free; server heap: malloc/free"
            print "(jemalloc, reached through zmalloc & co), which count Redis own allocations too):"
            split("RM_Alloc RM_Calloc RM_Realloc RM_Free malloc calloc realloc free zmalloc ztrymalloc_usable zcalloc zrealloc zfree RM_OpenKey RM_CloseKey RM_Replicate RM_ModuleTypeSetValue RM_ModuleTypeGetValue RM_SetExpire RM_SetAbsExpire RM_SignalModifiedKey RM_ReplyWithArray RM_ReplyWithLongLong RM_Milliseconds RM_StringPtrLen", want, " ")
            for (i = 1; i in want; i++) if (ncalls[want[i]] > 0) printf "%10.2f  %s\n", ncalls[want[i]] / n, want[i]
        }' "$dump"
}


# The workloads, one after the other in the same server.
for w in "${RUN[@]}"; do
    cli FLUSHALL >/dev/null
    workload "$w"
    # shellcheck disable=SC2086
    bench() { redis-benchmark -h "$HOST" -p "$PORT" -c 1 -P "$PIPELINE" -r "$RANGE" -n "$1" -q $CMD >/dev/null; }
    log "$w: $CMD"
    bench "$WARMUP"
    callgrind_control -z "$PID" >/dev/null 2>&1
    cli CONFIG RESETSTAT >/dev/null
    keys0=$(cli DBSIZE)
    bench "$CALLS"
    callgrind_control -d "$PID" >/dev/null 2>&1
    keys1=$(cli DBSIZE)
    expired=$(info_field stats expired_keys)
    calls=$(cli INFO commandstats | tr -d '\r' | awk -F'[:,=]' -v c="cmdstat_$STAT" '$1 == c { print $3 }')
    failed=$(cli INFO commandstats | tr -d '\r' | awk -F'[:,=]' -v c="cmdstat_$STAT" \
        '$1 == c { for (i = 2; i < NF; i += 2) v[$i] = $(i + 1); print v["failed_calls"] + v["rejected_calls"] }')
    # redis-benchmark rounds -n up to whole pipelines: divide by the calls counted.
    [[ -n "$calls" ]] || { echo "profile: $w: no calls counted" >&2; exit 1; }
    [[ "${failed:-0}" == 0 ]] || { echo "profile: $w: $failed calls failed" >&2; exit 1; }
    # The newest dump is this workload's.
    dump=$(ls -t "$OUT".* 2>/dev/null | head -1 || true)
    [[ -n "$dump" ]] || { echo "profile: $w: no callgrind dump" >&2; exit 1; }
    mv "$dump" "$OUTDIR/callgrind.$w.out"
    created=$(awk -v a="$keys0" -v b="$keys1" -v e="${expired:-0}" -v n="$calls" 'BEGIN { printf "%.2f", (b - a + e) / n }')
    echo "=== workload $w: $CMD"
    echo "calls: $calls (1 client, pipeline $PIPELINE, $RANGE random keys); callgrind output: $OUTDIR/callgrind.$w.out"
    echo
    parse_dump "$OUTDIR/callgrind.$w.out" "$calls" "$SO" "$w" "$created"
    echo
done
cli SHUTDOWN NOSAVE >/dev/null 2>&1 || true
wait "$PID" 2>/dev/null || true
PID=
rm -f "$OUT" "$OUT".*

# Summary, ratios and targets, from the dumps of this run only.
echo "=== summary (this run; server instructions per call, Redis' protocol work included;"
echo "'less expiry' leaves out the deletion of expired keys, which rl's and redis-cell's"
echo "create-path keys (full again, and gone, 20 ms after the call) reach within the run and the"
echo "floor's keys (60 s) do not: every key created is deleted some day, so the targets compare"
echo "the figures less expiry)"
awk -F'\t' 'BEGIN { printf "%-15s %7s %12s %12s %12s %12s %9s\n", "workload", "calls", "server/call", "less expiry", "call()/call", "module self", "new keys" }
    { printf "%-15s %7s %12s %12.0f %12s %12s %9s\n", $1, $2, $3, $3 - $7, $4, $5, $6 }' "$SUMMARY"
echo
targets=$(for k in "${!TARGET[@]}"; do echo "$k ${TARGET[$k]}"; done | sort)
awk -F'\t' -v ratios="$RATIOS" -v targets="$targets" '
    { total[$1] = $3; net[$1] = $3 - $7; cmd[$1] = $4; created[$1] = $6 }
    END {
        n = split(ratios, rs, /[ \n]+/)
        for (i = 1; i <= n; i++) {
            split(rs[i], ab, "/"); a = ab[1]; b = ab[2]
            if (!(a in total) || !(b in total) || net[b] <= 0) continue
            printf "RATIO instr.%s/%s %.2f  (server instructions per call less expiry %.0f / %.0f; as measured %.2f; in call() %.2f; new keys per call %s / %s)\n",
                a, b, net[a] / net[b], net[a], net[b], total[a] / total[b], (cmd[b] > 0 ? cmd[a] / cmd[b] : 0), created[a], created[b]
        }
        m = split(targets, tl, "\n")
        for (i = 1; i <= m; i++) {
            split(tl[i], kv, " "); split(kv[1], ab, "/"); a = ab[1]; b = ab[2]
            if ((a in total) && !(b in total))
                printf "NOTE target %s <= %sx %s not checked: %s was not measured in this run\n", a, kv[2], b, b
            if (!(a in total) || !(b in total)) continue
            x = net[a] / net[b]
            printf "TARGET %-7s instructions: %s <= %sx %s (same arguments, less expiry): %.2fx\n", (x <= kv[2] + 0 ? "met" : "NOT met"), a, kv[2], b, x
        }
    }' "$SUMMARY"
