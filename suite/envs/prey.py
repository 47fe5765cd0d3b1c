"""The fixed prey of MPE predator-prey (PP) and World, and its loader.

OMAR (and CFCQL, MADiff, DoF) do not learn the prey: they load a pretrained policy from a torch file
`pretrained_adv_model.pt` shaped as

    {"agent_params": [entry_0, ..., entry_{n-1}], ...}

with one entry per env agent (predators first, prey after them). Each entry is a dict with at least
a "policy" state dict of OMAR's `MLPNetwork` (utils/networks.py):

    in_fn  BatchNorm1d(obs_dim)          keys in_fn.{weight,bias,running_mean,running_var,...}
    fc1    Linear(obs_dim, hidden)       hidden = 64
    fc2    Linear(hidden, hidden)
    fc3    Linear(hidden, 2)
    forward: tanh(fc3(relu(fc2(relu(fc1(bn(x)))))))   run in eval mode, no exploration noise

`load_prey` reads that layout (our shipped files in datasets/assets use it too) and returns a
`PreyPolicy`: the same forward pass in float64 numpy, batched over envs, so stepping an env never
touches torch. torch is imported only to read or build networks.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np

HIDDEN = 64
BN_EPS = 1e-5  # torch's BatchNorm1d default, which OMAR's MLPNetwork keeps
_LAYERS = ("fc1", "fc2", "fc3")


class PreyPolicy:
    """Deterministic OMAR-format MLP policy evaluated in numpy: obs [B, d] -> action [B, 2]."""

    def __init__(self, params: dict[str, np.ndarray], eps: float = BN_EPS, source: str = ""):
        self.params = {k: np.asarray(v, dtype=np.float64) for k, v in params.items()}
        self.eps = eps
        self.source = source
        self.obs_dim = int(self.params["in_fn.weight"].shape[0])
        self.act_dim = int(self.params["fc3.weight"].shape[0])

    @classmethod
    def from_state_dict(cls, state_dict: dict[str, Any], source: str = "") -> "PreyPolicy":
        needed = ["in_fn.weight", "in_fn.bias", "in_fn.running_mean", "in_fn.running_var"]
        needed += [f"{layer}.{p}" for layer in _LAYERS for p in ("weight", "bias")]
        missing = [k for k in needed if k not in state_dict]
        if missing:
            raise ValueError(f"not an OMAR MLPNetwork policy state dict; missing {missing}")
        params = {k: _to_numpy(state_dict[k]) for k in needed}
        return cls(params, source=source)

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        x = np.asarray(obs, dtype=np.float32).astype(np.float64)  # OMAR feeds float32 tensors
        p = self.params
        x = (x - p["in_fn.running_mean"]) / np.sqrt(p["in_fn.running_var"] + self.eps)
        x = x * p["in_fn.weight"] + p["in_fn.bias"]
        x = np.maximum(x @ p["fc1.weight"].T + p["fc1.bias"], 0.0)
        x = np.maximum(x @ p["fc2.weight"].T + p["fc2.bias"], 0.0)
        x = np.tanh(x @ p["fc3.weight"].T + p["fc3.bias"])
        return np.clip(x, -1.0, 1.0).astype(np.float32)  # OMAR's DDPGAgent.step clamps too


def _to_numpy(value: Any) -> np.ndarray:
    return value.detach().cpu().numpy() if hasattr(value, "detach") else np.asarray(value)


def load_prey(path: str | Path, prey_index: int | None = None, trusted: bool = False) -> PreyPolicy:
    """Load the prey policy from an OMAR-layout file.

    prey_index: which `agent_params` entry is the prey; None takes the last entry (OMAR's files
    hold the 3 predators then the single prey, as MADiff/DoF's PretrainedPreyWrapper assumes).
    trusted: allow full unpickling (torch weights_only=False) for files holding non-tensor
    objects; only for files whose origin you trust.
    """
    import torch

    path = Path(path)
    try:
        blob = torch.load(path, map_location="cpu", weights_only=not trusted)
    except Exception as err:  # weights_only refuses arbitrary pickles
        if trusted:
            raise
        raise ValueError(f"{path}: cannot be read with weights_only=True ({err}); "
                         "pass trusted=True if you trust the file") from err
    entries = blob.get("agent_params") if isinstance(blob, dict) else None
    if not entries:
        raise ValueError(f"{path}: expected a dict with a non-empty 'agent_params' list")
    index = len(entries) - 1 if prey_index is None else prey_index
    entry = entries[index]
    if not isinstance(entry, dict) or not entry.get("policy"):
        raise ValueError(f"{path}: agent_params[{index}] has no 'policy' state dict")
    return PreyPolicy.from_state_dict(entry["policy"], source=f"{path.name}#{index}")


def file_digest(path: str | Path) -> str:
    """Short content hash, recorded in env_versions so results name the prey they ran with."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def default_prey_path(task_id: str) -> Path:
    """The shipped prey for 'mpe-pp' / 'mpe-world' (see datasets/assets/PREY.md)."""
    from importlib.resources import files

    return Path(str(files("plcql_bench.datasets.assets") / f"prey_{task_id}.pt"))


def prey_network(obs_dim: int, hidden: int = HIDDEN, act_dim: int = 2):
    """A torch module with exactly OMAR's MLPNetwork parameter names (for training/saving)."""
    import torch
    from torch import nn

    class OmarMLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.in_fn = nn.BatchNorm1d(obs_dim)
            self.fc1 = nn.Linear(obs_dim, hidden)
            self.fc2 = nn.Linear(hidden, hidden)
            self.fc3 = nn.Linear(hidden, act_dim)

        def forward(self, x: "torch.Tensor") -> "torch.Tensor":
            h = torch.relu(self.fc1(self.in_fn(x)))
            return torch.tanh(self.fc3(torch.relu(self.fc2(h))))

    return OmarMLP()


def save_prey_file(path: str | Path, prey_state_dict: dict, n_predators: int, meta: dict) -> None:
    """Write OMAR's layout: `n_predators` placeholder entries, then the prey entry.

    The placeholders keep the prey at index n_predators, where OMAR's load_pretrained_preys looks;
    they carry no weights (the predators are what the benchmark learns)."""
    import torch

    sd = {k: v.detach().clone().cpu() for k, v in prey_state_dict.items()}
    placeholder = {"policy": {}, "placeholder": True}
    prey_entry = {"policy": sd, "target_policy": {k: v.clone() for k, v in sd.items()}}
    blob = {"agent_params": [dict(placeholder) for _ in range(n_predators)] + [prey_entry],
            "meta": meta}
    torch.save(blob, Path(path))
