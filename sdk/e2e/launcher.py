#!/usr/bin/env python3
"""Starts what the SDK end-to-end tests talk to: a redis-server with the rl
module and an nginx (Debian's nginx-extras, or OpenResty) running the
gateway (``gateway/lib``) with the SDK test policy (``policy.lua`` here) in
front of the stand-in upstream (``upstream.lua`` here), on free 127.0.0.1
ports, in a fresh temporary directory. Standard library only.

As a library (the Python tests' fixture)::

    with Gateway.start() as gw:
        gw.url            # http://127.0.0.1:<port> of the gateway
        gw.upstream_url   # the upstream itself (GET /_count?key=K)
        gw.redis("RL.BOX", "STATUS", "rl:{t:t-honour}:key:honour")

As a program (the TypeScript tests): ``python3 launcher.py`` prints one JSON
line ``{"url", "upstream_url", "redis_port", "dir"}`` once everything
answers, and stops everything when its standard input closes (or on
SIGTERM/SIGINT). Environment: ``RL_MODULE`` (default
``target/release/librl.so`` of the repository), ``REDIS_SERVER``
(``redis-server``), ``NGINX`` (``nginx``), ``NGINX_MODULES``
(``/usr/lib/nginx/modules``), ``RL_KEEP_TEST_DIRS`` (keep the directory),
``RL_E2E_POLICY`` (another policy file, e.g. ``responses_policy.lua``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, List, Optional, Union

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
GATEWAY = REPO / "gateway"
#: Longest wait for a server to answer after it was started.
READY_SECONDS = 15.0
#: Starts tried when a port was taken between choosing it and the bind.
START_ATTEMPTS = 3


def free_port() -> int:
    """A 127.0.0.1 TCP port that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def module_path() -> Path:
    """The rl module to load: ``RL_MODULE`` or the release build."""
    path = Path(os.environ.get("RL_MODULE", REPO / "target/release/librl.so")).resolve()
    if not path.is_file():
        raise RuntimeError(f"rl module not found at {path}: run `cargo build --release` "
                           "(make build) or set RL_MODULE")
    return path


def _encode(args: List[Union[str, int]]) -> bytes:
    out = [f"*{len(args)}\r\n".encode()]
    for a in args:
        b = str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


def _read_reply(f: "socket.SocketIO") -> object:
    line = f.readline()
    if not line:
        raise ConnectionError("redis closed the connection")
    kind, rest = line[:1], line[1:-2].decode()
    if kind == b"+":
        return rest
    if kind == b"-":
        raise RuntimeError(f"redis error: {rest}")
    if kind == b":":
        return int(rest)
    if kind == b"$":
        n = int(rest)
        if n < 0:
            return None
        data = f.read(n + 2)
        return data[:-2].decode()
    if kind == b"*":
        n = int(rest)
        return None if n < 0 else [_read_reply(f) for _ in range(n)]
    raise RuntimeError(f"unexpected redis reply {line!r}")


def redis_call(port: int, *args: Union[str, int], timeout: float = 5.0) -> object:
    """One command to the Redis on ``port`` (a minimal RESP2 client)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(_encode(list(args)))
        with s.makefile("rb") as f:
            return _read_reply(f)  # type: ignore[arg-type]


def policy_file() -> Path:
    """The gateway policy: ``RL_E2E_POLICY`` (a Lua file returning a
    function of the Redis port, as ``policy.lua`` here) or ``policy.lua``."""
    return Path(os.environ.get("RL_E2E_POLICY", HERE / "policy.lua")).resolve()


def _nginx_conf(gw_port: int, up_port: int, redis_port: int) -> str:
    modules = Path(os.environ.get("NGINX_MODULES", "/usr/lib/nginx/modules"))
    loads = ""
    if (modules / "ngx_http_lua_module.so").is_file():
        if (modules / "ndk_http_module.so").is_file():
            loads += f"load_module {modules / 'ndk_http_module.so'};\n"
        loads += f"load_module {modules / 'ngx_http_lua_module.so'};\n"
    return f"""{loads}
