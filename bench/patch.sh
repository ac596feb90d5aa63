#!/usr/bin/env bash
# Server time and replicated bytes per call, for two builds of the module in
# one run: a master with one replica per build, then
#   take16: RL.TAKE on a key that also holds an EXACT log of ~10,000 entries
#   exact16: one admitted RL.WINDOW ... EXACT naming 16 keys (~10,000 entries each)
#   lease1000: RL.LEASE ACQUIRE on a key holding 1,000-calls leases (up to 1,000)
# usec/call from INFO commandstats, bytes/call from the master_repl_offset delta.
# Usage: bench/patch.sh BEFORE.so AFTER.so [calls]
set -euo pipefail
before=${1:?before .so}; after=${2:?after .so}; calls=${3:-200}
entries=$((10000 - calls))
dir=$(mktemp -d); trap 'for p in $(cat "$dir"/*.pid 2>/dev/null); do kill "$p" 2>/dev/null || true; done; rm -rf "$dir"' EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
start() { # name port module [replicaof-port]
  local extra=(); [ -n "${4:-}" ] && extra=(--replicaof 127.0.0.1 "$4")
  mkdir -p "$dir/$1"
  redis-server --port "$2" --bind 127.0.0.1 --dir "$dir/$1" --save '' --appendonly no \
    --enable-debug-command yes --loadmodule "$3" --daemonize yes --pidfile "$dir/$1.pid" \
    --logfile "$dir/$1.log" "${extra[@]}"
  for _ in $(seq 100); do redis-cli -p "$2" PING >/dev/null 2>&1 && return; sleep 0.05; done
  echo "server $1 did not start" >&2; exit 1
}
offset() { redis-cli -p "$1" INFO replication | tr -d '\r' | sed -n 's/^master_repl_offset://p'; }
usec() { redis-cli -p "$1" INFO commandstats | tr -d '\r' | sed -n "s/^cmdstat_$2:.*usec_per_call=\([0-9.]*\).*/\1/p"; }
also=$(printf 'ALSO w{b}:%d 10000 3600 ' $(seq 2 16))
window16="RL.WINDOW w{b}:1 10000 3600 $also EXACT"
measure() { # port label command-line stat
  redis-cli -p "$1" CONFIG RESETSTAT >/dev/null
  local o0; o0=$(offset "$1")
  for _ in $(seq "$calls"); do echo "$3"; done | redis-cli -p "$1" >/dev/null
  redis-cli -p "$1" WAIT 1 5000 >/dev/null
  local o1; o1=$(offset "$1")
  printf '| %s | %s | %s | %s |\n' "$build" "$2" "$(usec "$1" "$4")" $(( (o1 - o0) / calls ))
}
echo "| build | call | usec/call | replicated bytes/call |"
echo "|---|---|---|---|"
for build in before after; do
  so=$before; [ "$build" = after ] && so=$after
  m=$(port); start "m-$build" "$m" "$so"; r=$(port); start "r-$build" "$r" "$so" "$m"
  # The 16 logs: one entry per millisecond (DEBUG SLEEP between calls).
  for _ in $(seq "$entries"); do
    echo "$window16"; echo "DEBUG SLEEP 0.001"
  done | redis-cli -p "$m" >/dev/null
  for i in $(seq $((1000 - calls))); do echo "RL.LEASE ACQUIRE lease 1000 3600 ID l$i"; done | redis-cli -p "$m" >/dev/null
  measure "$m" "RL.TAKE beside a ~10,000-entry log" "RL.TAKE w{b}:1 1000000 1000000 60" "rl.take"
  measure "$m" "RL.WINDOW EXACT, 16 keys x ~10,000 entries" "$window16" "rl.window"
  measure "$m" "RL.LEASE ACQUIRE on ~1,000 leases" "RL.LEASE ACQUIRE lease 1000 3600" "rl.lease|acquire"
  redis-cli -p "$r" SHUTDOWN NOSAVE >/dev/null 2>&1 || true
  redis-cli -p "$m" SHUTDOWN NOSAVE >/dev/null 2>&1 || true
done
