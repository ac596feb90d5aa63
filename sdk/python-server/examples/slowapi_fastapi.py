"""slowapi on FastAPI with rl as its storage: the usual slowapi code, with
the storage URI ``rl://`` (and the import that registers it).

    pip install '.[limits]' slowapi fastapi uvicorn
    RL_STORAGE_URI=rl://127.0.0.1:6379 python examples/slowapi_fastapi.py
    curl -i http://127.0.0.1:8000/hello
"""

import os

import uvicorn
from fastapi import FastAPI, Request, Response
from slowapi import Limiter, _rate_limit_exceeded_handler
from slowapi.errors import RateLimitExceeded
from slowapi.util import get_remote_address

import rl_server.limits_storage  # noqa: F401  registers the rl:// storage

limiter = Limiter(
    key_func=get_remote_address,
    storage_uri=os.environ.get("RL_STORAGE_URI", "rl://127.0.0.1:6379"),
    strategy=os.environ.get("RL_STRATEGY", "moving-window"),
    headers_enabled=True,
)
app = FastAPI()
app.state.limiter = limiter
app.add_exception_handler(RateLimitExceeded, _rate_limit_exceeded_handler)  # type: ignore[arg-type]


@app.get("/hello")
@limiter.limit("30/minute")
async def hello(request: Request, response: Response) -> dict[str, bool]:
    # slowapi's headers_enabled writes its X-RateLimit-* headers into `response`
    return {"ok": True}


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ.get("PORT", "8000")), log_level="warning")
