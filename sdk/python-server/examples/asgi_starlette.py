"""rl's ASGI middleware on plain Starlette: a per-client bucket on one
route and a concurrency lease on another.

    pip install '.[asgi]' uvicorn
    REDIS_URL=redis://127.0.0.1:6379 python examples/asgi_starlette.py
    curl -i http://127.0.0.1:8000/hello
"""

import asyncio
import os

import uvicorn
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route as Path

from rl_server.asgi import RateLimitMiddleware
from rl_server.routes import Concurrency, Rate, Route


async def hello(request: Request) -> JSONResponse:
    return JSONResponse({"hello": "world"})


async def work(request: Request) -> JSONResponse:
    await asyncio.sleep(float(request.query_params.get("seconds", "0")))
    return JSONResponse({"done": True})


routes = {
    "GET /hello": Route(rates=[Rate("per-client", "rl:hello:{client}", 30, 30, 60)]),
    "GET /work": Route(leases=[Concurrency("workers", "rl:work", 3, ttl=30)]),
}

app = Starlette(
    routes=[Path("/hello", hello), Path("/work", work)],
    middleware=[Middleware(RateLimitMiddleware, redis=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379"),
                           routes=routes)],
)

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ.get("PORT", "8000")), log_level="warning")
