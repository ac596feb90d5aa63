#!/usr/bin/env bash
# bench/profile.sh: count the instructions and heap allocations of one
# workload inside redis-server, with valgrind's callgrind (exact and
# repeatable on a noisy machine, unlike wall-clock timings).
#
#   bash bench/profile.sh [WORKLOAD] [CALLS]     (or: make bench-profile)
#
# WORKLOAD (default take):
#   take       RL.TAKE k 3000 3000 60 COST 1 STRIKES 20 60 BOX 300 3600 86400
#              on random keys (each call finds its bucket gone: created anew)
#   take_live  the same call on a stored, drained bucket (updated in place)
#   take_also  take with one ALSO bucket (a stored tenant bucket)
#   take_plain RL.TAKE k 3000 3000 60 (no STRIKES: the work of CL.THROTTLE)
#   throttle   CL.THROTTLE k 2999 3000 60 (rl's redis-cell command)
#   window     RL.WINDOW k 3000 60 (sliding) on random keys
#   lease      RL.LEASE ACQUIRE k 1000 1 on random keys
#   incr       INCR on random keys (the floor)
#   lua        the Lua baseline (bench/baseline.lua) via EVALSHA
#
# It starts redis-server with the module under callgrind on a free
# 127.0.0.1 port, prepares the keys, runs 2000 warm-up calls, zeroes the
# counters, sends CALLS calls (default 20000) with redis-benchmark (1
# client, pipeline 32, 10000 random keys), dumps the counters and prints:
#   - instructions per call, for the whole server and inside the command;
#   - the top functions by instructions (self), per call;
#   - calls per command call of the allocator (RM_Alloc/RM_Free: the
#     module's own heap allocations; zmalloc & co: every allocation of the
#     server, Redis' own included) and of a few module API functions.
# The callgrind output is kept in target/profile/ for callgrind_annotate.
#
# RL_MODULE=path uses that module instead of building the release one.

set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

WORKLOAD=${1:-take}
CALLS=${2:-20000}
KEYS=10000
WARMUP=2000
PIPELINE=32
HOST=127.0.0.1
P="STRIKES 20 60 BOX 300 3600 86400"

for tool in valgrind callgrind_annotate callgrind_control redis-server redis-cli redis-benchmark; do
    command -v "$tool" >/dev/null || { echo "profile: $tool not found" >&2; exit 1; }
done

if [[ -z "${RL_MODULE:-}" ]]; then
    cargo build --release --quiet
    MODULE="${CARGO_TARGET_DIR:-$ROOT/target}/release/librl.so"
else
    MODULE=$RL_MODULE
fi
OUTDIR=${CARGO_TARGET_DIR:-$ROOT/target}/profile
mkdir -p "$OUTDIR"

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

OUT="$OUTDIR/callgrind.$WORKLOAD.out"
rm -f "$OUT" "$OUT".*
# Start redis-server under callgrind on a free port (another one if the
# port was taken meanwhile).
PORT=
for _ in 1 2 3 4 5 6 7 8; do
    p=$(( 20000 + RANDOM % 40000 ))
    (exec 3<>"/dev/tcp/$HOST/$p") 2>/dev/null && continue
    valgrind --tool=callgrind --dump-instr=no --callgrind-out-file="$OUT" \
        redis-server --port "$p" --bind "$HOST" --dir "$WORK" --save "" --appendonly no \
        --loadmodule "$MODULE" >"$WORK/valgrind.log" 2>&1 &
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

STAT=rl.take
case $WORKLOAD in
take) CMD="RL.TAKE rl:{k:__rand_int__} 3000 3000 60 COST 1 $P" ;;
take_live)
    pipe_keys "RL.TAKE rl:{kl:{I}} 3000 3000 3600 COST 2000 $P" "$KEYS" 1
    CMD="RL.TAKE rl:{kl:__rand_int__} 3000 3000 3600 COST 1 $P" ;;
take_also)
    pipe_keys "RL.TAKE rl:{t:{I}}:tenant 100000 100000 3600 COST 50000" "$KEYS" 1
    CMD="RL.TAKE rl:{ka:__rand_int__} 3000 3000 60 COST 1 ALSO rl:{t:__rand_int__}:tenant 100000 100000 3600 $P" ;;
