"""A Starlette app whose lease lasts 2 s unless renewed, for the renewal
test: /work?seconds=N holds it N seconds."""

import asyncio
import os

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route as Path

from rl_server.asgi import install
from rl_server.routes import Concurrency, Route


async def work(request: Request) -> JSONResponse:
    await asyncio.sleep(float(request.query_params.get("seconds", "0")))
    return JSONResponse({"done": True})


app = Starlette(routes=[Path("/work", work)])
install(app, redis=os.environ["REDIS_URL"], timeout=2,
        routes={"GET /work": Route(leases=[Concurrency("short", "rl:short", 1, ttl=2)])})

if __name__ == "__main__":
    import uvicorn
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ["PORT"]), log_level="warning")
