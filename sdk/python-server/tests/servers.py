"""Real processes for the tests: redis-server or valkey-server with the rl
module on a free loopback port (stopped and started again on the same port
for the failure tests), and framework apps under uvicorn or Flask's server
in a child process. Standard library only; every wait is bounded."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List, Optional

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent.parent
VALKEY = Path(os.environ.get("RL_VALKEY_SERVER", Path.home() / ".cache/rl/valkey-8.1.8/bin/valkey-server"))


def module_path() -> str:
    path = os.environ.get("RL_MODULE", str(ROOT / "target/release/librl.so"))
    if not Path(path).is_file():
        raise RuntimeError(f"the rl module is missing at {path}: run `cargo build --release`")
    return path


def free_port(below: int = 65536) -> int:
    """A 127.0.0.1 TCP port below ``below`` that was free a moment ago."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port < below:
            return port
    raise RuntimeError(f"no free port below {below}")


def wait_port(port: int, proc: subprocess.Popen[bytes], what: str, timeout: float = 20.0) -> None:
    """Waits until ``port`` accepts connections (or ``proc`` exits)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on {port} within {timeout} s")


def server_binary(flavour: str) -> str:
    if flavour == "valkey":
        if not VALKEY.is_file():
            raise RuntimeError(f"Valkey is missing at {VALKEY}: run .ci/get-valkey")
        return str(VALKEY)
    found = shutil.which("redis-server")
    if not found:
        raise RuntimeError("redis-server is missing: install Debian's redis-server")
    return found


class RedisServer:
    """A redis-server (or valkey-server) with the rl module."""

    def __init__(self, flavour: str = "redis", extra: Optional[List[str]] = None) -> None:
        self.flavour = flavour
        # a cluster node's bus listens on port + 10000
        self.port = free_port(55000 if "--cluster-enabled" in (extra or []) else 65536)
        self.dir = tempfile.mkdtemp(prefix="rl-server-test-")
        self.extra = extra or []
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def start(self) -> None:
        args = [server_binary(self.flavour), "--port", str(self.port), "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "no", "--dir", self.dir,
                "--loadmodule", module_path(), *self.extra]
        log = open(Path(self.dir) / "server.log", "ab")
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        wait_port(self.port, self.proc, self.flavour)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class App:
    """A Python program (an app under uvicorn or Flask) in a child process,
    given ``REDIS_URL`` and ``PORT``; ``url`` is its base URL."""

    def __init__(self, argv: List[str], env: dict[str, str]) -> None:
        self.port = free_port()
        full = {**os.environ, **env, "PORT": str(self.port), "PYTHONUNBUFFERED": "1"}
        self.log = tempfile.NamedTemporaryFile(prefix="rl-app-", suffix=".log", delete=False)
        self.proc = subprocess.Popen([sys.executable, *argv], env=full, cwd=str(HERE),
                                     stdout=self.log, stderr=subprocess.STDOUT)
        try:
            wait_port(self.port, self.proc, " ".join(argv))
        except RuntimeError:
            self.close()
            raise RuntimeError(self.output())

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def output(self) -> str:
        return Path(self.log.name).read_text(errors="replace")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if os.path.exists(self.log.name):  # closed once already
            os.unlink(self.log.name)


def key_offset_ms(key: bytes, window_ms: int) -> int:
    """rl's boundary offset of a window key (FNV-1a 64, fmix64, scaled)."""
    mask = (1 << 64) - 1
    h = 0xCBF29CE484222325
    for b in key:
        h = ((h ^ b) * 0x100000001B3) & mask
    h ^= h >> 33
    h = (h * 0xFF51AFD7ED558CCD) & mask
    h ^= h >> 33
    h = (h * 0xC4CEB9FE1A85EC53) & mask
    h ^= h >> 33
    return (h * window_ms) >> 64


def avoid_boundary(key: str, window_s: int, margin_s: float = 10.0) -> bool:
    """Waits past the next fixed/sliding boundary of ``key``'s windows when it
    is less than ``margin_s`` away (so that a burst of calls falls in one
    window); True when it waited."""
    window_ms = window_s * 1000
    off = key_offset_ms(key.encode(), window_ms)
    now = int(time.time() * 1000)
    left = window_ms - (now - off) % window_ms
    if left >= margin_s * 1000:
        return False
    time.sleep(left / 1000 + 0.3)
    return True


def boundary_between(key: str, window_s: int, t0: float, t1: float) -> bool:
    """Whether a boundary of ``key``'s windows falls between the times
    ``t0`` and ``t1`` (seconds since the epoch)."""
    window_ms = window_s * 1000
    off = key_offset_ms(key.encode(), window_ms)
    return (int(t0 * 1000) - off) // window_ms != (int(t1 * 1000) - off) // window_ms
