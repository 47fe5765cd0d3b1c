"""A Ctrl-C in the middle of training, for the resume tests."""

from __future__ import annotations


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
