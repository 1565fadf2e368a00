"""Signals held back while a connection goes in or out of the pool
(pathlock._interrupts): raised right after the block, never inside it, and no
handler stays swapped."""

from __future__ import annotations

import gc
import os
import signal
import threading
from collections.abc import Iterator
from types import FrameType

import pytest

from pathlock import _interrupts as interrupts


class Interrupted(Exception):
    pass


def _raise(_signum: int, _frame: FrameType | None) -> None:
    raise Interrupted


@pytest.fixture
def raising_handler() -> Iterator[None]:
    previous = signal.signal(signal.SIGUSR1, _raise)
    yield
    signal.signal(signal.SIGUSR1, previous)


def _signal_self() -> None:
    """Send SIGUSR1 to this process, and give its handler plenty of chances
    to run (it runs between bytecodes of the main thread)."""
    os.kill(os.getpid(), signal.SIGUSR1)
    for _ in range(1000):
        pass


def _held_back_block(steps: list[str]) -> None:
    with interrupts.held_back():
        _signal_self()
        steps.append("the block went on")


@pytest.mark.usefixtures("raising_handler")
def test_a_signal_in_the_block_is_handled_right_after_it() -> None:
    steps: list[str] = []
    with pytest.raises(Interrupted):
        _held_back_block(steps)
    assert steps == ["the block went on"]
    assert signal.getsignal(signal.SIGUSR1) is _raise


@pytest.mark.usefixtures("raising_handler")
def test_handlers_are_restored_when_the_block_raises() -> None:
    with pytest.raises(KeyError), interrupts.held_back():
        raise KeyError
    assert signal.getsignal(signal.SIGUSR1) is _raise
    with pytest.raises(Interrupted):
        _signal_self()


@pytest.mark.usefixtures("raising_handler")
def test_let_through_handles_signals_again_and_then_holds_them_back() -> None:
    with interrupts.held_back():
        with pytest.raises(Interrupted), interrupts.let_through():
            _signal_self()
        assert signal.getsignal(signal.SIGUSR1) is not _raise  # held back again
    assert signal.getsignal(signal.SIGUSR1) is _raise


@pytest.mark.usefixtures("raising_handler")
def test_nested_blocks_hand_the_signal_out_once_at_the_outer_end() -> None:
    steps: list[str] = []

    def nested() -> None:
        with interrupts.held_back():
            with interrupts.held_back():
                _signal_self()
            for _ in range(1000):
                pass
            steps.append("the outer block went on")

    with pytest.raises(Interrupted):
        nested()
    assert steps == ["the outer block went on"]
    assert signal.getsignal(signal.SIGUSR1) is _raise


@pytest.mark.usefixtures("raising_handler")
def test_other_threads_are_left_alone() -> None:
    seen: list[object] = []

    def run() -> None:
        with interrupts.held_back():
            seen.append(signal.getsignal(signal.SIGUSR1))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert seen == [_raise]


@pytest.mark.usefixtures("raising_handler")
def test_let_through_lets_signals_through_every_enclosing_block() -> None:
    with interrupts.held_back(), interrupts.held_back():
        with pytest.raises(Interrupted), interrupts.let_through():
            _signal_self()
        assert signal.getsignal(signal.SIGUSR1) is not _raise
    assert signal.getsignal(signal.SIGUSR1) is _raise


@pytest.mark.usefixtures("raising_handler")
def test_a_signal_held_back_before_let_through_is_handled_there() -> None:
    with interrupts.held_back(), interrupts.held_back():
        _signal_self()  # held back
        with pytest.raises(Interrupted), interrupts.let_through():
            pass
        assert signal.getsignal(signal.SIGUSR1) is not _raise
        with pytest.raises(Interrupted), interrupts.let_through():  # the chain is intact
            _signal_self()
    assert signal.getsignal(signal.SIGUSR1) is _raise


@pytest.mark.usefixtures("raising_handler")
def test_a_child_forked_by_another_thread_holds_signals_back_in_that_thread() -> None:
    # After a fork, the thread that forked is the child's main thread: the
    # one that runs its signal handlers, and so the one to protect.
    status: list[int] = []

    def fork_and_wait() -> None:
        pid = os.fork()
        if pid == 0:
            steps: list[str] = []
            try:
                _held_back_block(steps)
            except Interrupted:
                os._exit(0 if steps == ["the block went on"] else 2)
            os._exit(3)  # the signal was lost
        status.append(os.waitpid(pid, 0)[1])

    thread = threading.Thread(target=fork_and_wait)
    thread.start()
    thread.join(30)
    assert status, "the child was not waited for"
    assert os.waitstatus_to_exitcode(status[0]) == 0


@pytest.mark.usefixtures("raising_handler")
def test_a_let_through_whose_exit_never_ran_holds_nothing_back_later() -> None:
    """An interrupt at the very start of let_through's exit (signals are let
    through there) means its exit never runs; the exception then passes the
    enclosing block's end. When let_through was a generator, its ``finally``
    ran whenever the generator was collected, after that end, and put the
    block back in force for good: SIGUSR1's handler stayed swapped, and a
    later let_through restored stale handlers and replayed stale signals
    (KeyboardInterrupt in close(), long after the timer that sent it)."""
    block = interrupts.held_back()
    block.__enter__()
    through = interrupts.let_through()
    through.__enter__()  # ... and its __exit__ never runs
    block.__exit__(None, None, None)  # the interrupt passes the block's end
    del through
    gc.collect()
    assert signal.getsignal(signal.SIGUSR1) is _raise
    with pytest.raises(Interrupted):
        _signal_self()
