"""A stop asked for by a signal, honoured at the end of a training round.

SIGINT/SIGTERM used to raise KeyboardInterrupt wherever the run was, so it kept only its last periodic
checkpoint: a GPU loan stopped at its time limit lost up to `checkpoint_every` rounds of every run (~180 of
~1,400 on the 2026-11-27 PP stacks). Inside `at_round_end()` (a training loop) the first signal only sets
a flag; the loop finishes its round, writes a checkpoint there (with the training metrics not yet averaged
into an evaluation point, so nothing is lost on resume) and raises KeyboardInterrupt itself.

Repeats of the same stop are ignored for REPEAT_S seconds: `timeout` signals the whole process group and
`all` forwards the signal to its workers, so a worker sees it twice at once. A signal later than that stops
at once, as does any signal outside a training loop (loading a dataset, the final evaluation).
"""

from __future__ import annotations

import signal
import threading
import time
from contextlib import contextmanager

REPEAT_S = 3.0


class _State:
    armed = 0                         # training loops open in this process
    requested_at: float | None = None  # time.monotonic() of the first signal of the current stop
    signum: int | None = None


_state = _State()


@contextmanager
def at_round_end():
    """Defer SIGINT/SIGTERM to the end of the current round of the loop run inside."""
    if not _state.armed:  # a new loop: a stop asked for before it belongs to an earlier one
        _state.requested_at = _state.signum = None
    _state.armed += 1
    try:
        yield
    finally:
        _state.armed -= 1


def on_signal(signum: int, now: float | None = None) -> None:
    """The signal handler's decision: return to defer (or ignore a repeat), raise KeyboardInterrupt to stop now."""
    now = time.monotonic() if now is None else now
    if _state.requested_at is not None and now - _state.requested_at < REPEAT_S:
        return  # the same stop, delivered again (also while a stop outside a loop is cleaning up)
    first = _state.requested_at is None
    _state.requested_at, _state.signum = now, signum
    if _state.armed and first:
        return
    raise KeyboardInterrupt(f"signal {signum}")


def requested() -> bool:
    """Whether the loop should stop at the end of this round."""
    return bool(_state.armed) and _state.requested_at is not None


def stopped(update: int) -> KeyboardInterrupt:
    """The exception a loop raises once it has checkpointed at `update`."""
    return KeyboardInterrupt(f"signal {_state.signum}: stopped at the end of round {update} (checkpoint written there)")


def _interrupt(signum, frame):
    on_signal(signum)  # in a training loop: stop at the end of the round


def restore_interrupts() -> None:
    """SIGINT and SIGTERM stop a run cleanly (status 'interrupted'; a training loop first finishes its
    round and checkpoints there). A shell starts background commands (`cmd &`) with SIGINT ignored, and
    Python then never raises KeyboardInterrupt: `timeout -s INT`, `kill -INT` and a campaign's stop did
    nothing (a GPU loan's runs had to be killed). SIGTERM, the default of `kill` and `timeout`, is treated
    the same."""
    if threading.current_thread() is threading.main_thread():  # signal handlers: main thread only
        signal.signal(signal.SIGINT, _interrupt)
        signal.signal(signal.SIGTERM, _interrupt)
