"""A thin HTTP client of the simulator for its tests."""

from __future__ import annotations

from typing import Any

import aiohttp


class Api:
    """A thin HTTP client: every call answers ``(status, json body)``."""

    def __init__(self, http: aiohttp.ClientSession, base_url: str, key: str | None) -> None:
        self.http = http
        self.base_url = base_url
        self.key = key

    def headers(self, key: str | None = None) -> dict[str, str]:
        token = key or self.key
        return {"Authorization": f"Bearer {token}"} if token else {}

    async def call(
        self, method: str, path: str, body: Any = None, *, key: str | None = None,
        params: dict[str, str] | None = None, **kwargs: Any,
    ) -> tuple[int, Any]:  # fmt: skip
        async with self.http.request(
            method, self.base_url + path, json=body, headers=self.headers(key), params=params,
            **kwargs,
        ) as resp:  # fmt: skip
            self.last_headers = resp.headers
            if resp.content_type == "application/json":
                return resp.status, await resp.json()
            return resp.status, await resp.text()

    async def get(self, path: str, **kwargs: Any) -> tuple[int, Any]:
        return await self.call("GET", path, **kwargs)

    async def post(self, path: str, body: Any = None, **kwargs: Any) -> tuple[int, Any]:
        return await self.call("POST", path, body, **kwargs)

    async def put(self, path: str, body: Any = None, **kwargs: Any) -> tuple[int, Any]:
        return await self.call("PUT", path, body, **kwargs)

    async def delete(self, path: str, **kwargs: Any) -> tuple[int, Any]:
        return await self.call("DELETE", path, **kwargs)

    async def charge(self, amount: int, **fields: Any) -> dict[str, Any]:
        body = {"account_token": "9411111111111111", "expiration": "1230", "amount": amount}
        status, answer = await self.post("/api/v1/charge", {**body, **fields})
        assert status == 200, answer
        return answer
