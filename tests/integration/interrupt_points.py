"""Interrupts delivered, one per run, at each point of a call where CPython
could run a signal handler: to show that no such point leaves a lock held
that nobody can release.

CPython 3.11 runs a pending signal's Python handler (which raises Ctrl-C's
``KeyboardInterrupt``) only at a few points: when a function starts or a
generator resumes, at a loop's backward jump, and right after a call into C
returns. Not after a Python function returns, not between a ``with``
statement's ``__enter__`` (in C) and its block. A tracer that interrupted at
every line would strike where no signal can, such as between a ``with``
block's last line and its exit; this one follows the interpreter's rule,
within pathlock's own frames and at the start of any function they call,
and calls the handler of ``SIGINT`` in force
there, so that a handler pathlock swapped in for a moment (while a connection
goes in or out of the pool) records the signal and raises later, as it would
for a real one.
"""

from __future__ import annotations

import dis
import os
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pathlock

_ROOT = str(Path(pathlock.__file__).parent) + os.sep
_NOT_TRACED = (_ROOT + "bench" + os.sep, _ROOT + "cli" + os.sep)
# The jumps that close a loop, where the interpreter checks for signals
# (all but the one inside ``yield from`` and ``await``).
_JUMPS_BACK = frozenset(
    code
    for name, code in dis.opmap.items()
    if "JUMP_BACKWARD" in name and name != "JUMP_BACKWARD_NO_INTERRUPT"
)


def _ours(frame: FrameType) -> bool:
    name = frame.f_code.co_filename
    return name.startswith(_ROOT) and not name.startswith(_NOT_TRACED)


Point = tuple[str, str, int]
"""Where a signal could be handled: the file (under ``pathlock/``; the file's
name alone for another module's), the function and the instruction's
offset in it."""


class Interrupter:
    """Notes, in order, the points where a signal could be handled in
    pathlock's code while it runs :meth:`run`'s function, each once however
    often a loop passes it, and interrupts at the first passage of ``at``
    (``None``: nowhere).

    The points, each raising where the interpreter's own check would: a
    function's start or a generator's resumption (the tracer's ``call``
    event; also that of a function of another module called from
    pathlock's code), a backward jump (its ``opcode`` event), and the
    return of a call into C (the profiler's ``c_return`` event, after which
    the call's result is dropped and the exception raised at the call)."""

    def __init__(self, at: Point | None = None) -> None:
        self.at = at
        self.seen: dict[Point, None] = {}
        self.struck = False

    def run(self, function: Callable[[], Any]) -> Any:
        sys.setprofile(self._profiled)
        sys.settrace(self._called)
        try:
            return function()
        finally:
            sys.settrace(None)
            sys.setprofile(None)

    def _called(self, frame: FrameType, _event: str, _arg: Any) -> Any:
        if self.struck:
            return None
        if not _ours(frame):
            # The start of a function of another module that pathlock's code
            # calls (contextlib's __exit__, say) is a point too; its inside
            # is not traced.
            if frame.f_back is not None and _ours(frame.f_back):
                self._point(frame)
            return None
        frame.f_trace_opcodes = True
        frame.f_trace_lines = False
        self._point(frame)  # a function's start, or a generator resumed
        return self._traced

    def _traced(self, frame: FrameType, event: str, _arg: Any) -> Any:
        if self.struck:
            return None
        if event == "opcode" and frame.f_code.co_code[frame.f_lasti] in _JUMPS_BACK:
            self._point(frame)
        return self._traced

    def _profiled(self, frame: FrameType, event: str, _arg: Any) -> None:
        if event == "c_return" and not self.struck and _ours(frame):
            self._point(frame)

    def _point(self, frame: FrameType) -> None:
        code = frame.f_code
        name = code.co_filename
        place = name[len(_ROOT) :] if _ours(frame) else name.rsplit(os.sep, 1)[-1]
        point = (place, code.co_qualname, frame.f_lasti)
        self.seen[point] = None
        if point != self.at:
            return
        self.struck = True
        handler = signal.getsignal(signal.SIGINT)
        if callable(handler):
            handler(signal.SIGINT, frame)
        else:
            raise KeyboardInterrupt


def each_point(first: Callable[[], Any]) -> Iterator[Interrupter]:
    """Run ``first`` once to note its points, then give an :class:`Interrupter`
    for each point in turn, for the caller to run; a point that a later run
    passes first is added."""
    noted = Interrupter()
    noted.run(first)
    todo = dict(noted.seen)
    tried: set[Point] = set()
    while len(tried) < len(todo):
        at = next(point for point in todo if point not in tried)
        tried.add(at)
        interrupter = Interrupter(at)
        yield interrupter
        todo.update(dict.fromkeys(interrupter.seen))


def describe(point: Point | None) -> str:
    """``function (file, instruction offset)``."""
    assert point is not None
    return f"{point[1]} ({point[0]}, instruction {point[2]})"
