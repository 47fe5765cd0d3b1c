"""Dataset cards: written next to each built dataset, exported with an ordering check."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from plcql_bench.datasets.build import build_dataset
from plcql_bench.datasets.cards import export_cards, tier_order_ok
from plcql_bench.datasets.format import read_attrs
from plcql_bench.suite.core.errors import BenchError


def test_build_writes_a_card_with_the_manifest_numbers(tmp_path):
    entry = build_dataset("mpe-cn", "expert", 4, tmp_path, profile="cardtest")
    card = (tmp_path / "mpe-cn" / "expert.card.md").read_text()
    assert "| transitions | 100 |" in card and "| episodes | 4 |" in card
    assert f"{entry['return_mean']:.2f} ± {entry['return_std']:.2f}" in card
    assert f"{entry['return_min']:.2f} / {entry['return_max']:.2f}" in card
    assert entry["sha256"] in card
    # where it was built, in the manifest and card only (not in the file, whose bytes it must not change)
    import torch

    isa = torch.backends.cpu.get_cpu_capability()
    assert entry["built_on"]["cpu_isa"] == isa and f"| built on | {entry['built_on']['cpu']} ({isa}) |" in card
    assert "built_on" not in json.dumps(read_attrs(tmp_path / "mpe-cn" / "expert.h5"), default=str)


def test_export_writes_cards_entries_and_an_index_with_the_tier_order(tmp_path):
    data = tmp_path / "data"
    for tier in ("expert", "random"):
        build_dataset("mpe-cn", tier, 4, data, profile="cardtest")
    files = export_cards(data, tmp_path / "cards", "cardtest")
    assert {f.name for f in files} == {"expert.md", "expert.json", "random.md", "random.json", "README.md"}
    rec = json.loads((tmp_path / "cards" / "mpe-cn" / "expert.json").read_text())
    assert "created" not in rec and rec["n_transitions"] == 100
    index = (tmp_path / "cards" / "README.md").read_text()
    expected = "yes" if rec["return_mean"] > json.loads((tmp_path / "cards" / "mpe-cn" / "random.json").read_text())["return_mean"] else "NO"
    # only the tiers built are compared, and the line names them (no medium here)
    assert f"- mpe-cn: expert > random by mean return: **{expected}**" in index and "> medium" not in index


def test_export_keeps_a_card_the_build_is_another_cpus_rebuild_of(tmp_path):
    """Exporting the cards of a rebuild (same recipe, statistics within rounding, another sha256) keeps the
    committed card, which names the committed runs; a card of another recipe is replaced."""
    data = tmp_path / "data"
    build_dataset("mpe-cn", "expert", 4, data, profile="cardtest")
    export_cards(data, tmp_path / "cards", "cardtest")
    card_file = tmp_path / "cards" / "mpe-cn" / "expert.json"
    built = json.loads(card_file.read_text())
    committed = {**built, "sha256": "c" * 64, "return_mean": built["return_mean"] * (1 + 1e-6)}
    card_file.write_text(json.dumps(committed))
    said = []
    files = export_cards(data, tmp_path / "cards", "cardtest", echo=said.append)
    assert json.loads(card_file.read_text()) == committed and card_file not in files
    assert len(said) == 1 and "is a rebuild of it" in said[0]
    card_file.write_text(json.dumps({**committed, "generator_seed": 7}))  # another recipe: replaced
    export_cards(data, tmp_path / "cards", "cardtest")
    assert json.loads(card_file.read_text())["sha256"] == built["sha256"]


def test_tier_order_check():
    e = lambda r: {"return_mean": r}  # noqa: E731
    assert tier_order_ok({"expert": e(3), "medium": e(2), "random": e(1)}) is True
    assert tier_order_ok({"expert": e(3), "medium": e(4), "random": e(1)}) is False
    assert tier_order_ok({"expert": e(3)}) is None


def test_cards_without_datasets_is_a_one_line_error(tmp_path):
    with pytest.raises(BenchError, match="no datasets built"):
        export_cards(tmp_path, tmp_path / "out", "nothing")
    proc = subprocess.run([sys.executable, "-m", "plcql_bench.suite.commands.main", "--data-dir", str(tmp_path), "datasets",
                           "cards", "--profile", "smoke", "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "manifest.json: no datasets built" in proc.stderr


def test_a_rebuild_compares_undefined_statistics_as_equal_only_when_both_are():
    from plcql_bench.datasets.cards import rebuild_difference

    card = {"task_id": "smax-2s3z", "quality": "medium", "return_mean": 0.98, "win_rate": 0.13,
            "ref_return_random": float("nan"), "ref_return_expert": float("nan")}
    assert rebuild_difference(dict(card), card) == 0.0
    assert rebuild_difference({**card, "return_mean": 0.98 + 1e-4}, card) == pytest.approx(1e-4)
    assert rebuild_difference({**card, "ref_return_expert": 1.0}, card) is None  # defined on one side only
    assert rebuild_difference({k: v for k, v in card.items() if k != "win_rate"}, card) is None
    assert rebuild_difference({**card, "quality": "expert"}, card) is None


def test_a_rebuilds_return_statistics_drift_on_the_returns_scale():
    """A mean near zero of widely spread returns is compared relative to the spread: World medium-replay's
    rebuild (mean 2.8060 against 2.8078, std 14.67) is within REBUILD_RTOL, a shift by 1 % of the std is not."""
    from plcql_bench.datasets.cards import REBUILD_RTOL, rebuild_difference

    card = {"task_id": "mpe-world", "quality": "medium-replay", "return_mean": 2.8077635963074865,
            "return_std": 14.677380636299027, "return_min": -40.0, "return_max": 60.0, "win_rate": float("nan"),
            "n_transitions": 1_000_000, "ref_return_random": -5.0, "ref_return_expert": 30.0}
    rebuild = {**card, "return_mean": 2.8059757191953913, "return_std": 14.67446504045133}
    mean_drift, std_drift = 0.0017878771 / 14.677380636299027, 0.0029155958 / 14.677380636299027
    assert rebuild_difference(rebuild, card) == pytest.approx(max(mean_drift, std_drift))  # not 6.4e-4, the mean's own
    assert rebuild_difference({**rebuild, "return_std": card["return_std"]}, card) == pytest.approx(mean_drift)
    assert rebuild_difference(rebuild, card) < REBUILD_RTOL
    assert rebuild_difference({**card, "return_mean": card["return_mean"] + 0.15}, card) > REBUILD_RTOL
    assert rebuild_difference({**card, "n_transitions": 1_000_000 + 2_000}, card) > REBUILD_RTOL  # counts keep their own scale
    assert rebuild_difference({**card, "ref_return_expert": 30.0 + 0.1}, card) > REBUILD_RTOL  # and the references


def test_export_keeps_committed_cards_of_datasets_not_built_here_in_the_index(tmp_path):
    """Exporting a few rebuilt tiers (e.g. a new generation's MPE tiers) lists the other committed cards
    (SMAX's) in the index too, unchanged."""
    data = tmp_path / "data"
    build_dataset("mpe-cn", "random", 4, data, profile="cardtest")
    other = tmp_path / "cards" / "smax-2s3z" / "expert.json"
    other.parent.mkdir(parents=True)
    card = {"task_id": "smax-2s3z", "quality": "expert", "n_transitions": 7, "n_episodes": 1, "return_mean": 2.0,
            "return_std": 0.0, "return_min": 2.0, "return_max": 2.0, "sha256": "s" * 64}
    other.write_text(json.dumps(card))
    export_cards(data, tmp_path / "cards", "cardtest")
    index = (tmp_path / "cards" / "README.md").read_text()
    assert "smax-2s3z" in index and "mpe-cn" in index and json.loads(other.read_text()) == card


def test_a_build_whose_reference_returns_are_not_its_cards_is_stale():
    """Half-Cheetah random, built before the v2 expert checkpoint changed: the same uniform-random episodes
    (same behaviour id), but the expert reference return of the old expert. `stale` says so; a rebuild whose
    references drift in the last bits (another CPU) and the card's own file are not stale."""
    from plcql_bench.datasets.behaviour import stale
    from plcql_bench.datasets.cards import committed_entry

    task, tier = "mamujoco-halfcheetah-2x3", "random"
    card = committed_entry("paper", task, tier)
    assert card is not None and stale(card, task, tier, "v2") is None
    old = {**card, "sha256": "0" * 64, "ref_return_expert": 3414.662091089407}
    why = stale(old, task, tier, "v2")
    assert why == f"reference returns expert 3414.66 where its card has {card['ref_return_expert']:.2f}"
    drift = {**card, "sha256": "1" * 64, "ref_return_expert": card["ref_return_expert"] * (1 + 1e-6)}
    assert stale(drift, task, tier, "v2") is None
    other_recipe = {**old, "behaviour_policy_id": "an-older-recipe"}  # the behaviour's change is what it names
    assert "an-older-recipe" in stale(other_recipe, task, tier, "v2")


def test_every_committed_tasks_tiers_share_their_reference_returns():
    """A task's tiers are scored on one scale: every committed card of a task carries the same reference
    returns (CN random kept the first v2 expert's 531.66 after the expert changed, until 2026-12-06)."""
    from plcql_bench.datasets.cards import CARDS_DIR, reference_disagreements
    from plcql_bench.datasets.originals import committed_cards

    for profile_dir in sorted(p for p in CARDS_DIR.iterdir() if p.is_dir()):
        by_task: dict = {}
        for (task, tier), card in committed_cards(profile_dir).items():
            by_task.setdefault(task, {})[tier] = card
        assert by_task, profile_dir
        assert reference_disagreements(by_task) == [], profile_dir


def test_reference_disagreements_name_the_odd_tier_and_ignore_drift_and_undefined_references():
    from plcql_bench.datasets.cards import reference_disagreements

    refs = {"ref_return_random": 161.77, "ref_return_expert": 578.72}
    tiers = {"expert": dict(refs), "medium": {**refs, "ref_return_expert": 578.72 * (1 + 1e-6)}}
    assert reference_disagreements({"mpe-cn": tiers}) == []
    tiers["random"] = {**refs, "ref_return_expert": 531.66}
    (line,) = reference_disagreements({"mpe-cn": tiers})
    assert line.startswith("mpe-cn: the tiers' cards disagree on ref_return_expert")
    assert "random 531.66" in line and "expert 578.72" in line
    nan = {"ref_return_random": float("nan"), "ref_return_expert": float("nan")}
    assert reference_disagreements({"smax-2s3z": {"expert": nan, "medium": dict(nan)}}) == []


def test_export_warns_when_a_tasks_cards_disagree_on_reference_returns(tmp_path):
    data = tmp_path / "data"
    build_dataset("mpe-cn", "random", 4, data, profile="cardtest")
    odd = tmp_path / "cards" / "mpe-cn" / "expert.json"
    odd.parent.mkdir(parents=True)
    built = json.loads((data / "manifest.json").read_text())["mpe-cn/random"]
    odd.write_text(json.dumps({**built, "quality": "expert", "sha256": "e" * 64,
                               "ref_return_expert": built["ref_return_expert"] + 40.0}))
    said: list[str] = []
    export_cards(data, tmp_path / "cards", "cardtest", echo=said.append)
    assert any(s.startswith("warning: mpe-cn: the tiers' cards disagree on ref_return_expert") for s in said)


def test_off_card_says_when_a_build_is_not_its_committed_cards_dataset(tmp_path, monkeypatch):
    """The card's own file and a rebuild within tolerance are the card's dataset; a build with other reference
    returns, or of another recipe, is one of its own, and off_card says which and what it means for its runs."""
    from plcql_bench.datasets import cards
    from plcql_bench.datasets.manifest import lookup

    build_dataset("mpe-cn", "random", 4, tmp_path / "data", profile="cardtest")
    entry = lookup(tmp_path / "data", "mpe-cn", "random")
    monkeypatch.setattr(cards, "CARDS_DIR", tmp_path / "cards")
    assert cards.off_card(entry) is None  # no committed card
    card_file = tmp_path / "cards" / "cardtest" / "mpe-cn" / "random.json"
    card_file.parent.mkdir(parents=True)
    card_file.write_text(json.dumps(entry))
    assert cards.off_card(entry) is None  # the card's own file
    card_file.write_text(json.dumps({**entry, "sha256": "c" * 64, "return_mean": entry["return_mean"] * (1 + 1e-7)}))
    assert cards.off_card(entry) is None  # another CPU's rebuild of it
    card_file.write_text(json.dumps({**entry, "sha256": "c" * 64, "ref_return_expert": entry["ref_return_expert"] + 40}))
    why = cards.off_card(entry)
    assert why.startswith(f"sha256 {entry['sha256'][:12]}, the card's cccccccccccc (reference returns expert ")
    assert why.endswith("its runs will not count as the board's runs of this tier")
    card_file.write_text(json.dumps({**entry, "sha256": "c" * 64, "behaviour_policy_id": "another"}))
    assert "(another recipe than the card's)" in cards.off_card(entry)
