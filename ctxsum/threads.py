"""Where the async API runs its database work (``database_sync_to_async``).

By default as ``asgiref``'s ``sync_to_async`` runs thread-sensitive code: in the thread of
the caller that went through ``async_to_sync`` (a test, a management command), else in the
request's own thread under Django's ASGI handler. Inside ``database_executor(executor)``,
in ``executor`` instead, the connections of its threads kept from call to call unless
they broke: the chat endpoint under ASGI runs every turn's database work in one thread of
the process this way, so that the turns hold one connection however many stream.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from contextvars import ContextVar
from functools import wraps
from typing import ParamSpec, TypeVar

from asgiref.sync import sync_to_async
from django.db import connections

P = ParamSpec("P")
R = TypeVar("R")

_executor: ContextVar[ThreadPoolExecutor | None]
_executor = ContextVar("ctxsum_database_executor", default=None)


def database_sync_to_async(func: Callable[P, R]) -> Callable[P, Awaitable[R]]:
    """``func`` as a coroutine function that runs it where the database work of the
    current context runs (see the module)."""

    @wraps(func)
    async def call(*args: P.args, **kwargs: P.kwargs) -> R:
        executor = _executor.get()
        if executor is None:
            return await sync_to_async(func)(*args, **kwargs)
        fresh = sync_to_async(_between_closes, thread_sensitive=False, executor=executor)
        result: R = await fresh(func, *args, **kwargs)
        return result

    return call


@contextmanager
def database_executor(executor: ThreadPoolExecutor) -> Iterator[None]:
    """Run the database work of the async API in ``executor`` within the block."""
    token = _executor.set(executor)
    try:
        yield
    finally:
        _executor.reset(token)


def _between_closes(func: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    # The executor's thread keeps its connection from call to call (it is the process's
    # one), as a request would for CONN_MAX_AGE: one that broke, or was left in a
    # transaction, is closed before the next call opens another.
    _close_unusable()
    try:
        return func(*args, **kwargs)
    finally:
        _close_unusable()


def _close_unusable() -> None:
    for connection in connections.all(initialized_only=True):
        if connection.connection is None:
            continue
        broken = connection.errors_occurred and not connection.is_usable()
        if broken or not connection.get_autocommit():
            connection.close()
