#!/usr/bin/env bash
# bench/envoy.sh: Envoy's rate limiting with rl (run by `make bench-envoy`;
# not part of `make test`).
#
# Starts redis-server with the release module, an upstream nginx answering
# `200 ok`, the rl-envoy service (envoy-ratelimit/, a limit no run reaches:
# every request takes the allowed path, one RL.WINDOW per request), the
# floor service (envoy-ratelimit/examples/floor.rs: the same gRPC stack
# answering OK without Redis) and one Envoy 1.40 (.ci/get-envoy) with four
# listeners in front of the upstream:
#   plain   no rate limiting
#   local   Envoy's local rate limit filter (a bucket no run empties)
#   floor   the rate-limit filter asking the floor service
#   rl      the rate-limit filter asking rl-envoy
# then runs wrk on each, interleaved (plain local floor rl, then again),
# over $RL_BENCH_ENVOY_ROUNDS rounds after a warm-up of each. It prints one
# line per run (requests/s, p99, non-2xx answers, and the CPU time per
# request of Envoy, of the rate-limit service and of redis-server: steadier
# than requests/s on a shared machine), the medians per target, and
#   RATIO <name>_vs_plain <x>   median over the rounds of <name>'s requests/s
#                               over the plain proxy's in that round
#   RATIO rl_vs_floor <x>       likewise, rl over the floor service
#   TARGET rl_vs_floor >= 0.85 met|missed
# The machine is shared: absolute numbers move with the load, ratios
# within one run hold. Results: bench/RESULTS.md.
#
# Environment (all optional):
#   RL_MODULE=path                the module (default: cargo build --release)
#   RL_BENCH_ENVOY_ROUNDS=3       interleaved rounds
#   RL_BENCH_ENVOY_SECS=5         seconds per wrk run
#   RL_BENCH_ENVOY_CONNECTIONS=20 wrk connections (-c)
#   RL_BENCH_ENVOY_CONCURRENCY=1  Envoy's worker threads (--concurrency)
#   RL_BENCH_ENVOY_SERVICE_THREADS=1  threads of rl-envoy and of the floor
#                                 service alike (--worker-threads; 0: one per core)
#   ENVOY_BIN=path                the envoy binary (default: .ci/get-envoy's)

set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

ROUNDS=${RL_BENCH_ENVOY_ROUNDS:-3}
SECS=${RL_BENCH_ENVOY_SECS:-5}
CONNS=${RL_BENCH_ENVOY_CONNECTIONS:-20}
CONCURRENCY=${RL_BENCH_ENVOY_CONCURRENCY:-1}
SERVICE_THREADS=${RL_BENCH_ENVOY_SERVICE_THREADS:-1}
TARGETS=(plain local floor rl)
HOST=127.0.0.1
T_START=$(date +%s)

for tool in redis-server redis-cli nginx wrk; do
    command -v "$tool" >/dev/null || { echo "bench: $tool not found (make deps)" >&2; exit 1; }
done
ENVOY=${ENVOY_BIN:-$(bash .ci/get-envoy)/envoy}

# log, use_module, stop_pids, start_server, port_is_free, random_port
source "$ROOT/bench/lib.sh"
use_module
cargo build --release -q -p envoy-ratelimit --bins --example floor

WORK=$(mktemp -d "${TMPDIR:-/tmp}/rl-bench-envoy.XXXXXX")
PIDS=()
PEER_ARGS=()
cleanup() {
    [[ -f "$WORK/nginx/logs/nginx.pid" ]] && kill "$(cat "$WORK/nginx/logs/nginx.pid")" 2>/dev/null || true
    stop_pids
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

TAKEN=" "
free_port() {
    local p
    for _ in $(seq 1 50); do
        p=$(random_port)
        if port_is_free "$p" && [[ "$TAKEN" != *" $p "* ]]; then
            TAKEN+="$p "
            echo "$p"
            return 0
        fi
    done
    echo "bench: no free port" >&2
    exit 1
}

wait_http() { # wait_http URL
    for _ in $(seq 1 200); do
        curl -fs -o /dev/null "$1" 2>/dev/null && return 0
        sleep 0.05
    done
    echo "bench: $1 does not answer" >&2
    exit 1
}

log "starting redis-server with $MODULE"
start_server redis
REDIS_PORT=$PORT_redis
MASTER_PID=$PID_redis

UP=$(free_port); TAKEN+="$UP "
mkdir -p "$WORK/nginx/logs" "$WORK/nginx/tmp"
cat > "$WORK/nginx/nginx.conf" <<NGINX
error_log logs/error.log warn;
daemon off;
worker_processes 1;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path tmp/body;
    proxy_temp_path tmp/proxy;
    fastcgi_temp_path tmp/fastcgi;
    uwsgi_temp_path tmp/uwsgi;
    scgi_temp_path tmp/scgi;
    server { listen $HOST:$UP; location / { return 200 "ok\n"; } }
}
NGINX
nginx -p "$WORK/nginx/" -c nginx.conf &
PIDS+=("$!")

