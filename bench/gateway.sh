#!/usr/bin/env bash
# bench/gateway.sh: the gateway's speed (run by `make bench-gateway`; not
# part of `make test`).
#
# Starts redis-server with the release module (a free 127.0.0.1 port, no
# persistence), an upstream nginx answering `200 ok` (no Lua), and one
# gateway nginx (Debian's nginx-extras, `worker_processes auto` as the
# sample nginx.conf) with seven targets on their own ports:
#   upstream   the upstream, direct (no proxy)
#   plain      nginx proxy to the upstream (keepalive pool), nothing else
#   incr       the proxy + one bare pooled INCR per request
#              (bench/gateway_floor.lua): the floor of any gateway that
#              asks Redis per request
#   incr_id    incr with the rl target's `proxy_set_header X-Request-Id
#              $request_id` (the sample's request tracing, which nginx pays
#              for with or without rl: a like-for-like floor for rl)
#   rl         the proxy + rl (the sample policy gateway/nginx/policy.lua
#              through resty.rl.nginx, budgets raised by
#              bench/gateway_policy.lua so that every request takes the
#              allowed path: RL.TAKE with the tenant bucket, strikes, boxes;
#              the sample's shared dicts, the usage dashboard's counters
#              included, and its phases but the body filter, which only
#              post-paid rules reading the response's usage need)
#   allowance  the proxy + rl with local allowances (a rule policy,
#              bench/gateway_allowance_policy.lua: one bucket rule per
#              tenant with `allowance`, size 200, refill_below 50: one
#              RL.TAKE ... PARTIAL per 200 requests, fetched ahead in a
#              timer, the requests spent from the node's shared dict)
#   limit_req  the proxy + nginx's own `limit_req` (burst=1000 nodelay, a rate
#              no run reaches: every request allowed)
# then runs wrk (Debian's wrk, installed by .ci/deps) on each, interleaved
# (upstream plain incr incr_id rl allowance limit_req, then again) over $RL_BENCH_GW_ROUNDS
# rounds, after a short warm-up of each. It prints one line per run
# (requests/s, p50, p99, non-2xx answers, and the CPU time per request of
# the gateway's workers and of redis-server, steadier than requests/s on a
# shared machine), the medians per target, and
#   RATIO <name> <x>     median over the rounds of that round's requests/s
#                        of <name> over the plain proxy's
#   RATIO rl_vs_incr <x>, RATIO rl_vs_incr_id <x>, RATIO rl_vs_limit_req <x>
#                        likewise, rl over them
#   RATIO allowance_vs_limit_req <x>   allowances over limit_req
#   TARGET ...           rl at 0.85x the INCR floor or more (the floor on
#                        the same configuration, incr_id; the bare incr
#                        when incr_id does not run); allowances at 0.8x
#                        limit_req or more
# and the share of rl's answers decided by the local fallback (Redis over
# its budget: `rl_gateway_requests_total{decision="degraded_allowed"}`).
# The whole run takes about ROUNDS x 7 x SECS seconds plus 7 s of warm-up
# and the start (4 minutes by default: five rounds, so that one noisy
# round moves the medians less). The machine is shared: absolute numbers move with the load,
# ratios within one run hold. Results: bench/RESULTS.md.
#
# Environment (all optional):
#   RL_MODULE=path             the module (default: cargo build --release)
#   RL_BENCH_GW_ROUNDS=5       interleaved rounds
#   RL_BENCH_GW_SECS=6         seconds per wrk run
#   RL_BENCH_GW_CONNECTIONS=20 wrk connections (-c)
#   RL_BENCH_GW_THREADS=1      wrk threads (-t)
#   RL_BENCH_GW_WORKERS=auto   worker_processes of the gateway nginx
#   RL_BENCH_GW_UPSTREAM_WORKERS=1   worker_processes of the upstream nginx
#   RL_BENCH_GW_ONLY="plain incr rl allowance" only these targets (plain
#                              always runs)
#   RL_BENCH_GW_KEEP=1         keep the work directory (configurations, logs)
#   RL_BENCH_GW_LIB=dir        the gateway/ directory to measure (default: this
#                              checkout's; another checkout's for a before/after)
#   RL_BENCH_GW_PROFILE=MODE   LuaJIT's profiler (jit.p) in each gateway
#                              worker, its report printed at the end