worker_processes 2;
daemon off;
master_process on;
pid logs/nginx.pid;
error_log logs/error.log warn;
events {{ worker_connections 512; }}
http {{
    access_log off;
    client_body_temp_path tmp/body;
    proxy_temp_path tmp/proxy;
    fastcgi_temp_path tmp/fastcgi;
    uwsgi_temp_path tmp/uwsgi;
    scgi_temp_path tmp/scgi;
    lua_package_path "{GATEWAY}/lib/?.lua;{HERE}/?.lua;/usr/share/lua/5.1/?.lua;;";
    lua_shared_dict rl_metrics 1m;
    lua_shared_dict sdk_idem 1m;
    lua_socket_log_errors off;
    init_by_lua_block {{
        local front = require "resty.rl.nginx"
        front.configure("sdk", dofile("{policy_file()}")({redis_port}))
        -- loaded by the master: the workers may run as another user
        require "upstream"
    }}
    server {{
        listen 127.0.0.1:{gw_port};
        location / {{
            access_by_lua_block {{ require("resty.rl.nginx").access("sdk") }}
            header_filter_by_lua_block {{ require("resty.rl.nginx").header_filter("sdk") }}
            log_by_lua_block {{ require("resty.rl.nginx").log("sdk") }}
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_pass http://127.0.0.1:{up_port};
        }}
    }}
    server {{
        listen 127.0.0.1:{up_port};
        location / {{ content_by_lua_block {{ require("upstream").serve() }} }}
    }}
}}
"""


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _stop(proc: Optional[subprocess.Popen]) -> None:  # type: ignore[type-arg]
    """TERM to the process group, KILL after 5 s; every wait bounded."""
    if proc is None or proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


class Gateway:
    """A running redis-server + nginx pair (see the module doc)."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.redis_proc: Optional[subprocess.Popen] = None  # type: ignore[type-arg]
        self.nginx_proc: Optional[subprocess.Popen] = None  # type: ignore[type-arg]
        self.redis_port = 0
        self.port = 0
        self.upstream_port = 0

    @property
    def url(self) -> str:
        """The gateway's base URL."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def upstream_url(self) -> str:
        """The upstream's own base URL (bypasses the gateway)."""
        return f"http://127.0.0.1:{self.upstream_port}"

    def redis(self, *args: Union[str, int]) -> object:
        """A command to the test's Redis."""
        return redis_call(self.redis_port, *args)

    def error_log(self) -> str:
        """nginx's error.log (the gateway's structured lines are there)."""
        try:
            return (self.dir / "logs/error.log").read_text(errors="replace")
        except OSError:
            return ""

    def lua_errors(self) -> List[str]:
        """Lua errors, alerts and writes to Lua globals in error.log."""
        marks = ("[error]", "[alert]", "[crit]", "global variable")
        return [line for line in self.error_log().splitlines() if any(m in line for m in marks)]

    @classmethod
    def start(cls) -> "Gateway":
        """Starts Redis then nginx; raises with their logs when either fails."""
        gw = cls(Path(tempfile.mkdtemp(prefix="rl-test-sdk-")))
        # nginx's workers run as another user (nobody) when the tests run as root
        gw.dir.chmod(0o755)
        try:
            gw._start_redis()
            gw._start_nginx()
        except BaseException:
            gw.stop()
            raise
        return gw

    def _wait(self, proc: "subprocess.Popen[bytes]", ready: Callable[[], bool], what: str,
              log: Path) -> bool:
        """True once ``ready()``; False if the process exited first."""
        deadline = time.monotonic() + READY_SECONDS
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                return False
            try:
                if ready():
                    return True
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"{what} did not answer within {READY_SECONDS} s\n{_tail(log)}")

    def _start_redis(self) -> None:
        module = module_path()
        log = self.dir / "redis.log"
        for _ in range(START_ATTEMPTS):
            port = free_port()
            proc = subprocess.Popen(
                [os.environ.get("REDIS_SERVER", "redis-server"), "--port", str(port),
                 "--bind", "127.0.0.1", "--dir", str(self.dir), "--logfile", str(log),
                 "--save", "", "--appendonly", "no", "--daemonize", "no",
                 "--loadmodule", str(module)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                start_new_session=True)
            self.redis_proc, self.redis_port = proc, port
            if self._wait(proc, lambda: redis_call(port, "PING", timeout=1) == "PONG",
                          "redis-server", log):
                return
            if "Address already in use" not in _tail(log):
                raise RuntimeError(f"redis-server exited at startup\n{_tail(log)}")
        raise RuntimeError(f"redis-server: no free port after {START_ATTEMPTS} attempts")

    def _start_nginx(self) -> None:
        for sub in ("logs", "tmp"):
            (self.dir / sub).mkdir(exist_ok=True)
        log = self.dir / "logs/error.log"
        out = self.dir / "logs/stdout.log"
        for _ in range(START_ATTEMPTS):
            self.port, self.upstream_port = free_port(), free_port()
            conf = self.dir / "nginx.conf"
            conf.write_text(_nginx_conf(self.port, self.upstream_port, self.redis_port))
            with open(out, "wb") as stdout:
                proc = subprocess.Popen(
                    [os.environ.get("NGINX", "nginx"), "-p", str(self.dir), "-c", str(conf),
                     "-e", str(log)],
                    stdin=subprocess.DEVNULL, stdout=stdout, stderr=subprocess.STDOUT,
                    start_new_session=True)
            self.nginx_proc = proc

            def answers() -> bool:
                for p in (self.port, self.upstream_port):
                    socket.create_connection(("127.0.0.1", p), timeout=1).close()
                return True

            if self._wait(proc, answers, "nginx", log):
                return
            text = _tail(out) + "\n" + _tail(log)
            if "Address already in use" not in text:
                raise RuntimeError(f"nginx exited at startup\n{text}")
        raise RuntimeError(f"nginx: no free ports after {START_ATTEMPTS} attempts")

    def stop(self) -> None:
        """Stops nginx and Redis and removes the directory (unless
        ``RL_KEEP_TEST_DIRS`` is set)."""
        _stop(self.nginx_proc)
        _stop(self.redis_proc)
        self.nginx_proc = self.redis_proc = None
        if not os.environ.get("RL_KEEP_TEST_DIRS"):
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "Gateway":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main() -> int:
    """Serves until standard input closes or a TERM/INT arrives."""
    gw = Gateway.start()

    def on_signal(signum: int, frame: object) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        print(json.dumps({"url": gw.url, "upstream_url": gw.upstream_url,
                          "redis_port": gw.redis_port, "dir": str(gw.dir)}), flush=True)
        sys.stdin.read()
    finally:
        gw.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