mkdir -p "$WORK/config"
cat > "$WORK/config/bench.yaml" <<'YAML'
domain: bench
descriptors:
  - key: generic_key
    value: bench
    rate_limit: {unit: second, requests_per_unit: 4000000000}
YAML
RL_GRPC=$(free_port); RL_HTTP=$(free_port); FLOOR=$(free_port)
target/release/rl-envoy --config-dir "$WORK/config" --redis-url "redis://$HOST:$REDIS_PORT/" \
    --grpc-addr "$HOST:$RL_GRPC" --http-addr "$HOST:$RL_HTTP" --worker-threads "$SERVICE_THREADS" \
    > "$WORK/rl-envoy.log" 2>&1 &
PIDS+=("$!")
declare -A SERVICE_PID=([rl]=$!)
target/release/examples/floor "$HOST:$FLOOR" "$SERVICE_THREADS" > "$WORK/floor.log" 2>&1 &
PIDS+=("$!")
SERVICE_PID[floor]=$!
wait_http "http://$HOST:$RL_HTTP/healthcheck"

declare -A PORT
for t in "${TARGETS[@]}"; do PORT[$t]=$(free_port); done
ADMIN=$(free_port)

listener() { # listener NAME PORT FILTERS(yaml) RATE_LIMITS(yaml)
    cat <<YAML
  - name: $1
    address: {socket_address: {address: $HOST, port_value: $2}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: $1
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {prefix: "/"}
                route:
                  cluster: upstream
$4
          http_filters:
$3
          - name: envoy.filters.http.router
            typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}
YAML
}
ratelimit_filter() { # ratelimit_filter CLUSTER
    cat <<YAML
          - name: envoy.filters.http.ratelimit
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
              domain: bench
              failure_mode_deny: true
              timeout: 1s
              rate_limit_service:
                transport_api_version: V3
                grpc_service: {envoy_grpc: {cluster_name: $1}}
YAML
}
ACTIONS='                  rate_limits: [{actions: [{generic_key: {descriptor_value: bench}}]}]'
LOCAL='          - name: envoy.filters.http.local_ratelimit
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit
              stat_prefix: local
              token_bucket: {max_tokens: 1000000000, tokens_per_fill: 1000000000, fill_interval: 1s}
              filter_enabled: {default_value: {numerator: 100, denominator: HUNDRED}}
              filter_enforced: {default_value: {numerator: 100, denominator: HUNDRED}}'
cluster() { # cluster NAME PORT [h2]
    cat <<YAML
  - name: $1
    type: STATIC
    connect_timeout: 1s
YAML
    [[ -n "${3:-}" ]] && cat <<'YAML'
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {http2_protocol_options: {}}
YAML
    cat <<YAML
    load_assignment:
      cluster_name: $1
      endpoints: [{lb_endpoints: [{endpoint: {address: {socket_address: {address: $HOST, port_value: $2}}}}]}]
YAML
}
{
    echo "admin: {address: {socket_address: {address: $HOST, port_value: $ADMIN}}}"
    echo "static_resources:"
    echo "  listeners:"
    listener plain "${PORT[plain]}" "" ""
    listener local "${PORT[local]}" "$LOCAL" ""
    listener floor "${PORT[floor]}" "$(ratelimit_filter floor)" "$ACTIONS"
    listener rl "${PORT[rl]}" "$(ratelimit_filter rl)" "$ACTIONS"
    echo "  clusters:"
    cluster upstream "$UP"
    cluster floor "$FLOOR" h2
    cluster rl "$RL_GRPC" h2
} > "$WORK/envoy.yaml"
"$ENVOY" -c "$WORK/envoy.yaml" --concurrency "$CONCURRENCY" --disable-hot-restart -l warning \
    > "$WORK/envoy.log" 2>&1 &
