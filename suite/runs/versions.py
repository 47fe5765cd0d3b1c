"""Versions of everything that can change a number, recorded in datasets, results and the site."""

from __future__ import annotations

import os
import platform
import subprocess
from functools import cache
from importlib import metadata
from pathlib import Path

# Distributions whose versions matter for results (present ones are reported).
TRACKED = ("plcql-bench", "torch", "numpy", "h5py", "mpe2", "pettingzoo", "gymnasium",
           "gymnasium-robotics", "mujoco", "jax", "jaxlib", "jaxmarl", "ray", "click", "jinja2")


@cache
def package_versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for name in TRACKED:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return found


@cache
def git_commit() -> str:
    """The source commit: $PLCQL_GIT_COMMIT (set in container images), else git, else unknown."""
    if os.environ.get("PLCQL_GIT_COMMIT"):
        return os.environ["PLCQL_GIT_COMMIT"]
    repo = Path(__file__).resolve().parents[2]  # suite/runs/versions.py -> the checkout
    try:
        out = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=5, check=True)
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return out.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def image_labels() -> dict[str, str]:
    """Container image labels that the image copies into the environment (PLCQL_IMAGE_*)."""
    prefix = "PLCQL_IMAGE_"
    return {k[len(prefix):].lower(): v for k, v in os.environ.items() if k.startswith(prefix)}
