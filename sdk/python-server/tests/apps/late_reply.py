"""A Starlette app for the late-reply tests: each route spends from EXACT
windows of 600 s (nothing comes back by itself during a test), a Redis
budget of 0.3 s. /closed fails closed, /local falls back to the local
limiter, /two charges a window then a quota (whose key the test may make a
string, so that the second command fails)."""

import os

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route as Path

from rl_server.asgi import install
from rl_server.routes import Quota, Route, Window


async def ok(request: Request) -> JSONResponse:
    return JSONResponse({"ok": True})


app = Starlette(routes=[Path(p, ok) for p in ("/closed", "/local", "/two")])
install(app, redis=os.environ["REDIS_URL"], timeout=0.3, routes={
    "GET /closed": Route(windows=[Window("closed", "rl:late:closed", 10, 600, "EXACT")]),
    "GET /local": Route(windows=[Window("local", "rl:late:local", 10, 600, "EXACT")],
                        on_redis_failure="local"),
    "GET /two": Route(windows=[Window("two", "rl:late:two", 10, 600, "EXACT")],
                      quotas=[Quota("two-quota", "rl:late:two-quota", 100, "MONTH")]),
})

if __name__ == "__main__":
    import uvicorn
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ["PORT"]), log_level="warning")
