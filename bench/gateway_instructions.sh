#!/usr/bin/env bash
# bench/gateway_instructions.sh: the instructions the gateway's nginx runs
# per request (user space, valgrind's callgrind), target by target: a
# measure that does not move with the load of a shared machine, unlike
# the requests/s of bench/gateway.sh (whose targets and policies these
# are). Not part of `make test`.
#
# One gateway nginx in one process (master_process off) under callgrind,
# an upstream nginx and redis-server with the module as in
# bench/gateway.sh. Per target: 3 s of wrk (-c4) to warm up (LuaJIT's
# traces, the pools), then instrumentation on for $RL_BENCH_GW_IR_SECS s
# of wrk, off; printed: the requests and the instructions per request.
# Targets:
#   plain limit_req incr   as in bench/gateway.sh
#   incr_id                incr with the rl target's
#                          `proxy_set_header X-Request-Id $request_id`
#   phases                 three trivial Lua phases (ngx.ctx, the two
#                          RateLimit fields as constants, one shared-dict
#                          incr): what any Lua gateway of this shape pays
#   minimal                phases + the pooled INCR + the request id: the
#                          rl target's fixed part
#   rl allowance           as in bench/gateway.sh
#   allowance_local        allowance with allowances of 10^7 points and a
#                          max age of an hour: no fetch, no sweep and no
#                          Redis call in the measured seconds, so the
#                          steadiest count of the path served from the
#                          node's allowance
#   rules                  the allowance policy without `allowance`: a rule
#                          policy's RL.TAKE on every request
#   rl_before allowance_before allowance_local_before rules_before
#                          the same with the library of
#                          $RL_BENCH_GW_BEFORE (another checkout's gateway/
#                          directory, loaded under another package name)
#
# Environment (all optional):
#   RL_MODULE=path                the module (default: cargo build --release)
#   RL_BENCH_GW_IR_TARGETS="..."  the targets (default: all but *_before,
#                                 which are added with RL_BENCH_GW_BEFORE)
#   RL_BENCH_GW_IR_SECS=6         seconds of measured load per target
#   RL_BENCH_GW_BEFORE=dir        a gateway/ directory to compare with
#   RL_REDIS_TIMEOUT_MS=1000      the policies' Redis budget (bench/gateway.sh's
#                                 is 20 ms: under callgrind on a loaded machine
#                                 a call can take longer, and its request would
#                                 take the degraded path, not the allowed one)
#
# Needs valgrind (as bench/profile.sh; not installed by .ci/deps).

set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

SECS=${RL_BENCH_GW_IR_SECS:-6}
TARGETS=${RL_BENCH_GW_IR_TARGETS:-plain limit_req incr incr_id phases minimal rl allowance allowance_local rules}
if [[ -n "${RL_BENCH_GW_BEFORE:-}" && -z "${RL_BENCH_GW_IR_TARGETS:-}" ]]; then
    TARGETS+=" rl_before allowance_before allowance_local_before rules_before"
fi
HOST=127.0.0.1
API_KEY=demo-enterprise-key

for tool in redis-server redis-cli nginx wrk valgrind callgrind_control; do
    command -v "$tool" >/dev/null || { echo "bench: $tool not found" >&2; exit 1; }
done

# log, use_module, stop_pids, start_server, port_is_free
source "$ROOT/bench/lib.sh"
use_module