PIDS+=("$!")
ENVOY_PID=$!
wait_http "http://$HOST:$ADMIN/ready"
for t in "${TARGETS[@]}"; do wait_http "http://$HOST:${PORT[$t]}/"; done
log "envoy $("$ENVOY" --version | grep -o '[0-9.]*/Clean' | cut -d/ -f1), concurrency $CONCURRENCY; services' threads $SERVICE_THREADS; $ROUNDS rounds of ${SECS}s, $CONNS connections"

# cpu_ns PID: the CPU time of a process's threads in ns (schedstat: exact,
# where /proc/PID/stat counts 10 ms ticks)
cpu_ns() { cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{ s += $1 } END { printf "%.0f", s }'; }

declare -A RPS CPU
run() { # run TARGET ROUND
    local t=$1 out rps p99 non2xx reqs e0 e1 s0=0 s1=0 r0 r1 extra
    e0=$(cpu_ns "$ENVOY_PID"); r0=$(cpu_ns "$MASTER_PID")
    [[ -n "${SERVICE_PID[$t]:-}" ]] && s0=$(cpu_ns "${SERVICE_PID[$t]}")
    out=$(wrk -t1 -c"$CONNS" -d"${SECS}s" --latency "http://$HOST:${PORT[$t]}/")
    e1=$(cpu_ns "$ENVOY_PID"); r1=$(cpu_ns "$MASTER_PID")
    [[ -n "${SERVICE_PID[$t]:-}" ]] && s1=$(cpu_ns "${SERVICE_PID[$t]}")
    rps=$(awk '/^Requests\/sec:/ { print $2 }' <<<"$out")
    p99=$(awk '$1 == "99%" { print $2 }' <<<"$out")
    reqs=$(awk '/requests in/ { print $1 }' <<<"$out")
    non2xx=$(awk '/Non-2xx/ { print $NF }' <<<"$out")
    # CPU per request (us) of Envoy, of the rate-limit service, of redis-server
    extra=$(awk -v e=$((e1 - e0)) -v s=$((s1 - s0)) -v r=$((r1 - r0)) -v n="${reqs:-0}" \
        'BEGIN { if (n > 0) printf "  cpu us/req: envoy %.1f service %.1f redis %.1f", e / n / 1000, s / n / 1000, r / n / 1000 }')
    printf 'round %d %-6s %10.0f req/s  p99 %-8s non-2xx %s%s\n' "$2" "$t" "$rps" "$p99" "${non2xx:-0}" "$extra"
    RPS[$t,$2]=$rps
    CPU[$t,$2]=$extra
}

for t in "${TARGETS[@]}"; do wrk -t1 -c"$CONNS" -d1s "http://$HOST:${PORT[$t]}/" >/dev/null; done
for r in $(seq 1 "$ROUNDS"); do
    for t in "${TARGETS[@]}"; do run "$t" "$r"; done
done

median() { sort -g | awk '{ a[NR] = $1 } END { if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
column() { # column TARGET FIELD: the median over the rounds of a CPU field
    for r in $(seq 1 "$ROUNDS"); do awk -v f="$2" '{ for (i = 1; i < NF; i++) if ($i == f) print $(i + 1) }' <<<"${CPU[$1,$r]}"; done | median
}
for t in "${TARGETS[@]}"; do
    printf 'median %-6s %10.0f req/s  cpu us/req: envoy %s service %s redis %s\n' "$t" \
        "$(for r in $(seq 1 "$ROUNDS"); do echo "${RPS[$t,$r]}"; done | median)" \
        "$(column "$t" envoy)" "$(column "$t" service)" "$(column "$t" redis)"
done
ratio() { # ratio A B: median over rounds of A/B
    for r in $(seq 1 "$ROUNDS"); do awk -v a="${RPS[$1,$r]}" -v b="${RPS[$2,$r]}" 'BEGIN { printf "%.3f\n", a / b }'; done | median
}
for t in local floor rl; do echo "RATIO ${t}_vs_plain $(ratio "$t" plain)"; done
R=$(ratio rl floor)
echo "RATIO rl_vs_floor $R"
awk -v r="$R" 'BEGIN { printf "TARGET rl_vs_floor >= 0.85 %s\n", (r >= 0.85 ? "met" : "missed") }'
