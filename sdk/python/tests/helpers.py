"""Helpers that let one test body drive the sync and the async API alike."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any


async def aw(value: Any) -> Any:
    """The value itself, or what it resolves to when it is awaitable (sync/async tests)."""
    if hasattr(value, "__await__"):
        return await value
    return value


async def collect(iterable: Any) -> list[Any]:
    """All items of a sync or async iterable."""
    if hasattr(iterable, "__aiter__"):
        return [item async for item in iterable]
    return list(iterable)


@contextlib.asynccontextmanager
async def ctx(manager: Any) -> AsyncIterator[Any]:
    """Enters a sync or async context manager (awaiting it first if needed)."""
    if hasattr(manager, "__aenter__"):
        async with manager as value:
            yield value
        return
    manager = await aw(manager)
    if hasattr(manager, "__aenter__"):
        async with manager as value:
            yield value
    else:
        with manager as value:
            yield value
