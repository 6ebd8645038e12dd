"""How the kernel weighs a served stream's threads (Linux): the HTTP side's threads wait for a core when
they wake, the step loop's thread keeps the one it runs on.

A served stream wakes the HTTP side's event loop several times a request (the request's bytes, its first
piece, the looks for the pieces between, its end) and the client with each chunk. On a machine whose
cores are all busy, Linux lets a thread that wakes from a short sleep preempt the thread running on its
core, and that thread is mostly the step loop's, in the middle of a step: on demo-store's tiny pair
(a step well under a millisecond) the served step loop was preempted 12-16 times a request against about
2 in process. A SCHED_BATCH thread never preempts on waking: it waits for the running thread's slice or
a free core, and otherwise gets its share of the CPU as before."""

from __future__ import annotations

import os


def yield_on_wake() -> None:
    """An ordinary (SCHED_OTHER) calling thread, and the threads it starts from now on (they inherit its
    policy), become SCHED_BATCH: woken, they wait for a core rather than preempt the thread running
    there. Nothing where the platform has no such policy, or the thread runs as a user chose (`chrt`)."""
    _set_policy("SCHED_BATCH", only_from="SCHED_OTHER")


def run_normally() -> None:
    """A calling thread that inherited SCHED_BATCH runs SCHED_OTHER (the step loop's thread is started
    by the first request's, on the event loop's thread); any other policy (a real-time one a user chose)
    stays."""
    _set_policy("SCHED_OTHER", only_from="SCHED_BATCH")


def _set_policy(name: str, only_from: str | None = None) -> None:
    policy = getattr(os, name, None)
    if policy is None or not hasattr(os, "sched_setscheduler"):
        return
    try:
        now = os.sched_getscheduler(0)
        if now != policy and (only_from is None or now == getattr(os, only_from)):
            os.sched_setscheduler(0, policy, os.sched_param(0))
    except OSError:  # refused (a sandbox): the thread runs as it was started
        pass
