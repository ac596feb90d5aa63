"""rl's ASGI middleware on FastAPI: a payments API whose routes declare
what they spend and hold.

    pip install '.[asgi]' fastapi uvicorn
    REDIS_URL=redis://127.0.0.1:6379 python examples/asgi_fastapi.py
    curl -i -H 'X-Api-Key: k1' -H 'X-Tenant: acme' -H 'Idempotency-Key: p-1' -X POST http://127.0.0.1:8000/payments
"""

import asyncio
import os

import uvicorn
from fastapi import FastAPI, Request

from rl_server import Penalty
from rl_server.asgi import install
from rl_server.routes import Concurrency, Lock, Quota, Rate, Route, Window


def api_key(r: Request) -> str:
    return r.headers.get("x-api-key", "anonymous")


def tenant(r: Request) -> str:
    return r.headers.get("x-tenant", "none")


def amount_cost(r: Request) -> int:
    """Bulk payouts cost one point per 10 items (at least 1)."""
    return max(int(r.query_params.get("items", "1")) // 10, 1)


routes = {
    # a key's bucket and its tenant's, charged together (one hash tag per tenant)
    "POST /payments": Route(
        rates=[Rate("per-key", lambda r: f"rl:{{t:{tenant(r)}}}:key:{api_key(r)}", 10, 10, 60),
               Rate("per-tenant", lambda r: f"rl:{{t:{tenant(r)}}}:tenant", 30, 30, 60)],
        windows=[Window("payments-per-minute", lambda r: f"rl:{{t:{tenant(r)}}}:pay:1m", 20, 60, "EXACT")],
        quotas=[Quota("monthly", lambda r: f"rl:{{t:{tenant(r)}}}:month", 1000, "MONTH")],
        cost=amount_cost, idempotency_key=True, tier="growth",
        penalty=Penalty(3, 60, box=(30, 300, 0)),
    ),
    # three reports per calendar month per tenant, then 403
    "GET /reports": Route(quotas=[Quota("monthly-reports", lambda r: f"rl:reports:{tenant(r)}", 3, "MONTH")]),
    # a probe-heavy read with a local fallback when Redis is down
    "GET /balance": Route(rates=[Rate("balance", lambda r: f"rl:balance:{api_key(r)}", 5, 5, 60)],
                          on_redis_failure="local"),
    # one reconciliation per ledger at a time: a second one is answered 409 at once
    "POST /ledgers/{ledger}/reconcile": Route(leases=[Lock("reconcile-ledger", "rl:lock:ledger:{ledger}",
                                                           ttl=30, expected=2)]),
    # at most 2 exports at once per tenant, held for the whole request
    "GET /exports": Route(leases=[Concurrency("exports", lambda r: f"rl:exports:{tenant(r)}", 2, ttl=30)]),
    # measured, never refused
    "GET /search": Route(rates=[Rate("search", "rl:search:{client}", 3, 3, 60)], shadow=True),
}

app = FastAPI()
install(app, redis=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379"),
                   routes=routes, timeout=float(os.environ.get("RL_TIMEOUT", "0.5")))


@app.post("/payments")
async def pay() -> dict[str, str]:
    return {"status": "accepted"}


@app.get("/reports")
async def reports() -> dict[str, str]:
    return {"report": "ready"}


@app.get("/balance")
async def balance() -> dict[str, int]:
    return {"balance": 100}


@app.post("/ledgers/{ledger}/reconcile")
async def reconcile(ledger: str, seconds: float = 0) -> dict[str, str]:
    await asyncio.sleep(seconds)
    return {"ledger": ledger, "status": "reconciled"}


@app.get("/exports")
async def export(seconds: float = 0) -> dict[str, str]:
    await asyncio.sleep(seconds)
    return {"status": "exported"}


@app.get("/search")
async def search() -> dict[str, list[str]]:
    return {"results": []}


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ.get("PORT", "8000")), log_level="warning")
