# Sourced by bench/run.sh: report() prints the tables and the ratios of a
# run from its files (RESULTS, MEMORY, SCALE_RESULTS, HEAD_TO_HEAD; formats
# in run.sh)
# and the globals of run.sh (WORKLOADS, LABEL, ROUNDS, ...).
#
# Every ratio and verdict here is computed from two measurements of the
# same run: throughput ratios are medians of per-round ratios (the two
# workloads ran in the same round, same server, same pipeline), memory
# figures come from the same server one after the other. Nothing is
# compared with a figure measured elsewhere.

# The speed target measured here (instruction targets: bench/profile.sh):
# rl's CL.THROTTLE serves at least this many times redis-cell's
# CELL.THROTTLE requests per second, side by side.
TARGET_THROTTLE_VS_CELL=1.3
# The memory targets, bytes per key (used_memory delta over MEM_KEYS keys):
# a bucket key at most the floor's key plus one 16-byte allocator class,
# a bucket with an active box at most the floor's plus 48, both from this
# run's floor; without the floor, the figures the targets were set from
# (a floor key of 165 bytes).
TARGET_BUCKET_OVER_FLOOR=16
TARGET_BUCKET_BOX_OVER_FLOOR=48
TARGET_BUCKET_BYTES=181
TARGET_BUCKET_BOX_BYTES=213

# Throughput pairs "a b label": RATIO lines of rps(a) / rps(b). The floor
# keeps every key 60 s, so over the run's keyspace its calls update stored
# keys, while rl's buckets of 3000 per 60 s spent by 1 (and redis-cell's,
# and leases of 1 s) are full again, and gone, 20 ms later: those rl calls
# create their key. bench/profile.sh compares the floor on either path.
RATIO_PAIRS="throttle cell CL.THROTTLE (rl) / CELL.THROTTLE (redis-cell), both create their keys
cell floor_throttle CELL.THROTTLE (key created) / FLOOR.TAKE (key stored), same arguments
take floor_take RL.TAKE (key created) / FLOOR.TAKE (key stored), same arguments
take_live floor_take RL.TAKE (key stored) / FLOOR.TAKE (key stored), same arguments
take_plain floor_plain RL.TAKE without STRIKES (key created) / FLOOR.TAKE (key stored)
throttle floor_throttle CL.THROTTLE (rl, key created) / FLOOR.TAKE (key stored)
win_s floor_window RL.WINDOW sliding / FLOOR.TAKE, both on stored keys, same arguments
lease floor_lease RL.LEASE ACQUIRE (key created) / FLOOR.TAKE (key stored)
take lua RL.TAKE / the Lua baseline
take incr RL.TAKE / INCR
throttle incr CL.THROTTLE (rl) / INCR
cell incr CELL.THROTTLE (redis-cell) / INCR
take_thr take RL.TAKE throttled / allowed
take_box take RL.TAKE boxed / allowed"

