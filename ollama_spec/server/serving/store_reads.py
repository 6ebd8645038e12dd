"""A request's store reads: within one HTTP request (the app's Leases opens `one_read_each`), a name is read from
the store once, and what was read is what the request is served with: the forwarder's question whether this
server runs it (serve --upstream), the load, a reload for a larger context, /api/show."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from ollama_spec.models.store import StoredModel

# the current request's reads by the name asked; None outside a request: every call reads the store
READS: ContextVar[dict[str, StoredModel] | None] = ContextVar("store_reads", default=None)


@contextmanager
def one_read_each() -> Iterator[None]:
    """Within: each name is read from the store once (a thread started inside shares the reads)."""
    token = READS.set({})
    try:
        yield
    finally:
        READS.reset(token)


def read_once(name: str, read: Callable[[str], StoredModel]) -> StoredModel:
    """`read(name)`, or what it gave earlier in this request (blocks when it reads: run it on a thread)."""
    reads = READS.get()
    if reads is None:
        return read(name)
    if name not in reads:
        reads[name] = read(name)
    return reads[name]


def forget(name: str) -> None:
    """Read `name` afresh next time (what was read has gone: a delete closed its pair)."""
    reads = READS.get()
    if reads is not None:
        reads.pop(name, None)
