"""The Python half of `make bench-app`: the same Starlette route under uvicorn
(one process each), limited three ways against the same redis-server with
the rl module, measured with wrk in interleaved rounds:

  slowapi-redis   slowapi with limits' own Redis storage (fixed window, its
                  default: a Lua script per request, EVALSHA)
  slowapi-rl      slowapi with rl's storage (rl://: one RL.WINDOW ... FIXED)
  middleware      rl's ASGI middleware (one RL.WINDOW ... FIXED per request,
                  with the RateLimit fields), compared with slowapi-redis
  slowapi-redis-moving, slowapi-rl-moving
                  the same two with the moving-window strategy (limits' list
                  of timestamps in Lua against RL.WINDOW ... EXACT)

The limits (10^9 a minute per client; 10000 a minute for each of 1000
random clients with the moving window) are never reached: every request takes
the admitted path. Redis CPU per decision is measured two ways:

  command     INFO commandstats, the decision's own commands: the top-level
              ones only (EVALSHA, RL.*): a script's time includes the
              commands it calls, which commandstats also lists
  server      INFO cpu, redis-server's user + system time: the command plus
              reading the request, writing the reply and the event loop,
              which cost the same for every store that sends one command
              per decision

and the app's own CPU per request (uvicorn's process, /proc/PID/stat: steadier
than requests per second on a shared machine, as it does not depend on
whether the app got a core). Prints one line per run, the commands each target sent per decision (first
round), the medians per target and

  RATIO <target>_rps_vs_<peer> <x>         end-to-end throughput
  RATIO <target>_redis_cmd_vs_<peer> <x>   Redis command time per decision
  RATIO <target>_redis_cpu_vs_<peer> <x>   Redis server CPU per decision
  RATIO <target>_app_cpu_vs_<peer> <x>     the app's CPU per request
                                           (each: the median over the rounds
                                           of the round's ratio)
  TARGET ...  throughput at least 1.0x the peer's and Redis command time
              per decision at most 0.5x, in this run (with the server CPU
              ratio, and what one command per decision costs Redis outside
              the command whatever it is)

Environment: RL_MODULE (default target/release/librl.so), RL_BENCH_APP_ROUNDS
(5), RL_BENCH_APP_SECS (5), RL_BENCH_APP_CONNECTIONS (20). Needs wrk and
the venv of .ci/deps-sdk (slowapi, limits, uvicorn, starlette, rl-server).

    target/sdk-venv/bin/python bench/app_python.py
"""

from __future__ import annotations

import os
import random
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "sdk/python-server/tests"))

TARGETS = ["slowapi-redis", "slowapi-rl", "middleware", "slowapi-redis-moving", "slowapi-rl-moving"]
#: each rl target and the peer it is compared with
PAIRS = [("slowapi-rl", "slowapi-redis"), ("middleware", "slowapi-redis"),
         ("slowapi-rl-moving", "slowapi-redis-moving")]
LIMIT = "1000000000/minute"
LIMIT_MOVING = "10000/minute"


def app(kind: str, redis_url: str) -> Any:
    """The bench's Starlette app, limited by ``kind``."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route as Path_

    async def hello(request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    if kind == "middleware":
        from rl_server.asgi import install
        from rl_server.routes import Route, Window
        a = Starlette(routes=[Path_("/hello", hello)])
        install(a, redis=redis_url, timeout=2, routes={
            "GET /hello": Route(windows=[Window("hello", "rl:hello:{client}", 10**9, 60, "FIXED")])})
        return a
    import rl_server.limits_storage  # noqa: F401
    from slowapi import Limiter, _rate_limit_exceeded_handler
    from slowapi.errors import RateLimitExceeded
    from slowapi.util import get_remote_address
    uri = redis_url if kind.startswith("slowapi-redis") else redis_url.replace("redis://", "rl://")
    if kind.endswith("-moving"):
        # a moving window keeps an entry per hit: 1000 clients at 10000 a minute
        limiter = Limiter(key_func=lambda: str(random.randrange(1000)), storage_uri=uri,
                          strategy="moving-window")
        limited = limiter.limit(LIMIT_MOVING)(hello)
    else:
        limiter = Limiter(key_func=get_remote_address, storage_uri=uri, strategy="fixed-window")
        limited = limiter.limit(LIMIT)(hello)
    a = Starlette(routes=[Path_("/hello", limited)])
    a.state.limiter = limiter
    a.add_exception_handler(RateLimitExceeded, _rate_limit_exceeded_handler)  # type: ignore[arg-type]
    return a


def serve(kind: str, port: int, redis_url: str) -> None:
    import uvicorn
    uvicorn.run(app(kind, redis_url), host="127.0.0.1", port=port, log_level="warning", access_log=False)


#: the commands a decision sends itself (a script's inner commands are not counted again)
TOP_LEVEL = re.compile(r"^(evalsha|eval|evalsha_ro|eval_ro|fcall|fcall_ro|rl\.|cl\.)")


def redis_info(port: int) -> Dict[str, Any]:
    """Per command (calls, usec), and the server's CPU seconds (user + system)."""
    import redis
    r = redis.Redis(port=port)
    stats = r.info("commandstats")
    cpu = r.info("cpu")
    r.close()
    return {"cmds": {k.removeprefix("cmdstat_"): (int(v["calls"]), int(v["usec"])) for k, v in stats.items()},
            "cpu": float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])}