# The median of a space-separated list, for the awk programs below.
AWK_MEDIAN='
function median(list,    n, a, i, j, t) {
    n = split(list, a, " ")
    for (i = 2; i <= n; i++) { t = a[i]; j = i - 1
        while (j > 0 && a[j] + 0 > t + 0) { a[j + 1] = a[j]; j-- } a[j + 1] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}'

report() {
    echo "rl system benchmark: $(date -u '+%Y-%m-%d %H:%M UTC'), Redis $REDIS_VERSION, $(nproc) cores,"
    echo "redis-benchmark -c $CLIENTS -r $KEYSPACE, ~${SECS}s per run, $ROUNDS interleaved rounds;"
    echo "module $MODULE"
    echo "floor: ${FLOOR_SO:-NOT BUILT (its rows and ratios are left out)}"
    echo "redis-cell (CELL.THROTTLE): ${CELL_SO:-NOT BUILT (its rows and ratios are left out)}"
    echo
    echo "Throughput: median of $ROUNDS runs; 'x INCR' is the median of the per-round ratios to INCR"
    echo "in the same configuration; usec/call from INFO commandstats (the command's own execution,"
    echo "without protocol and network); cpu us = the CPU time of redis-server's main thread (from"
    echo "/proc/PID/schedstat) per call, everything included; 'cpu x' = INCR's cpu us / this one's:"
    echo "the server-side ratio, which redis-benchmark's own limit does not cap (one redis-benchmark"
    echo "thread cannot saturate the server with INCR at pipeline 32 here); cpu% = that thread's CPU"
    echo "use during the run (100 = one core); path = share of calls with the intended outcome (INFO rl)."
    echo
    # Per round ratio to INCR, then medians.
    awk -v order="${WORKLOADS[*]}" -v labels="$(for w in "${WORKLOADS[@]}"; do printf '%s=%s;' "$w" "${LABEL[$w]}"; done)" "$AWK_MEDIAN"'
        { key = $1 " " $2 " " $4; rps[key] = rps[key] " " $5; usec[key] = usec[key] " " $6; cus[key] = cus[key] " " $9
          cpu[key] = cpu[key] " " $7; ok[key] = ok[key] " " $8; r[$1 " " $2 " " $3 " " $4] = $5
          if (!($1 " " $2 in seen)) { seen[$1 " " $2] = 1; confs[++nc] = $1 " " $2 }
          if ($3 > rounds) rounds = $3 }
        END {
            nw = split(order, ws, " ")
            nl = split(labels, lp, ";")
            for (i = 1; i <= nl; i++) { split(lp[i], kv, "="); label[kv[1]] = kv[2] }
            printf "%-8s %-21s %3s %9s %7s %10s %7s %6s %5s %6s\n", "replica", "command", "P", "req/s", "x INCR", "usec/call", "cpu us", "cpu x", "cpu%", "path%"
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
                    printf "%-8s %-21s %3s %9.0f %7.2f %10.2f %7.2f %6.2f %5.0f %6s\n",
                        (cp[1] == "replica" ? "yes" : "no"), label[w], cp[2], median(rps[key]),
                        median(ratios), median(usec[key]), cu, (cu > 0 ? ci / cu : 0), median(cpu[key]), okm
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
        awk "$AWK_MEDIAN"'
            { k = $1 " " $3; v[k] = v[k] " " $4; u[k] = u[k] " " $5; if (!($1 in s)) { s[$1] = 1; o[++n] = $1 } }
            END { printf "%10s %12s %10s %10s %12s %10s\n", "keys", "RL.TAKE/s", "usec/call", "vs first", "INCR/s", "vs first"
                  for (i = 1; i <= n; i++) { m = median(v[o[i] " s"]); mi = median(v[o[i] " i"])
                      if (i == 1) { b = m; bi = mi }
                      printf "%10s %12.0f %10.2f %10.2f %12.0f %10.2f\n", o[i], m, median(u[o[i] " s"]), m / b, mi, mi / bi
                      if (m / b < worst || i == 1) worst = m / b }
                  printf "RATIO scale.take.%s/%s %.2f  (RL.TAKE throughput at %s keys / at %s keys, worst size)\n",
                      o[n], o[1], worst, o[n], o[1] }' "$SCALE_RESULTS"
    fi
    echo
    report_ratios
}

# The RATIO and TARGET lines.
report_ratios() {
    echo "Side by side (this run): RATIO <configuration>.<a>/<b> <x> is the median over the rounds"
    echo "of req/s(a) / req/s(b), measured in the same round, server and pipeline (cpu x: the same"
    echo "from the server's CPU time per call). TARGET lines compare two figures of this run."
    awk -v pairs="$RATIO_PAIRS" -v target="$TARGET_THROTTLE_VS_CELL" -v h2h="$HEAD_TO_HEAD" "$AWK_MEDIAN"'
        { c = ($1 == "replica" ? "replica.p" : "p") $2; r[c " " $3 " " $4] = $5; cu[c " " $3 " " $4] = $9
          if (!(c in seen)) { seen[c] = 1; confs[++nc] = c }; have[c " " $4] = 1
          if ($3 > rounds) rounds = $3 }
        END {
            np = split(pairs, pl, "\n")
            for (ci = 1; ci <= nc; ci++) {
                c = confs[ci]
                for (p = 1; p <= np; p++) {
                    a = pl[p]; sub(/ .*/, "", a); rest = substr(pl[p], length(a) + 2)
                    b = rest; sub(/ .*/, "", b); label = substr(rest, length(b) + 2)
                    if (!((c " " a) in have) || !((c " " b) in have)) continue
                    q = ""; qc = ""
                    for (k = 1; k <= rounds; k++) {
                        x = r[c " " k " " a]; y = r[c " " k " " b]
                        if (x > 0 && y > 0) { q = q " " x / y; qc = qc " " cu[c " " k " " b] / cu[c " " k " " a] }
                    }
                    if (q == "") continue
                    m = median(q)
                    printf "RATIO %s.%s/%s %.2f  (%s; cpu x %.2f)\n", c, a, b, m, label, median(qc)
                    if (a == "throttle" && b == "cell") { rounds_ratio[c] = m; rounds_cpu[c] = median(qc) }
                }
            }
            # The head-to-head pairs (file 2), when run, give the target its figure.
            while ((getline line < h2h) > 0) {
                split(line, f, " "); c = (f[1] == "replica" ? "replica.p" : "p") f[2]
                if (f[6] > 0 && f[7] > 0) { hq[c] = hq[c] " " f[6] / f[7]; hc[c] = hc[c] " " f[9] / f[8]; hn[c]++ }
            }
            for (ci = 1; ci <= nc; ci++) {
                c = confs[ci]
                if (c in hq) {
                    m = median(hq[c])
                    printf "RATIO %s.h2h.throttle/cell %.2f  (%d back-to-back pairs of runs; cpu x %.2f)\n", c, m, hn[c], median(hc[c])
                    how = sprintf("%d head-to-head pairs; interleaved rounds %.2fx; server CPU per call %.2fx", hn[c], rounds_ratio[c], median(hc[c]))
                } else if (c in rounds_ratio) {
                    m = rounds_ratio[c]
                    how = sprintf("interleaved rounds; server CPU per call %.2fx", rounds_cpu[c])
                } else continue
                verdict[++nv] = sprintf("TARGET %-7s %s: CL.THROTTLE (rl) req/s >= %sx CELL.THROTTLE (redis-cell): %.2fx (%s)",
                    (m >= target ? "met" : "NOT met"), c, target, m, how)
            }
            for (i = 1; i <= nv; i++) print verdict[i]
        }' "$RESULTS"
    awk -F'\t' -v tb="$TARGET_BUCKET_BYTES" -v tx="$TARGET_BUCKET_BOX_BYTES" \
        -v ob="$TARGET_BUCKET_OVER_FLOOR" -v ox="$TARGET_BUCKET_BOX_OVER_FLOOR" '
        { mem[$1] = $3 }
        function ratio(name, a, b, label) {
            if ((a in mem) && (b in mem) && mem[b] > 0)
                printf "RATIO %s %.2f  (bytes per key: %s %.0f / %s %.0f)\n", name, mem[a] / mem[b], a, mem[a], b, mem[b]
        }
        function target(a, limit, over,    floor, how) {
            floor = "FLOOR.TAKE (floor)"
            how = "fixed: no floor in this run"
            if (floor in mem) {
                limit = mem[floor] + over
                how = sprintf("the floor key %.1f + %d", mem[floor], over)
            }
            if (a in mem) printf "TARGET %-7s memory: %s <= %.1f bytes per key (%s): %.1f\n",
                (mem[a] <= limit ? "met" : "NOT met"), a, limit, how, mem[a]
        }
        END {
            ratio("bytes.take/floor", "RL.TAKE bucket", "FLOOR.TAKE (floor)")
            ratio("bytes.take_box/floor", "RL.TAKE bucket+strikes+box", "FLOOR.TAKE (floor)")
            ratio("bytes.throttle/cell", "CL.THROTTLE (rl) bucket", "CELL.THROTTLE (redis-cell)")
            ratio("bytes.take/lua", "RL.TAKE bucket", "Lua bucket (hash)")
            target("RL.TAKE bucket", tb, ob)
            target("RL.TAKE bucket+strikes+box", tx, ox)
        }' "$MEMORY"
    [[ -n "$CELL_SO" ]] || echo "NOTE redis-cell was not built: no CL.THROTTLE side-by-side ratio or target"
    [[ -n "$FLOOR_SO" ]] || echo "NOTE the floor module was not built: no floor ratios"
}