WORK=$(mktemp -d "${TMPDIR:-/tmp}/rl-bench-gwir.XXXXXX")
PIDS=()
PEER_ARGS=()
cleanup() {
    [[ -f "$WORK/up/logs/nginx.pid" ]] && kill "$(cat "$WORK/up/logs/nginx.pid")" 2>/dev/null || true
    stop_pids
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

start_server redis
export RL_REDIS_HOST=$HOST RL_REDIS_PORT=$PORT_redis RL_BENCH_GATEWAY_DIR=$ROOT/gateway
export RL_REDIS_TIMEOUT_MS=${RL_REDIS_TIMEOUT_MS:-1000}

# The library to compare with, as package restyb.rl (both in one nginx).
BEFORE_PATH=""
if [[ -n "${RL_BENCH_GW_BEFORE:-}" ]]; then
    mkdir -p "$WORK/before/restyb"
    cp -r "$RL_BENCH_GW_BEFORE/lib/resty/rl" "$WORK/before/restyb/rl"
    grep -rl 'resty\.rl\.' "$WORK/before/restyb/rl" | xargs sed -i 's/resty\.rl\./restyb.rl./g'
    BEFORE_PATH="$WORK/before/?.lua;"
fi

declare -A PORT
for t in upstream plain limit_req incr incr_id phases minimal rl allowance allowance_local rules \
    rl_before allowance_before allowance_local_before rules_before; do
    for _ in $(seq 1 50); do
        p=$(random_port)
        port_is_free "$p" && [[ " ${PORT[*]:-} " != *" $p "* ]] && break
    done
    PORT[$t]=$p
done

MODULES=""
for m in ndk_http_module ngx_http_lua_module; do
    [[ -f /usr/lib/nginx/modules/$m.so ]] && MODULES+="load_module /usr/lib/nginx/modules/$m.so;"$'\n'
done
TEMPS="client_body_temp_path tmp/body; proxy_temp_path tmp/proxy; fastcgi_temp_path tmp/f;
    uwsgi_temp_path tmp/u; scgi_temp_path tmp/s;"
mkdir -p "$WORK/up/logs" "$WORK/up/tmp" "$WORK/gw/logs" "$WORK/gw/tmp"
cat >"$WORK/up/nginx.conf" <<EOF
worker_processes 1; pid logs/nginx.pid; error_log logs/error.log warn;
events { worker_connections 1024; }
http { access_log off; $TEMPS
    server { listen $HOST:${PORT[upstream]}; location / { return 200 "ok\n"; } } }
EOF
nginx -p "$WORK/up/" -c nginx.conf

PROXY='proxy_http_version 1.1; proxy_set_header Connection ""; proxy_pass http://api_backend;'
FIELDS='ngx.header["RateLimit-Policy"] = [["enterprise-key";q=1000000000;qu="points";w=60, "enterprise-tenant";q=1000000000;qu="points";w=60]]
            ngx.header["RateLimit"] = [["enterprise-key";r=999999999;t=1]]'
# server PORT ACCESS HEADER_FILTER LOG EXTRA: one target's server block.
server() {
    echo "  server { listen $HOST:$1; location / {"
    [[ -n "$2" ]] && echo "    access_by_lua_block { $2 }"
    [[ -n "$3" ]] && echo "    header_filter_by_lua_block { $3 }"
    [[ -n "$4" ]] && echo "    log_by_lua_block { $4 }"
    echo "    $5 $PROXY } }"
}
# rl_servers PACKAGE RL_PORT ALLOWANCE_PORT LOCAL_PORT RULES_PORT: the rl,
# allowance, allowance_local and rules targets.
rl_servers() {
    local m="require(\"$1.rl.nginx\")" g
    server "$2" "$m.access(\"api\")" "$m.header_filter(\"api\")" "$m.log(\"api\")" \
        'proxy_set_header X-Request-Id $request_id;'
    for g in allow:$3 allow_local:$4 rules:$5; do
        server "${g#*:}" "$m.access(\"${g%%:*}\")" "$m.header_filter(\"${g%%:*}\")" \
            "$m.log(\"${g%%:*}\")" ""
    done
}
{
    echo "$MODULES"
    echo "env RL_REDIS_HOST; env RL_REDIS_PORT; env RL_BENCH_GATEWAY_DIR; env RL_REDIS_TIMEOUT_MS;"
    echo "master_process off; daemon off; worker_processes 1; pid logs/nginx.pid;"
    echo "error_log logs/error.log warn; events { worker_connections 1024; }"
    echo "http { access_log off; $TEMPS"
    echo "  lua_package_path \"$BEFORE_PATH$ROOT/gateway/lib/?.lua;$ROOT/gateway/nginx/?.lua;$ROOT/bench/?.lua;/usr/share/lua/5.1/?.lua;;\";"
    echo "  lua_shared_dict rl_metrics 1m; lua_shared_dict rl_deny 4m; lua_shared_dict rl_redis 1m;"
    echo "  lua_shared_dict rl_allowance 1m; lua_shared_dict rl_usage 10m;"
    echo "  lua_socket_log_errors off;"
    echo "  limit_req_zone \$binary_remote_addr zone=bench:1m rate=1000000r/s;"
    echo "  upstream api_backend { server $HOST:${PORT[upstream]}; keepalive 32; }"
    echo "  init_by_lua_block {"
    for pkg in resty ${BEFORE_PATH:+restyb}; do
        echo "    require(\"$pkg.rl.nginx\").configure(\"api\", require(\"gateway_policy\"))"
        echo "    require(\"$pkg.rl.nginx\").configure(\"allow\", require(\"gateway_allowance_policy\"))"
        # allowance_local: a copy of the allowance policy, allowances that last the run
        echo "    local p = dofile(package.searchpath(\"gateway_allowance_policy\", package.path))"
        echo "    p.key_prefix, p.rules[1].allowance = \"bench-al-local\","
        echo "        { size = 10000000, max_age = 3600, refill_below = 50 }"
        echo "    require(\"$pkg.rl.nginx\").configure(\"allow_local\", p)"
        # rules: the same policy without allowances (RL.TAKE per request)
        echo "    p = dofile(package.searchpath(\"gateway_allowance_policy\", package.path))"
        echo "    p.key_prefix, p.rules[1].allowance = \"bench-rules\", nil"
        echo "    require(\"$pkg.rl.nginx\").configure(\"rules\", p)"
    done
    echo "  }"
    server "${PORT[plain]}" "" "" "" ""
    server "${PORT[limit_req]}" "" "" "" "limit_req zone=bench burst=1000 nodelay;"
    server "${PORT[incr]}" 'require("gateway_floor").access()' "" "" ""
    server "${PORT[incr_id]}" 'require("gateway_floor").access()' "" "" \
        'proxy_set_header X-Request-Id $request_id;'
    server "${PORT[phases]}" 'ngx.ctx.rl = true' "local _ = ngx.ctx.rl
            $FIELDS" 'local _ = ngx.ctx.rl; ngx.shared.rl_metrics:incr("x", 1, 0)' ""
    server "${PORT[minimal]}" 'ngx.ctx.rl = true; require("gateway_floor").access()' \
        "local _ = ngx.ctx.rl
            $FIELDS" 'local _ = ngx.ctx.rl; ngx.shared.rl_metrics:incr("x", 1, 0)' \
        'proxy_set_header X-Request-Id $request_id;'
    rl_servers resty "${PORT[rl]}" "${PORT[allowance]}" "${PORT[allowance_local]}" "${PORT[rules]}"
    [[ -n "$BEFORE_PATH" ]] && rl_servers restyb "${PORT[rl_before]}" "${PORT[allowance_before]}" \
        "${PORT[allowance_local_before]}" "${PORT[rules_before]}"
    echo "}"
} >"$WORK/gw/nginx.conf"

valgrind --tool=callgrind --instr-atstart=no --smc-check=all-non-file \
    --callgrind-out-file="$WORK/callgrind.out" nginx -p "$WORK/gw/" -c nginx.conf \
    >"$WORK/valgrind.log" 2>&1 &
VG=$!
PIDS+=("$VG")
up=""
for _ in $(seq 1 200); do
    curl -s -o /dev/null "http://$HOST:${PORT[plain]}/" && { up=1; break; }
    kill -0 "$VG" 2>/dev/null || break
    sleep 0.3
done
if [[ -z "$up" ]]; then
    echo "bench: the gateway nginx under valgrind did not start; its log:" >&2
    tail -5 "$WORK/valgrind.log" "$WORK/gw/logs/error.log" >&2 2>/dev/null || true
    exit 1
fi

log "instructions per request (callgrind), $SECS s of wrk -c4 per target"
printf '%-24s %10s %14s\n' target requests "Ir/request"
for t in $TARGETS; do
    url="http://$HOST:${PORT[$t]}/v1/ledgers"
    wrk -t1 -c4 -d3s -H "X-Api-Key: $API_KEY" "$url" >/dev/null
    callgrind_control -z "$VG" >/dev/null 2>&1
    callgrind_control -i on "$VG" >/dev/null 2>&1
    out=$(wrk -t1 -c4 -d"$SECS"s -H "X-Api-Key: $API_KEY" "$url")
    callgrind_control -i off "$VG" >/dev/null 2>&1
    callgrind_control -d "$t" "$VG" >/dev/null 2>&1
    sleep 0.5
    reqs=$(awk '/requests in/ { print $1 }' <<<"$out")
    bad=$(awk '/Non-2xx or 3xx responses:/ { print $NF }' <<<"$out")
    [[ -z "$bad" ]] || { echo "bench: $t answered $bad non-2xx" >&2; exit 1; }
    # shellcheck disable=SC2012
    dump=$(ls -t "$WORK"/callgrind.out* | head -1)
    ir=$(awk '/^totals:/ { print $2; exit }' "$dump")
    printf '%-24s %10d %14d\n' "$t" "$reqs" $(( ir / reqs ))
done
