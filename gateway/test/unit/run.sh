#!/usr/bin/env bash
# Unit tests of the gateway's Lua library (gateway/lib/resty/rl), without
# Redis and without serving: one nginx process (nginx-extras or OpenResty)
# whose init_by_lua loads every gateway/test/unit/*_test.lua (or the files
# given as arguments), runs their tests (test/unit/unit.lua) and exits
# before it opens a port. Prints each failure and "N passed, N failed";
# the exit status is 1 when a test failed (or nginx could not run them).
#
#   bash gateway/test/unit/run.sh [file_test.lua ...]
#
# Environment: NGINX (binary, default nginx), NGINX_MODULES (directory of
# ngx_http_lua_module.so, default /usr/lib/nginx/modules; none there: the
# module is built in, as in OpenResty), RL_UNIT_VERBOSE=1 (list every
# test), RL_UNIT_FILTER (only the tests whose name contains it),
# RL_UNIT_COUNTS (a file to append a cargo-style "test result:" line of
# the counts to, for `make test`'s summary).
#
# The tests run in the nginx master as the calling user: no worker runs,
# so a checkout that only root can read works when run as root (workers
# would run as another user).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
gw=$(cd "$here/../.." && pwd)
nginx=${NGINX:-nginx}
modules=${NGINX_MODULES:-/usr/lib/nginx/modules}

if [ $# -gt 0 ]; then
    files=()
    for f in "$@"; do
        files+=("$(cd "$(dirname "$f")" && pwd)/$(basename "$f")")
    done
else
    files=("$here"/*_test.lua)
fi

dir=$(mktemp -d "${TMPDIR:-/tmp}/rl-lua-unit-XXXXXX")
trap 'rm -rf "$dir"' EXIT
mkdir -p "$dir/tmp"

{
    if [ -f "$modules/ngx_http_lua_module.so" ]; then
        [ -f "$modules/ndk_http_module.so" ] && echo "load_module $modules/ndk_http_module.so;"
        echo "load_module $modules/ngx_http_lua_module.so;"
    fi
    cat <<CONF
master_process off;
daemon off;
pid nginx.pid;
events { worker_connections 16; }
http {
    client_body_temp_path tmp/body;
    proxy_temp_path tmp/proxy;
    fastcgi_temp_path tmp/fastcgi;
    uwsgi_temp_path tmp/uwsgi;
    scgi_temp_path tmp/scgi;
    lua_package_path "$gw/lib/?.lua;$gw/kong/?.lua;$gw/test/unit/?.lua;$gw/test/?.lua;/usr/share/lua/5.1/?.lua;;";
    # the dicts the library's validation looks for (as the sample declares)
    lua_shared_dict rl_metrics 1m;
    lua_shared_dict rl_deny 1m;
    lua_shared_dict rl_allowance 1m;
    lua_shared_dict rl_redis 1m;
    lua_shared_dict rl_usage 1m;
    init_by_lua_block {
        require("unit").main([==[$gw]==], {
CONF
    for f in "${files[@]}"; do
        printf '            [==[%s]==],\n' "$f"
    done
    cat <<CONF
        })
    }
}
CONF
} > "$dir/nginx.conf"

: > "$dir/out"
if ! "$nginx" -v 2>/dev/null; then
    echo "cannot run $nginx: the gateway's unit tests need nginx with the Lua module;" \
        "install Debian's nginx-extras, lua-nginx-redis and lua-cjson (make deps does)" >&2
    status=1
else
    # bounded: the runner ends nginx itself; a runner that did not would serve
    set +e
    timeout 120 "$nginx" -p "$dir/" -c "$dir/nginx.conf" -e stderr 2>&1 | tee "$dir/out"
    status=${PIPESTATUS[0]}
    set -e
fi
summary=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$dir/out" | tail -n 1 || true)
if [ -z "$summary" ]; then
    echo "the Lua unit tests did not run to the end (nginx exit status $status)" >&2
    [ "$status" -ne 0 ] || status=1
fi
if [ -n "${RL_UNIT_COUNTS:-}" ]; then
    read -r passed _ failed _ <<< "${summary:-0 passed, 1 failed}"
    failed=${failed%,}
    mkdir -p "$(dirname "$RL_UNIT_COUNTS")"
    echo "test result: lua-unit. $passed passed; $failed failed; 0 ignored;" >> "$RL_UNIT_COUNTS"
fi
exit "$status"
