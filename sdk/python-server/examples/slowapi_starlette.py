"""slowapi on plain Starlette with rl as its storage.

    pip install '.[limits]' slowapi uvicorn
    RL_STORAGE_URI=rl://127.0.0.1:6379 python examples/slowapi_starlette.py
    curl -i http://127.0.0.1:8000/hello
"""

import os

import uvicorn
from slowapi import Limiter, _rate_limit_exceeded_handler
from slowapi.errors import RateLimitExceeded
from slowapi.util import get_remote_address
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import rl_server.limits_storage  # noqa: F401  registers the rl:// storage

limiter = Limiter(
    key_func=get_remote_address,
    storage_uri=os.environ.get("RL_STORAGE_URI", "rl://127.0.0.1:6379"),
    strategy=os.environ.get("RL_STRATEGY", "fixed-window"),
)


@limiter.limit("30/minute")
async def hello(request: Request) -> JSONResponse:
    return JSONResponse({"ok": True})


app = Starlette(routes=[Route("/hello", hello)])
app.state.limiter = limiter
app.add_exception_handler(RateLimitExceeded, _rate_limit_exceeded_handler)  # type: ignore[arg-type]

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ.get("PORT", "8000")), log_level="warning")