set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

ROUNDS=${RL_BENCH_GW_ROUNDS:-5}
SECS=${RL_BENCH_GW_SECS:-6}
CONNS=${RL_BENCH_GW_CONNECTIONS:-20}
THREADS=${RL_BENCH_GW_THREADS:-1}
WORKERS=${RL_BENCH_GW_WORKERS:-auto}
UPSTREAM_WORKERS=${RL_BENCH_GW_UPSTREAM_WORKERS:-1}
TARGETS=(upstream plain incr incr_id rl allowance limit_req)
if [[ -n "${RL_BENCH_GW_ONLY:-}" ]]; then
    TARGETS=(plain)
    for t in upstream incr incr_id rl allowance limit_req; do
        [[ " $RL_BENCH_GW_ONLY " == *" $t "* ]] && TARGETS+=("$t")
    done
fi
HOST=127.0.0.1
API_KEY=demo-enterprise-key
PATH_Q=/v1/ledgers

for tool in redis-server redis-cli nginx wrk; do
    command -v "$tool" >/dev/null || { echo "bench: $tool not found (make deps)" >&2; exit 1; }
done

# log, use_module, stop_pids, start_server, port_is_free
source "$ROOT/bench/lib.sh"
use_module

WORK=$(mktemp -d "${TMPDIR:-/tmp}/rl-bench-gw.XXXXXX")
PIDS=()
PEER_ARGS=()
NGINX_PREFIXES=()
cleanup() {
    local p
    for p in "${NGINX_PREFIXES[@]}"; do
        [[ -f "$p/logs/nginx.pid" ]] && kill "$(cat "$p/logs/nginx.pid")" 2>/dev/null || true
    done
    stop_pids
    if [[ -n "${RL_BENCH_GW_PROFILE:-}" ]]; then
        sleep 1
        for p in "$WORK"/profile/*.txt; do
            [[ -f "$p" ]] && { echo "--- LuaJIT profile of worker $(basename "$p" .txt)"; head -40 "$p"; }
        done
    fi
    if [[ -n "${RL_BENCH_GW_KEEP:-}" ]]; then
        log "work directory kept: $WORK"
    else
        rm -rf "$WORK"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
    local p
    for _ in $(seq 1 50); do
        p=$(random_port)
        if port_is_free "$p"; then
            echo "$p"
            return 0
        fi
    done
    echo "bench: no free port" >&2
    exit 1
}

log "starting redis-server with $MODULE"
start_server redis
REDIS_PORT=$PORT_redis
GW=${RL_BENCH_GW_LIB:-$ROOT/gateway}
export RL_REDIS_HOST=$HOST RL_REDIS_PORT=$REDIS_PORT RL_BENCH_GATEWAY_DIR=$GW


MODULES=""
for m in ndk_http_module ngx_http_lua_module; do
    if [[ -f /usr/lib/nginx/modules/$m.so ]]; then
        MODULES+="load_module /usr/lib/nginx/modules/$m.so;"$'\n'
    fi
done

# start_nginx NAME WORKERS HTTP_BODY [MAIN_EXTRA]: nginx with its own
# prefix under $WORK, in the foreground of a background job.
start_nginx() {
    local name=$1 workers=$2 body=$3 extra=${4:-} prefix=$WORK/$1
    mkdir -p "$prefix/logs" "$prefix/tmp"
    cat >"$prefix/nginx.conf" <<EOF
$extra
worker_processes $workers;
pid logs/nginx.pid;
error_log logs/error.log warn;
daemon off;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path tmp/body;
    proxy_temp_path tmp/proxy;
    fastcgi_temp_path tmp/fastcgi;
    uwsgi_temp_path tmp/uwsgi;
    scgi_temp_path tmp/scgi;
$body
}
EOF
    nginx -p "$prefix/" -c nginx.conf &
    PIDS+=("$!")
    printf -v "MASTER_$name" '%s' "$!"
    NGINX_PREFIXES+=("$prefix")
}

declare -A PORT
url() { echo "http://$HOST:${PORT[$1]}$PATH_Q"; }

# start_targets: the upstream and the gateway nginx on ports no other
# process has, then waits for every target to answer 200. Returns 1 when
# an nginx exits at its start (the caller looks at why); exits on any
# other failure. (Called in a condition, where `set -e` does not apply:
# every step that must not fail says so.)
start_targets() {
    local t ok code
    TAKEN=" $REDIS_PORT "
    for t in upstream plain incr incr_id rl allowance limit_req; do
        # a port no other target (nor Redis) has
        for _ in $(seq 1 20); do
            PORT[$t]=$(free_port) || exit 1
            [[ "$TAKEN" == *" ${PORT[$t]} "* ]] || break
        done
        TAKEN+="${PORT[$t]} "
    done

    start_nginx upstream "$UPSTREAM_WORKERS" "
        server {
            listen $HOST:${PORT[upstream]};
            location / { return 200 \"ok\\n\"; }
        }" || exit 1

    # RL_BENCH_GW_PROFILE=MODE: each gateway worker runs LuaJIT's profiler
    # (jit.p, MODE as its options, e.g. F or vl) and writes its report to
    # the work directory when it exits; kept with RL_BENCH_GW_KEEP.
    PROFILE=""
    if [[ -n "${RL_BENCH_GW_PROFILE:-}" ]]; then
        mkdir -p "$WORK/profile" && chmod o+x "$WORK" && chmod 777 "$WORK/profile"
        JITLIB=$(dirname "$(dirname "$(ls /usr/share/luajit-2.1*/jit/p.lua | head -1)")")
        PROFILE="
        init_worker_by_lua_block {
            package.path = \"$JITLIB/?.lua;\" .. package.path
            require(\"jit.p\").start(\"$RL_BENCH_GW_PROFILE\", \"$WORK/profile/\" .. ngx.worker.pid() .. \".txt\")
        }
        exit_worker_by_lua_block { require(\"jit.p\").stop() }"
    fi
    PROXY='
                proxy_http_version 1.1;
                proxy_set_header Connection "";
                proxy_pass http://api_backend;'
    start_nginx gateway "$WORKERS" "
        lua_package_path \"$GW/lib/?.lua;$GW/nginx/?.lua;$ROOT/bench/?.lua;/usr/share/lua/5.1/?.lua;;\";
        lua_shared_dict rl_metrics 1m;
        lua_shared_dict rl_deny 4m;
        lua_shared_dict rl_redis 1m;
        lua_shared_dict rl_allowance 1m;
        lua_shared_dict rl_usage 10m;
        lua_socket_log_errors off;
        limit_req_zone \$binary_remote_addr zone=bench:1m rate=1000000r/s;
    $PROFILE
        upstream api_backend {
            server $HOST:${PORT[upstream]};
            keepalive 32;
        }
        init_by_lua_block {
            require(\"resty.rl.nginx\").configure(\"api\", require(\"gateway_policy\"))
            require(\"resty.rl.nginx\").configure(\"allow\", require(\"gateway_allowance_policy\"))
        }
        server {
            listen $HOST:${PORT[plain]};
            location / { $PROXY }
        }
        server {
            listen $HOST:${PORT[incr]};
            location / {
                access_by_lua_block { require(\"gateway_floor\").access() }
                $PROXY
            }
        }
        server {
            listen $HOST:${PORT[incr_id]};
            location / {
                access_by_lua_block { require(\"gateway_floor\").access() }
                proxy_set_header X-Request-Id \$request_id;
                $PROXY
            }
        }
        server {
            listen $HOST:${PORT[rl]};
            location = /metrics {
                content_by_lua_block { require(\"resty.rl.observe.metrics\").serve(\"rl_metrics\") }
            }
            location / {
                access_by_lua_block { require(\"resty.rl.nginx\").access(\"api\") }
                header_filter_by_lua_block { require(\"resty.rl.nginx\").header_filter(\"api\") }
                log_by_lua_block { require(\"resty.rl.nginx\").log(\"api\") }
                proxy_set_header X-Request-Id \$request_id;
                $PROXY
            }
        }
        server {
            listen $HOST:${PORT[allowance]};
            location / {
                access_by_lua_block { require(\"resty.rl.nginx\").access(\"allow\") }
                header_filter_by_lua_block { require(\"resty.rl.nginx\").header_filter(\"allow\") }
                log_by_lua_block { require(\"resty.rl.nginx\").log(\"allow\") }
                $PROXY
            }
        }
        server {
            listen $HOST:${PORT[limit_req]};
            location / {
                limit_req zone=bench burst=1000 nodelay;
                $PROXY
            }
        }" "$MODULES
    env RL_REDIS_HOST;
    env RL_REDIS_PORT;
    env RL_BENCH_GATEWAY_DIR;" || exit 1

    # Wait for every target to answer 200.
    for t in "${TARGETS[@]}"; do
        ok=""
        for _ in $(seq 1 100); do
            code=$(curl -s -o /dev/null -w '%{http_code}' -H "X-Api-Key: $API_KEY" "$(url "$t")" || true)
            if [[ "$code" == 200 ]]; then ok=1; break; fi
            kill -0 "$MASTER_upstream" 2>/dev/null && kill -0 "$MASTER_gateway" 2>/dev/null || return 1
            sleep 0.1
        done
        if [[ -z "$ok" ]]; then
            echo "bench: $t does not answer 200 (last: $code); gateway error log:" >&2
            tail -20 "$WORK/gateway/logs/error.log" >&2 || true
            exit 1
        fi
    done
    kill -0 "$MASTER_upstream" 2>/dev/null && kill -0 "$MASTER_gateway" 2>/dev/null || return 1
}
for attempt in 1 2 3; do
    # this attempt's logs only
    rm -f "$WORK"/upstream/logs/error.log "$WORK"/gateway/logs/error.log
    start_targets && break
    kill "$MASTER_upstream" "$MASTER_gateway" 2>/dev/null || true
    wait "$MASTER_upstream" "$MASTER_gateway" 2>/dev/null || true
    logs=("$WORK"/upstream/logs/error.log "$WORK"/gateway/logs/error.log)
    if ! cat "${logs[@]}" 2>/dev/null | grep -q "Address already in use"; then
        echo "bench: an nginx exited at its start (its error is above, or here):" >&2
        tail -20 "${logs[@]}" >&2 2>/dev/null || true
        exit 1
    fi
    grep -h "Address already in use" "${logs[@]}" 2>/dev/null | tail -1 >&2 || true
    [[ $attempt -lt 3 ]] || { echo "bench: nginx did not start in 3 attempts" >&2; exit 1; }
    log "an nginx could not bind its port; again on other ports"
done
# the rl targets answer with their RateLimit field
for t in rl allowance; do
    [[ " ${TARGETS[*]} " == *" $t "* ]] || continue
    curl -s -D - -o /dev/null -H "X-Api-Key: $API_KEY" "$(url "$t")" | grep -qi '^RateLimit:' \
        || { echo "bench: $t answers without a RateLimit field" >&2; exit 1; }
done

# to_ms VALUE: wrk's latency (us, ms or s) in milliseconds.
to_ms() {
    awk -v v="$1" 'BEGIN {
        n = v + 0; u = v; sub(/^[0-9.]+/, "", u)
        if (u == "us") n /= 1000; else if (u == "s") n *= 1000; else if (u == "m") n *= 60000
        printf "%.2f", n }'
}

# procs_cpu_ns PID...: the CPU time (ns, /proc/PID/schedstat) of those processes
# (every thread of each).
procs_cpu_ns() {
    local pid sum=0 t v
    for pid in "$@"; do
        for t in /proc/"$pid"/task/*/schedstat; do
            read -r v _ <"$t" 2>/dev/null || continue
            sum=$(( sum + v ))
        done
    done
    echo "$sum"
}

# run_wrk TARGET SECS: prints "rps p50_ms p99_ms non2xx nginx_us redis_us":
# the last two the CPU time per request of the gateway nginx's workers and
# of redis-server (less noisy than requests/s on a shared machine).
run_wrk() {
    local out rps p50 p99 bad workers n0 n1 r0 r1 reqs
    # shellcheck disable=SC2207
    workers=($(pgrep -P "$MASTER_gateway"))
    n0=$(procs_cpu_ns "${workers[@]}")
    r0=$(procs_cpu_ns "$PID_redis")
    out=$(wrk -t"$THREADS" -c"$CONNS" -d"$2"s --latency -H "X-Api-Key: $API_KEY" "$(url "$1")")
    rps=$(awk '/^Requests\/sec:/ { print $2 }' <<<"$out")
    p50=$(awk '$1 == "50%" { print $2 }' <<<"$out")
    p99=$(awk '$1 == "99%" { print $2 }' <<<"$out")
    n1=$(procs_cpu_ns "${workers[@]}")
    r1=$(procs_cpu_ns "$PID_redis")
    bad=$(awk '/Non-2xx or 3xx responses:/ { print $NF }' <<<"$out")
    reqs=$(awk '/requests in/ { print $1 }' <<<"$out")
    [[ -n "$rps" && -n "$p50" && -n "$p99" && "${reqs:-0}" -gt 0 ]] \
        || { echo "bench: wrk failed on $1:" >&2; echo "$out" >&2; exit 1; }
    echo "$rps $(to_ms "$p50") $(to_ms "$p99") ${bad:-0}" \
        "$(awk -v a=$((n1 - n0)) -v b=$((r1 - r0)) -v n="$reqs" 'BEGIN { printf "%.1f %.1f", a / n / 1e3, b / n / 1e3 }')"
}

# rl_counter DECISION: rl_gateway_requests_total of that decision (all routes).
rl_counter() {
    curl -s "http://$HOST:${PORT[rl]}/metrics" | awk -v d="decision=\"$1\"" \
        'index($0, "rl_gateway_requests_total{") == 1 && index($0, d) { s += $NF } END { print s + 0 }'
}

log "gateway nginx (worker_processes $WORKERS), upstream nginx ($UPSTREAM_WORKERS), redis-server on $REDIS_PORT"
log "warm-up: 1 s per target"
for t in "${TARGETS[@]}"; do
    run_wrk "$t" 1 >/dev/null
done

RESULTS=$WORK/results.txt
: >"$RESULTS"
allowed0=$(rl_counter allowed)
degraded0=$(rl_counter degraded_allowed)
for r in $(seq 1 "$ROUNDS"); do
    log "round $r of $ROUNDS: ${TARGETS[*]}, $SECS s each"
    for t in "${TARGETS[@]}"; do
        line=$(run_wrk "$t" "$SECS")
        echo "$r $t $line" >>"$RESULTS"
    done
done
allowed=$(( $(rl_counter allowed) - allowed0 ))
degraded=$(( $(rl_counter degraded_allowed) - degraded0 ))

echo
echo "gateway benchmark, $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, $(nginx -v 2>&1 | sed 's/^nginx version: //'), wrk -t$THREADS -c$CONNS, $SECS s x $ROUNDS rounds, GET $PATH_Q"
echo
printf '%-6s %-10s %12s %8s %8s %8s %10s %10s\n' round target "requests/s" "p50 ms" "p99 ms" non-2xx \
    "nginx us" "redis us"
awk '{ printf "%-6s %-10s %12.0f %8s %8s %8s %10s %10s\n", $1, $2, $3, $4, $5, $6, $7, $8 }' "$RESULTS"
echo
printf '%-10s %12s %8s %8s %10s %10s\n' target "median r/s" "p50 ms" "p99 ms" "nginx us" "redis us"
for t in "${TARGETS[@]}"; do
    awk -v t="$t" '$2 == t { r[++n] = $3; a[n] = $4; b[n] = $5; c[n] = $7; d[n] = $8 }
        function med(x, n,   i, j, v) {
            for (i = 2; i <= n; i++) { v = x[i]; for (j = i - 1; j >= 1 && x[j] > v; j--) x[j + 1] = x[j]; x[j + 1] = v }
            return n % 2 ? x[(n + 1) / 2] : (x[n / 2] + x[n / 2 + 1]) / 2 }
        END { printf "%-10s %12.0f %8.2f %8.2f %10.1f %10.1f\n", t, med(r, n), med(a, n), med(b, n),
              med(c, n), med(d, n) }' "$RESULTS"
done
echo

# ratio A B: the median over the rounds of rps(A) / rps(B) in that round.
ratio() {
    awk -v a="$1" -v b="$2" '$2 == a { x[$1] = $3 } $2 == b { y[$1] = $3 }
        END { for (k in x) if (k in y && y[k] > 0) q[++n] = x[k] / y[k]
              for (i = 2; i <= n; i++) { v = q[i]; for (j = i - 1; j >= 1 && q[j] > v; j--) q[j + 1] = q[j]; q[j + 1] = v }
              printf "%.2f", n % 2 ? q[(n + 1) / 2] : (q[n / 2] + q[n / 2 + 1]) / 2 }' "$RESULTS"
}
for t in "${TARGETS[@]}"; do
    [[ $t == plain ]] || echo "RATIO $t $(ratio "$t" plain)"
done
has() { [[ " ${TARGETS[*]} " == *" $1 "* ]]; }
if has rl && has incr; then
    echo "RATIO rl_vs_incr $(ratio rl incr)"
fi
if has rl && has incr_id; then
    echo "RATIO rl_vs_incr_id $(ratio rl incr_id)"
fi
if has rl && has limit_req; then
    echo "RATIO rl_vs_limit_req $(ratio rl limit_req)"
fi
if has allowance && has limit_req; then
    echo "RATIO allowance_vs_limit_req $(ratio allowance limit_req)"
fi
if has rl; then
    total=$(( allowed + degraded ))
    awk -v d="$degraded" -v n="$total" 'BEGIN {
        printf "rl answers decided by the local fallback (Redis over its budget): %d of %d (%.3f %%)\n",
            d, n, (n > 0 ? 100 * d / n : 0) }'
fi
# The target compares rl with the floor on the same nginx configuration:
# incr_id forwards the request id as the rl target (the sample) does.
if has rl && has incr_id; then
    awk -v x="$(ratio rl incr_id)" 'BEGIN { printf "TARGET rl at >= 0.85x the INCR floor (same configuration: incr_id): %s (%.2fx)\n", (x >= 0.85 ? "met" : "missed"), x }'
elif has rl && has incr; then
    awk -v x="$(ratio rl incr)" 'BEGIN { printf "TARGET rl at >= 0.85x the bare INCR floor: %s (%.2fx)\n", (x >= 0.85 ? "met" : "missed"), x }'
fi
if has allowance && has limit_req; then
    awk -v x="$(ratio allowance limit_req)" 'BEGIN { printf "TARGET allowances at >= 0.8x limit_req: %s (%.2fx)\n", (x >= 0.8 ? "met" : "missed"), x }'
fi
if grep -E '\[(error|alert|crit|emerg)\]' "$WORK/gateway/logs/error.log" >/dev/null; then
    echo "gateway error log (errors):"
    grep -E '\[(error|alert|crit|emerg)\]' "$WORK/gateway/logs/error.log" | tail -5
fi
log "done"