def decision_cost(before: Dict[str, Any], after: Dict[str, Any], n: int) -> Tuple[float, float, str]:
    """(command usec, server CPU usec) per decision, and the commands sent per decision."""
    usec = 0
    sent = []
    for name, (calls, us) in after["cmds"].items():
        c0, u0 = before["cmds"].get(name, (0, 0))
        if (calls - c0) / n >= 0.005 and name != "info":
            sent.append(f"{name}={(calls - c0) / n:.2f}")
        if TOP_LEVEL.match(name):
            usec += us - u0
    return usec / n, (after["cpu"] - before["cpu"]) * 1e6 / n, " ".join(sorted(sent))


def process_cpu(pid: int) -> float:
    """A process's CPU seconds (user + system) from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def wrk(url: str, secs: int, conns: int) -> Dict[str, float]:
    out = subprocess.run(["wrk", "-t1", f"-c{conns}", f"-d{secs}s", "--latency", url],
                         capture_output=True, text=True, timeout=secs + 60).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    total = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    p99 = re.search(r"99%\s+([\d.]+)(us|ms|s)", out)
    scale = {"us": 0.001, "ms": 1.0, "s": 1000.0}
    return {"rps": rps, "requests": total, "non2xx": int(non2xx.group(1)) if non2xx else 0,
            "p99_ms": float(p99.group(1)) * scale[p99.group(2)] if p99 else float("nan")}


def main() -> int:
    from servers import App, RedisServer
    rounds = int(os.environ.get("RL_BENCH_APP_ROUNDS", "5"))
    secs = int(os.environ.get("RL_BENCH_APP_SECS", "5"))
    conns = int(os.environ.get("RL_BENCH_APP_CONNECTIONS", "20"))
    from redis.utils import HIREDIS_AVAILABLE
    print(f"redis-py's reply parser (every target): {'hiredis' if HIREDIS_AVAILABLE else 'pure Python'}")
    server = RedisServer("redis")
    apps: Dict[str, App] = {}
    try:
        for kind in TARGETS:
            apps[kind] = App([str(Path(__file__).resolve()), "serve", kind], {"REDIS_URL": server.url})
        for kind, a in apps.items():  # warm-up
            wrk(f"{a.url}/hello", 1, conns)
        runs: Dict[str, List[Dict[str, float]]] = {k: [] for k in TARGETS}
        for rnd in range(1, rounds + 1):
            # the order rotates from round to round, as the machine's load drifts
            for kind in TARGETS[rnd % len(TARGETS):] + TARGETS[:rnd % len(TARGETS)]:
                before = redis_info(server.port)
                app0 = process_cpu(apps[kind].proc.pid)
                res = wrk(f"{apps[kind].url}/hello", secs, conns)
                app1 = process_cpu(apps[kind].proc.pid)
                after = redis_info(server.port)
                n = max(int(res["requests"]), 1)
                cmd_us, cpu_us, sent = decision_cost(before, after, n)
                res["app_cpu_us_per_request"] = (app1 - app0) * 1e6 / n
                res["redis_us_per_decision"] = cmd_us
                res["redis_cpu_us_per_decision"] = cpu_us
                runs[kind].append(res)
                if rnd == 1:
                    print(f"commands {kind}: {sent} per decision (script-inner ones included here)")
                print(f"round {rnd} {kind:20} {res['rps']:9.1f} req/s  p99 {res['p99_ms']:7.2f} ms  "
                      f"redis {cmd_us:6.2f} us/decision (command), {cpu_us:6.2f} us (server CPU)  "
                      f"app CPU {res['app_cpu_us_per_request']:6.1f} us/request  non-2xx {res['non2xx']}", flush=True)
        med = {k: {m: statistics.median(r[m] for r in v) for m in v[0]} for k, v in runs.items()}
        for kind in TARGETS:
            m = med[kind]
            print(f"MEDIAN {kind:20} {m['rps']:9.1f} req/s  p99 {m['p99_ms']:7.2f} ms  "
                  f"redis {m['redis_us_per_decision']:6.2f} us/decision (command), "
                  f"{m['redis_cpu_us_per_decision']:6.2f} us (server CPU)  "
                  f"app CPU {m['app_cpu_us_per_request']:6.1f} us/request")
        for kind, peer in PAIRS:
            # per round, against the peer's run of the same round: steadier
            # than the ratio of medians on a shared machine
            def ratio(field: str) -> float:
                return statistics.median(a[field] / b[field] for a, b in zip(runs[kind], runs[peer]))
            rps, cmd, cpu = ratio("rps"), ratio("redis_us_per_decision"), ratio("redis_cpu_us_per_decision")
            app = ratio("app_cpu_us_per_request")
            print(f"RATIO {kind}_rps_vs_{peer} {rps:.2f}")
            print(f"RATIO {kind}_redis_cmd_vs_{peer} {cmd:.2f}")
            print(f"RATIO {kind}_redis_cpu_vs_{peer} {cpu:.2f}")
            print(f"RATIO {kind}_app_cpu_vs_{peer} {app:.2f}")
            # what the peer's decisions cost Redis outside their command: a
            # store sending one command per decision costs at least that
            outside = med[peer]["redis_cpu_us_per_decision"] - med[peer]["redis_us_per_decision"]
            met = rps >= 1.0 and cmd <= 0.5
            print(f"TARGET {kind}: throughput {rps:.2f}x (>= 1.0) and Redis command time per decision "
                  f"{cmd:.2f}x (<= 0.5) the peer's: {'met' if met else 'NOT met'}; server CPU {cpu:.2f}x "
                  f"(outside the command, one command per decision costs {outside:.2f} of the peer's "
                  f"{med[peer]['redis_cpu_us_per_decision']:.2f} us)")
        return 0  # a missed target is a result, said on its TARGET line
    finally:
        for a in apps.values():
            a.close()
        server.close()


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "serve":
        serve(sys.argv[2], int(os.environ["PORT"]), os.environ["REDIS_URL"])
    else:
        sys.exit(main())
