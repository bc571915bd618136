"""A FastAPI app that rate-limits its callers and serializes a job through sluicegate.

    pip install sluicegate fastapi hypercorn
    make run   # a node on 127.0.0.1:8000 with deploy/example.toml, in another terminal
    SLUICEGATE_URLS=ws://127.0.0.1:8000 hypercorn examples.fastapi_app:app --bind 127.0.0.1:8080

    curl 127.0.0.1:8080/search?q=trio -H 'X-User: ada'   # 429 with Retry-After past 20 at once
    curl -X POST 127.0.0.1:8080/reindex                  # one reindex at a time, cluster-wide

One client for the whole app, opened and closed with it (the lifespan); every request shares
its connection. SLUICEGATE_URLS names the nodes, comma-separated.
"""

from __future__ import annotations

import asyncio
import math
import os
from contextlib import asynccontextmanager

from fastapi import FastAPI, Header, HTTPException, Request

from sluicegate import client as sluicegate


@asynccontextmanager
async def lifespan(app: FastAPI):
    urls = os.environ.get("SLUICEGATE_URLS", "ws://127.0.0.1:8000").split(",")
    async with await sluicegate.connect(urls) as client:
        app.state.sluicegate = client
        yield


app = FastAPI(lifespan=lifespan)


@app.get("/search")
async def search(request: Request, q: str, x_user: str = Header("anonymous")) -> dict:
    decision = await request.app.state.sluicegate.check("api", key=x_user)
    if not decision.go:
        retry_after = str(math.ceil(decision.retry_after))
        raise HTTPException(429, "slow down", headers={"Retry-After": retry_after})
    return {"q": q, "results": [], "left": decision.remaining}


@app.post("/reindex")
async def reindex(request: Request) -> dict:
    client = request.app.state.sluicegate
    try:
        # B is a mutex in deploy/example.toml: one reindex at a time, across every replica.
        async with client.lock("B", timeout=2) as lease:
            await asyncio.sleep(0.2)  # the work; pass lease.fencing_token to what it writes
            return {"reindexed": True, "fencing_token": lease.fencing_token}
    except sluicegate.LockTimeout:
        raise HTTPException(409, "a reindex is running") from None
