"""One store read per request (serving/store_reads.py): inside `one_read_each` a name is read once, threads
started there included; outside, every call reads; `forget` reads again."""

import asyncio

from ollama_spec.server.serving.store_reads import forget, one_read_each, read_once


def reader(reads: list[str]):
    def read(name: str) -> str:
        reads.append(name)
        return f"stored {name}"

    return read


def test_a_name_is_read_once_within_a_request_and_each_time_outside():
    reads: list[str] = []
    with one_read_each():
        assert [read_once("a", reader(reads)) for _ in range(3)] == ["stored a"] * 3
        read_once("b", reader(reads))
    read_once("a", reader(reads))
    read_once("a", reader(reads))
    assert reads == ["a", "b", "a", "a"]


def test_a_thread_started_in_the_request_shares_its_reads():
    reads: list[str] = []

    async def request():
        with one_read_each():
            await asyncio.to_thread(read_once, "a", reader(reads))
            return read_once("a", reader(reads))

    assert asyncio.run(request()) == "stored a" and reads == ["a"]


def test_a_forgotten_name_is_read_again():
    reads: list[str] = []
    with one_read_each():
        read_once("a", reader(reads))
        forget("a")
        read_once("a", reader(reads))
    assert reads == ["a", "a"]


def test_a_failed_read_is_not_kept():
    calls = []

    def failing(name):
        calls.append(name)
        raise LookupError(name)

    with one_read_each():
        for _ in range(2):
            try:
                read_once("a", failing)
            except LookupError:
                pass
    assert calls == ["a", "a"]
