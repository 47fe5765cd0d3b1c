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
import os
from importlib.resources import files
from pathlib import Path
from typing import Any

import numpy as np

from plcql_bench.suite.core.errors import BenchError
from plcql_bench.suite.core.settings import OMAR_PREY_ENV  # noqa: F401 - named here for its readers

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


# --------------------------------------------------------------------------- OMAR's pretrained prey
# The fixed DDPG prey that OMAR, CFCQL, MADiff and DoF collected and evaluated their PP and World data
# with. It is fetched data, never committed: a user gives its folder (PLCQL_OMAR_PREY_DIR, or the CLI's
# --omar-prey), else the first default folder that exists is read. Its sha256 is checked on every use.
OMAR_PREY_FILES: dict[str, tuple[str, str]] = {  # task -> (file name, sha256)
    "mpe-pp": ("simple_tag_pretrained_adv_model.pt",
               "b22b95f3397f41a21aa247810e385a8ecf85294f2e2ed8e523a954c633daf7a2"),
    "mpe-world": ("simple_world_pretrained_adv_model.pt",
                  "ed3170cfb9c3f6872305c9c795a7aed089fde7b5e5cc2bff5f7debfed37c2115"),
}
OMAR_PREY_SOURCE = ("instadeepai/og-marl (Apache-2.0) at commit f4eb8f03c0f1b8e2a0fa3479af92379afd0f83a9, "
                    "og_marl/custom_environments/multiagent_particle_envs/multiagent/adversaries/"
                    "<scenario>/pretrained_adv_model.pt, saved under the name above")
_REPO_ROOT = Path(__file__).resolve().parents[2]


class PreyUnavailable(BenchError):
    """OMAR's prey file is missing or is not the published file (one line: file, sha256, where to get it)."""


def omar_prey_dirs() -> list[Path]:
    """Where OMAR's prey is looked for, in order: $PLCQL_OMAR_PREY_DIR alone when set; else
    ../shared/data/omar-prey/ beside the checkout and beside the working directory."""
    given = os.environ.get(OMAR_PREY_ENV)
    if given:
        return [Path(given).expanduser()]
    rel = Path("..") / "shared" / "data" / "omar-prey"
    return list(dict.fromkeys([(_REPO_ROOT / rel).resolve(), (Path.cwd() / rel).resolve()]))


def omar_prey_path(task_id: str) -> Path:
    """The checked path of OMAR's prey for `task_id`; PreyUnavailable when it is missing or differs."""
    name, want = OMAR_PREY_FILES[task_id]
    dirs = omar_prey_dirs()
    found = next((d / name for d in dirs if (d / name).is_file()), None)
    if found is None:
        raise PreyUnavailable(
            f"{task_id}: OMAR's prey {name} (sha256 {want}) not found in {', '.join(map(str, dirs))}; get it from "
            f"{OMAR_PREY_SOURCE} and set {OMAR_PREY_ENV} (or --omar-prey) to its folder")
    got = _sha256_cached(found)
    if got != want:
        raise PreyUnavailable(f"{found}: sha256 {got}, expected OMAR's {name} {want}; "
                              f"get the published file from {OMAR_PREY_SOURCE}")
    return found


def omar_prey_version(task_id: str) -> str:
    """What datasets and results record as env_versions['prey'] for OMAR's prey (the full sha256)."""
    name, sha = OMAR_PREY_FILES[task_id]
    return f"omar:{name}:sha256={sha}"


def prey_kind(env_versions: dict, task_id: str | None = None) -> str:
    """'omar' when a dataset's env_versions name OMAR's prey (built here, or imported with its file), else
    'suite' (the shipped prey, or no prey). With `task_id`, a prey that is neither (an imported dataset's
    unknown or unnamed prey file) is PreyUnavailable: its runs would be scored against another prey."""
    v = str(env_versions.get("prey", ""))
    if v.startswith("omar:"):
        return "omar"
    digest = v.rsplit("sha256=", 1)[-1] if "sha256=" in v else ""
    known = [sha for _, sha in OMAR_PREY_FILES.values()]
    if len(digest) >= 16 and any(sha.startswith(digest) for sha in known):
        return "omar"
    if task_id is not None and v and v != suite_prey_version(task_id):
        raise PreyUnavailable(f"{task_id}: the dataset was collected against the prey {v!r}, neither OMAR's nor the "
                              "suite's: its runs cannot be evaluated against it (re-import it with OMAR's "
                              "pretrained_adv_model.pt, --prey)")
    return "suite"


def suite_prey_version(task_id: str) -> str:
    """env_versions['prey'] of the suite's shipped prey for `task_id`."""
    path = default_prey_path(task_id)
    return f"{path.name}:sha256={file_digest(path)}"


_SHA_CACHE: dict[tuple[str, int, int], str] = {}


def _sha256_cached(path: Path) -> str:
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns)
    if key not in _SHA_CACHE:
        _SHA_CACHE[key] = hashlib.sha256(path.read_bytes()).hexdigest()
    return _SHA_CACHE[key]


def default_prey_path(task_id: str) -> Path:
    """The shipped prey for 'mpe-pp' / 'mpe-world' (see datasets/assets/PREY.md)."""

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
