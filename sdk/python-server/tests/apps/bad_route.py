"""A FastAPI app whose route declares a bad option (RL_BAD names which):
uvicorn must refuse to start, the error naming the option."""

import os

from fastapi import FastAPI

from rl_server.asgi import install
from rl_server.routes import Concurrency, Rate, Route

BAD = {
    "capacity": {"routes": {"GET /x": Route(rates=[Rate("r", "k", 0, 1, 60)])}},
    "on_redis_failure": {"routes": {"GET /x": Route(rates=[Rate("r", "k", 1, 1, 60)],
                                                    on_redis_failure="open")}},
    "timeout": {"routes": {"GET /x": Route(rates=[Rate("r", "k", 1, 1, 60)])}, "timeout": 0},
    "max": {"routes": {"GET /x": Route(leases=[Concurrency("c", "k", 0)])}},
}

app = FastAPI()
install(app, redis=os.environ["REDIS_URL"], **BAD[os.environ["RL_BAD"]])
