#!/usr/bin/env bash
# Unit tests of the gateway's Lua library (gateway/lib/resty/rl), without
# nginx and without Redis: busted under LuaJIT loads every
# gateway/test/unit/*_test.lua (or the files given as arguments), with the
# `ngx` API the library needs stubbed by ngx_stub.lua (its helper). Prints
# each failure and "N passed, N failed"; the exit status is 1 when a test
# failed (or busted could not run them).
#
#   bash gateway/test/unit/run.sh [file_test.lua ...]
#
# Environment: LUAJIT (interpreter, default luajit), BUSTED (busted's
# script, default the one on PATH), RL_UNIT_VERBOSE=1 (list every test,
# and the library's ngx.log lines), RL_UNIT_FILTER (only the tests whose
# name contains it), RL_UNIT_COUNTS (a file to append a cargo-style
# "test result:" line of the counts to, for `make test`'s summary).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
gw=$(cd "$here/../.." && pwd)
luajit=${LUAJIT:-luajit}
busted=${BUSTED:-$(command -v busted || true)}

if [ $# -gt 0 ]; then
    files=()
    for f in "$@"; do
        files+=("$(cd "$(dirname "$f")" && pwd)/$(basename "$f")")
    done
else
    files=("$here"/*_test.lua)
fi

args=(--helper="$here/ngx_stub.lua" --pattern=_test -o TAP
      --lpath="$gw/lib/?.lua;$gw/kong/?.lua;$gw/test/unit/?.lua;$gw/test/?.lua")
if [ -n "${RL_UNIT_FILTER:-}" ]; then
    # busted's filter is a Lua pattern: the name, its magic characters escaped
    args+=(--filter="$(printf '%s' "$RL_UNIT_FILTER" | sed 's/[][^$()%.*+?-]/%&/g')")
fi

out=$(mktemp "${TMPDIR:-/tmp}/rl-lua-unit-XXXXXX")
trap 'rm -f "$out"' EXIT

status=0
if [ -z "$busted" ] || ! "$luajit" -v >/dev/null 2>&1; then
    echo "cannot run the gateway's unit tests: they need luajit and busted;" \
        "install Debian's luajit2, lua-busted, lua-cjson and lua-resty-lrucache" \
        "(make deps does)" >&2
    status=1
else
    # bounded: a test that would loop ends with the run
    (cd "$gw" && timeout 120 "$luajit" "$busted" "${args[@]}" "${files[@]}") > "$out" 2>&1 \
        || status=$?
fi

# TAP: "ok N - name", "not ok N - name" then "# " lines of the failure
passed=$(grep -c '^ok ' "$out" || true)
failed=$(grep -c '^not ok ' "$out" || true)
if [ "${RL_UNIT_VERBOSE:-}" = 1 ]; then
    cat "$out"
else
    # the failures with their messages, and what is not TAP (busted's own errors)
    # (busted's line of the registration dropped: the message names the test's)
    awk '/^not ok /{show=1; print; next} /^ok /{show=0; next} /^1\.\./{next}
         /^# .* @ [0-9]+$/{next} /^# /{if (show) print; next} {print}' "$out" \
        | sed "s#$gw/#gateway/#g"
fi
if ! grep -qE '^1\.\.[0-9]+$' "$out"; then
    echo "the Lua unit tests did not run to the end (busted exit status $status)" >&2
    failed=$((failed + 1))
fi
if [ "$status" -ne 0 ] && [ "$failed" -eq 0 ]; then
    echo "busted exited with status $status" >&2
    failed=1
fi
if [ "$passed" -eq 0 ] && [ "$failed" -eq 0 ] && [ -z "${RL_UNIT_FILTER:-}" ]; then
    echo "FAIL runner: no tests ran" >&2
    failed=1
fi
echo "$passed passed, $failed failed"
if [ -n "${RL_UNIT_COUNTS:-}" ]; then
    mkdir -p "$(dirname "$RL_UNIT_COUNTS")"
    echo "test result: lua-unit. $passed passed; $failed failed; 0 ignored;" >> "$RL_UNIT_COUNTS"
fi
[ "$failed" -eq 0 ] || exit 1
