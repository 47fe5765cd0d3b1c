"""A folder shaped like an official checkout (OMAR's, or CFCQL's continuous/), with stand-in sources: what the
reference loaders (suite/runs/reference_score.py, reference_speed.py) import, without the real code."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import torch


def write_checkout(parent: Path, kind: str, agent_source: str, buffer_source: str) -> Path:
    """The checkout root for `kind` (omar, cfcql or macql: MACQL's is CFCQL's) under `parent`; `agent_source`
    has a `{name}` placeholder for the agent class the loader looks up."""
    root = parent / kind.upper()
    code = root if kind == "omar" else root / "continuous"
    (code / "algorithms").mkdir(parents=True)
    (code / "utils").mkdir()
    name, file = ("MATD3", "maddpg.py") if kind == "omar" else ("MATD3CC", "maddpg_cc.py")
    (code / "algorithms" / file).write_text(textwrap.dedent(agent_source.replace("{name}", name)))
    (code / "utils" / "__init__.py").write_text("")
    (code / "utils" / "buffer.py").write_text(textwrap.dedent(buffer_source))
    return root


def undo_loader_shims(monkeypatch) -> None:
    """Restore, after the test, what the loaders shim or import: torch's CUDA globals and argument validation,
    sys.path, and the checkout's top-level `utils` (both references name their helpers so)."""
    monkeypatch.setattr(torch.Tensor, "cuda", torch.Tensor.cuda)
    monkeypatch.setattr(torch.cuda, "FloatTensor", torch.cuda.FloatTensor)
    monkeypatch.setattr(torch.distributions.Distribution, "_validate_args",
                        torch.distributions.Distribution._validate_args)
    monkeypatch.setattr(sys, "path", list(sys.path))
    for mod in ("utils", "utils.buffer", "tensorboard_logger"):
        monkeypatch.delitem(sys.modules, mod, raising=False)