take_plain) CMD="RL.TAKE rl:{kp:__rand_int__} 3000 3000 60" ;;
throttle) CMD="CL.THROTTLE rl:{c:__rand_int__} 2999 3000 60"; STAT=cl.throttle ;;
window) CMD="RL.WINDOW rl:{ws:__rand_int__} 3000 60 COST 1"; STAT=rl.window ;;
lease) CMD="RL.LEASE ACQUIRE rl:{l:__rand_int__} 1000 1"; STAT="rl.lease|acquire" ;;
incr) CMD="INCR bench:n:__rand_int__"; STAT=incr ;;
lua)
    SHA=$(cli SCRIPT LOAD "$(cat "$ROOT/bench/baseline.lua")")
    CMD="EVALSHA $SHA 4 lua:{__rand_int__}:b lua:{__rand_int__}:x lua:{__rand_int__}:s lua:{__rand_int__}:o 3000 3000 60 1 20 60 300 3600 86400 86400"
    STAT=evalsha ;;
*) echo "profile: unknown workload $WORKLOAD" >&2; exit 2 ;;
esac

# shellcheck disable=SC2086
bench() { redis-benchmark -h "$HOST" -p "$PORT" -c 1 -P "$PIPELINE" -r "$KEYS" -n "$1" -q $CMD >/dev/null; }
bench "$WARMUP"
callgrind_control -z "$PID" >/dev/null 2>&1
cli CONFIG RESETSTAT >/dev/null
bench "$CALLS"
callgrind_control -d "$PID" >/dev/null 2>&1
calls=$(cli INFO commandstats | tr -d '\r' | awk -F'[:,=]' -v c="cmdstat_$STAT" '$1 == c { print $3 }')
cli SHUTDOWN NOSAVE >/dev/null 2>&1 || true
wait "$PID" 2>/dev/null || true
PID=
DUMP=$(ls -t "$OUT".* 2>/dev/null | grep -v '\.0$' | head -1 || true)
[[ -n "$DUMP" ]] || DUMP=$(ls -t "$OUT"* | head -1)
# redis-benchmark rounds -n up to whole pipelines: divide by the calls counted.
[[ -n "$calls" ]] || { echo "profile: no calls counted" >&2; exit 1; }

echo "workload $WORKLOAD: $CMD"
echo "calls: $calls (1 client, pipeline $PIPELINE, $KEYS random keys); callgrind output: $DUMP"
echo

# Parse the callgrind output (name-compressed format: "fn=(id) name" the
# first time, "fn=(id)" after): self cost per function and the object it
# lives in, the cost of each call edge (inclusive cost of the callee) and
# call counts.
awk -v n="$calls" -v module="$(basename "$MODULE")" -v out="$WORK" '
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
        for (f in self) if (index(obj[f], module)) inmod += self[f]
        printf "in %s (self, all its functions): %.0f instructions per call (%.1f%%)\n", module, inmod / n, 100 * inmod / total
        split("processInputBuffer processCommand call", top, " ")
        for (i = 1; i in top; i++) if (top[i] in self)
            printf "inclusive %-28s %8.0f per call\n", top[i], (self[top[i]] + edge[top[i]]) / n
        for (f in self) if (f ~ /^rl::adapter::commands::[a-z_]*_entry$|^incrCommand$|^evalShaCommand$/ && ncalls[f] > 0)
            printf "inclusive %-28s %8.0f per call (%.2f calls per call)\n", f, (self[f] + edge[f]) / n, ncalls[f] / n
        print ""
        for (f in self) printf "%.1f\t%s\t%s\n", self[f] / n, (index(obj[f], module) ? "*" : " "), f > (out "/self.tsv")
        close(out "/self.tsv")
        print "top functions in the module by instructions (self), per call:"
        system("grep -F \"\t*\t\" " out "/self.tsv | sort -t \"\t\" -k1,1 -g -r | head -25 | awk -F \"\t\" '"'"'{ printf \"%10s  %s\\n\", $1, $3 }'"'"'")
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
    }' "$DUMP"
