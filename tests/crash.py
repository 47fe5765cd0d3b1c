"""A Ctrl-C in the middle of training, for the resume tests."""

from __future__ import annotations

import os
import signal


def interrupt_on_call(monkeypatch, owner, name: str, n: int, message: str = "simulated crash"):
    """Make `owner.name` (a method: an algorithm's or a stack's `update`) raise KeyboardInterrupt on its
    n-th call; returns the original, which the test puts back with monkeypatch.setattr before resuming."""
    real, calls = getattr(owner, name), {"n": 0}

    def interrupted(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == n:
            raise KeyboardInterrupt(message)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(owner, name, interrupted)
    return real


def signal_on_call(monkeypatch, owner, name: str, n: int, signum: int = signal.SIGINT):
    """Make `owner.name` send `signum` to this process at the start of its n-th call (a real stop arriving
    mid-round, handled by the suite's signal handler); returns the original."""
    real, calls = getattr(owner, name), {"n": 0}

    def signalled(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == n:
            os.kill(os.getpid(), signum)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(owner, name, signalled)
    return real
