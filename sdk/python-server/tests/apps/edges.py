"""A Starlette app for the middleware's edge cases, run by uvicorn with
RL_ROOT_PATH as its root path (behind a proxy that strips a prefix):
/hello spends a bucket of 3 and /work holds a lease of 1 (declared on the
app), /v1/hello a bucket of 3 declared on a sub-app under Mount("/v1");
POST /bulk?points=N costs N (an async cost function) from a bucket of 10
and falls back to the local limiter at full size when Redis fails; POST
/pay requires an Idempotency-Key, POST /shadow-pay too, in shadow mode
with a bucket of 1."""

import asyncio
import os

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Mount
from starlette.routing import Route as Path

from rl_server.asgi import install
from rl_server.routes import Concurrency, Rate, Route

REDIS = os.environ["REDIS_URL"]


async def hello(request: Request) -> JSONResponse:
    return JSONResponse({"path": request.scope["path"]})


async def points(request: Request) -> int:
    return int(request.query_params.get("points", "1"))


async def work(request: Request) -> JSONResponse:
    await asyncio.sleep(float(request.query_params.get("seconds", "0")))
    return JSONResponse({"done": True})


v1 = Starlette(routes=[Path("/hello", hello)])
install(v1, redis=REDIS, routes={"GET /hello": Route(rates=[Rate("v1-hello", "rl:v1:{client}", 3, 3, 60)])})

app = Starlette(routes=[Path("/hello", hello), Path("/work", work), Path("/bulk", work, methods=["POST"]),
                        Path("/pay", work, methods=["POST"]), Path("/shadow-pay", work, methods=["POST"]),
                        Mount("/v1", app=v1)])
install(app, redis=REDIS, fallback_ratio=1.0, routes={
    "GET /hello": Route(rates=[Rate("hello", "rl:hello:{client}", 3, 3, 60)]),
    "GET /work": Route(leases=[Concurrency("work", "rl:work", 1, ttl=30)]),
    "POST /bulk": Route(rates=[Rate("bulk", "rl:bulk:{client}", 10, 10, 60)], cost=points,
                        on_redis_failure="local"),
    "POST /pay": Route(idempotency_key=True),
    "POST /shadow-pay": Route(rates=[Rate("shadow-pay", "rl:shadow-pay:{client}", 1, 1, 60)],
                              idempotency_key=True, shadow=True),
})

if __name__ == "__main__":
    import uvicorn
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ["PORT"]), log_level="warning",
                root_path=os.environ.get("RL_ROOT_PATH", ""))
