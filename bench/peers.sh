# Sourced by bench/run.sh and bench/profile.sh: the peer modules that load
# into the same redis-server as rl, so that each comparison is two
# measurements of one run.
#
#   floor       FLOOR.TAKE key [args...]: RL.TAKE's shape (open the key,
#               a 16-byte module value, an expiry, one replicated command,
#               8 integers) with no decision logic. Built from
#               ../shared/perf/floor/ (floor.c and its build script).
#   redis-cell  redis-cell 0.5.0 with its command renamed CELL.THROTTLE
#               (same syntax and reply as CL.THROTTLE). Built by
#               ../shared/peers/build-redis-cell.
#
# ../shared is relative to the repository root; in a git worktree whose
# parent has no shared/, the main checkout's parent is tried. RL_SHARED=dir
# overrides it. Both are built once into target/peers/ and reused (the
# floor is rebuilt when floor.c is newer). A peer that cannot be built is
# reported on stderr, its variable stays empty, and the benchmark goes on
# without it.
#
# build_peers: sets FLOOR_SO and CELL_SO (paths, or empty) and
# PEER_ARGS (the --loadmodule arguments of the peers that were built).
# Needs ROOT (the repository root) and a `log` function.

# Where the peers' sources are (.ci/shared-dir: RL_SHARED, else ../shared).
shared_dir() {
    bash "$ROOT/.ci/shared-dir" "$ROOT"
}

build_peers() {
    local shared peers
    shared=$(shared_dir)
    peers=${CARGO_TARGET_DIR:-$ROOT/target}/peers
    mkdir -p "$peers"
    FLOOR_SO=
    CELL_SO=
    PEER_ARGS=()

    local floor_src=$shared/perf/floor
    if [[ -f "$peers/floor.so" && ! "$floor_src/floor.c" -nt "$peers/floor.so" ]]; then
        FLOOR_SO=$peers/floor.so
    elif [[ -x "$floor_src/build" ]]; then
        log "building the floor module ($floor_src) into $peers"
        # The build script needs the redismodule.h of the redis-module crate.
        cargo fetch --quiet >/dev/null 2>&1 || true
        if "$floor_src/build" "$peers" >"$peers/floor.log" 2>&1 && [[ -f "$peers/floor.so" ]]; then
            FLOOR_SO=$peers/floor.so
        else
            log "NOTE: the floor module could not be built (log: $peers/floor.log); going on without it"
        fi
    else
        log "NOTE: no floor module: $floor_src/build not found (set RL_SHARED); going on without it"
    fi

    local cell_build=$shared/peers/build-redis-cell
    local cell_so=$peers/redis-cell/target/release/libredis_cell.so
    if [[ -f "$cell_so" ]]; then
        CELL_SO=$cell_so
    elif [[ -x "$cell_build" ]]; then
        log "building redis-cell as CELL.THROTTLE ($cell_build) into $peers/redis-cell (a few minutes)"
        if CARGO_BUILD_JOBS=${CARGO_BUILD_JOBS:-1} "$cell_build" "$peers/redis-cell" \
            >"$peers/redis-cell.log" 2>&1 && [[ -f "$cell_so" ]]; then
            CELL_SO=$cell_so
        else
            log "NOTE: redis-cell could not be built (log: $peers/redis-cell.log); going on without it"
        fi
    else
        log "NOTE: no redis-cell: $cell_build not found (set RL_SHARED); going on without it"
    fi

    if [[ -n "$FLOOR_SO" ]]; then PEER_ARGS+=(--loadmodule "$FLOOR_SO"); fi
    if [[ -n "$CELL_SO" ]]; then PEER_ARGS+=(--loadmodule "$CELL_SO"); fi
}
