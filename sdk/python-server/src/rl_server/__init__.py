"""rl on the server side of Python applications: typed rl commands for
redis-py (sync, asyncio, cluster), a ``limits`` storage (``rl://``) for
slowapi and flask-limiter, and an ASGI middleware for Starlette/FastAPI."""

from .client import RL, AsyncRL
from .commands import Bucket, Command, Penalty, Quota, Window
from .decisions import BoxStatus, Decision, Lease, ReplyError, Status, Throttle

__all__ = ["RL", "AsyncRL", "Bucket", "Command", "Penalty", "Quota", "Window", "BoxStatus",
           "Decision", "Lease", "ReplyError", "Status", "Throttle"]
