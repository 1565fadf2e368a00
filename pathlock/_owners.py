"""Who holds a lease: a manager instance's identity plus a holder within it.

The holder is, in this order: the ``owner=`` name the caller gives (a request
id on a thread pool, say); else the asyncio task the call runs in; else the
calling thread's context (see :func:`_context_holder`): the thread itself,
or, for a call that runs in a copy of another thread's context (what
``asyncio.to_thread`` makes of the calling task's), that copy. Holders get
ids of their own here, never the operating system's thread id or ``id()`` of
an object: those are reused as soon as a thread ends or an object is freed,
and would make unrelated work one owner (a pool thread inheriting a finished
thread's locks, a new task a finished task's).
"""

from __future__ import annotations

import asyncio
import contextvars
import getpass
import hashlib
import itertools
import os
import secrets
import threading
import weakref

from pathlock._core import validation
from pathlock.types import DETACHED, Owner

# Process-wide counters: a holder id is never handed out twice in a process.
# A forked child continues the parent's sequence, but its managers have new
# identities, so its keys differ anyway.
_next_id = itertools.count(1)
_threads = threading.local()
# The holder of calls outside tasks, kept in the context they run in, with
# the thread-local marker of the thread that made it (see _context_holder).
_holders: contextvars.ContextVar[tuple[object, str]] = contextvars.ContextVar("pathlock_holder")
# Tasks are weakly referenced: a finished task's entry goes with it, and its
# id is never given to another task.
_tasks: weakref.WeakKeyDictionary[asyncio.Task[object], str] = weakref.WeakKeyDictionary()
_tasks_lock = threading.Lock()


def process_user() -> str:
    """The user this process runs as, for messages and the log of who asked
    for an operator's release: its real uid's account name (``uid N`` for a
    uid without one, as in many containers), and, for root started through
    sudo, who ran sudo. Never ``$USER`` or ``$LOGNAME`` alone: they say
    whatever the caller set."""
    try:
        import pwd  # noqa: PLC0415 - POSIX only
    except ImportError:  # pragma: no cover - Windows has no uids
        return getpass.getuser()
    uid = os.getuid()
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = f"uid {uid}"
    sudo = os.environ.get("SUDO_USER", "")
    if uid == 0 and sudo and sudo != name:
        return f"{name} (through sudo, by {sudo})"
    return name


def new_identity() -> str:
    """A manager instance's random identity: 64 bits, unguessable and, for
    practical purposes, unique among all managers that ever run."""
    return secrets.token_hex(8)


def is_named(owner: Owner) -> bool:
    """Whether ``owner``'s holder is an ``owner=`` name: the only holder that
    can take locks while one of its calls waits (a thread or a task is busy
    in that call)."""
    return owner.key.rpartition(".")[2].startswith("n")


def _holder(name: object) -> str:
    if name is not None:
        digest = hashlib.blake2b(validation.owner(name).encode(), digest_size=12).hexdigest()
        return f"n{digest}"
    task = _current_task()
    if task is not None:
        with _tasks_lock:
            holder = _tasks.get(task)
            if holder is None:
                holder = _tasks[task] = f"a{next(_next_id)}"
        return holder
    return _context_holder()


def _context_holder() -> str:
    """The holder of a call outside any task: the one kept in the current
    context if this thread made it, else a new one, kept there.

    A thread runs in a context of its own (empty when it starts), so each
    thread is a holder. ``asyncio.to_thread`` runs a call in a copy of the
    calling task's context instead, on whichever pool thread is free: a
    holder made there stays in that copy, so two tasks' calls on one pool
    thread are two holders, never that thread's. (Nothing marks the task
    itself: no pathlock code runs in it, and what a task's context holds
    its child tasks inherit.) A copy may carry the holder of the thread it
    was copied from, say a loop thread that used this API before it ran
    the loop: another thread does not take that one up."""
    marker = getattr(_threads, "marker", None)
    if marker is None:
        # threading.local data dies with its thread: a new thread that gets
        # the same OS thread id starts without it.
        marker = _threads.marker = object()
    made_by, holder = _holders.get((None, ""))
    if made_by is not marker:
        holder = f"t{next(_next_id)}"
        _holders.set((marker, holder))
    return holder


def _current_task() -> asyncio.Task[object] | None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return None
    return asyncio.current_task()


def current(identity: str, node_id: str, name: object = None) -> Owner:
    """The owner of a call made now, on this thread, through the manager
    whose identity is ``identity``; ``name`` is the caller's ``owner=``."""
    return Owner(
        node_id,
        os.getpid(),
        str(threading.get_native_id()),
        f"{identity}.{_holder(name)}",
    )


def detached(node_id: str, lease_id: str) -> Owner:
    """The owner of the detached lease ``lease_id``: the lease itself (see
    :data:`pathlock.types.DETACHED`), granted by the calling thread of this
    process on ``node_id`` (shown to people, as for every lock)."""
    return Owner(node_id, os.getpid(), str(threading.get_native_id()), DETACHED + lease_id)
