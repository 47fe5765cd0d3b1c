"""`plan` and `status`: matrix selection (--only, --shard), per-cell state, estimates."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from plcql_bench.datasets.build import build_dataset
from plcql_bench.suite.commands.main import cli
from plcql_bench.suite.core.errors import BenchError
from plcql_bench.suite.runs.matrix import parse_only, parse_shard, select_cells
from plcql_bench.suite.runs.profiles import load_profile
from plcql_bench.suite.runs.runner import Cell, execute, plan_run

PROFILE = """
name: plantest
description: plan tests
datasets: {episodes: {default: 6}}
train: {updates: {default: 2}, eval_every: 2, eval_episodes: 1, final_eval_episodes: 2, checkpoint_every: 2}
matrix: {algos: [bc, cfcql, plcql], tasks: [mpe-cn], tiers: [expert, random], seeds: [0, 1, 2]}
algo_overrides: {batch_size: 32, hidden: 32}
"""


@pytest.fixture()
def profile(tmp_path):
    (tmp_path / "p.yaml").write_text(PROFILE)
    return load_profile(str(tmp_path / "p.yaml"))


def test_only_parses_comma_lists_and_aliases():
    assert parse_only(["algo=bc,cfcql,task=mpe-cn,seed=0,1", "dataset=random"]) == {
        "algo": ["bc", "cfcql"], "task": ["mpe-cn"], "seed": ["0", "1"], "tier": ["random"]}
    with pytest.raises(BenchError, match="unknown key 'colour'"):
        parse_only(["colour=red"])
    assert parse_shard("1/4") == (1, 4) and parse_shard(None) is None
    for bad in ("4/4", "-1/2", "x", "1/0"):
        with pytest.raises(BenchError):
            parse_shard(bad)


def test_select_filters_and_shards_partition_the_matrix(profile):
    everything = select_cells(profile)
    assert len(everything) == 3 * 2 * 3
    picked = select_cells(profile, parse_only(["algo=bc,plcql,seed=2,dataset=random"]))
    assert picked == [Cell("bc", "mpe-cn", "random", 2), Cell("plcql", "mpe-cn", "random", 2)]
    shards = [select_cells(profile, None, (i, 4)) for i in range(4)]
    flat = [c for s in shards for c in s]
    assert sorted(flat, key=str) == sorted(everything, key=str) and len(set(flat)) == len(flat)
    assert max(map(len, shards)) - min(map(len, shards)) <= 1
    with pytest.raises(BenchError, match="seed=7"):
        select_cells(profile, {"seed": ["7"]})


def _invoke(tmp: Path, *args: str):
    return CliRunner().invoke(cli, ["--data-dir", str(tmp / "data"), "--results-dir", str(tmp / "results"),
                                    *args], catch_exceptions=False)


def test_plan_and_status_show_each_cell_state(tmp_path, profile):
    p = str(tmp_path / "p.yaml")
    empty = tmp_path / "empty.json"  # a machine calibration that knows nothing: recorded runtimes only
    empty.write_text(json.dumps({"machine": "empty", "costs": {}}))
    out = _invoke(tmp_path, "plan", "--profile", p, "--machine", str(empty)).output
    assert "18 cells: done 0, partial 0, running 0, failed 0, todo 18" in out
    assert "dataset not built yet" in out and "18 cell(s) not counted: no measured cost on empty" in out

    build_dataset("mpe-cn", "random", 6, tmp_path / "data" / "plantest", profile="plantest")
    plans = {c: plan_run(c, profile, tmp_path / "data", tmp_path / "results")
             for c in select_cells(profile, {"tier": ["random"], "seed": ["0"]})}
    done, failed, partial = (Cell(a, "mpe-cn", "random", 0) for a in ("bc", "cfcql", "plcql"))
    execute(plans[done], log=lambda *_: None)
    for cell, status in ((failed, {"status": "failed", "error": "ValueError: boom", "update": 0}),
                         (partial, {"status": "running", "update": 1})):
        d = plans[cell].run_dir
        d.mkdir(parents=True)
        (d / "config.json").write_text(json.dumps({"profile": "plantest", "algo": cell.algo, "task": cell.task,
                                                   "dataset": cell.tier, "seed": 0, "budget": {"updates": 2}}))
        (d / "status.json").write_text(json.dumps(status))
    (plans[partial].run_dir / "ckpt.pt").write_bytes(b"")

    out = _invoke(tmp_path, "plan", "--profile", p, "--machine", str(empty)).output
    assert "18 cells: done 1, partial 1, running 0, failed 1, todo 15" in out
    lines = {tuple(line.split()[:5]): line for line in out.splitlines() if line.startswith(("bc ", "cfcql ", "plcql "))}
    assert "2/2" in lines[("bc", "mpe-cn", "random", "0", "done")]
    assert "ValueError: boom" in lines[("cfcql", "mpe-cn", "random", "0", "failed")]
    assert "1/2" in lines[("plcql", "mpe-cn", "random", "0", "partial")]
    assert "estimate: ~" in out and "17 cell(s) from recorded runtimes" in out  # the finished run's
    assert "with 4 job(s)" in _invoke(tmp_path, "plan", "--profile", p, "--jobs", "4").output

    sharded = _invoke(tmp_path, "plan", "--profile", p, "--shard", "1/3", "--only", "dataset=random").output
    assert "3 cells:" in sharded

    table = _invoke(tmp_path, "status").output
    assert "3 runs: done 1, failed 1, partial 1" in table
    assert any("failed" in line and "ValueError: boom" in line for line in table.splitlines())
    only_failed = _invoke(tmp_path, "status", "--state", "failed").output
    assert "1 runs: failed 1" in only_failed


def test_plan_rejects_configs_that_do_not_resolve(tmp_path):
    (tmp_path / "p.yaml").write_text(PROFILE.replace("algos: [bc, cfcql, plcql]", "algos: [bc, nope]"))
    with pytest.raises(BenchError, match="do not resolve.*unknown algorithm 'nope'"):
        _invoke(tmp_path, "plan", "--profile", str(tmp_path / "p.yaml"))


def test_paper_cpu_profile_trains_on_the_paper_datasets(tmp_path):
    """paper-cpu reuses data/paper/ (same sizes); only Half-Cheetah's budget differs from paper."""
    paper, cpu = load_profile("paper"), load_profile("paper-cpu")
    assert cpu.data_profile == "paper" and paper.data_profile == "paper"
    assert cpu.dataset_episodes == paper.dataset_episodes
    for task, tier in (("mpe-cn", "random"), ("mpe-cn", "expert"), ("mpe-world", "medium")):
        assert cpu.updates_for(task, tier) == paper.updates_for(task, tier)
    hc = "mamujoco-halfcheetah-2x3"
    assert (cpu.updates_for(hc, "expert") - 1) * 10 == paper.updates_for(hc, "expert") - 1
    build_dataset("mpe-cn", "expert", 2, tmp_path / "data" / "paper", profile="paper")  # tiny stand-in
    plan = plan_run(Cell("bc", "mpe-cn", "expert", 0), cpu, tmp_path / "data", tmp_path / "results")
    assert plan.dataset_path.is_relative_to(tmp_path / "data" / "paper")
    assert plan.run_dir.is_relative_to(tmp_path / "results" / "paper-cpu")


def test_profile_reusing_unknown_datasets_is_one_line_error(tmp_path):
    (tmp_path / "bad.yaml").write_text(PROFILE.replace("datasets: {episodes: {default: 6}}",
                                                       "datasets: {from: nosuchprofile}"))
    with pytest.raises(BenchError, match="datasets.from: unknown built-in profile 'nosuchprofile'"):
        load_profile(str(tmp_path / "bad.yaml"))


def test_eval_counts_are_per_task_tables():
    """SMAC/SMAX follow CFCQL's run.py (32 test episodes, final 640); MPE/MaMuJoCo OMAR's 10 (final
    100). One number still means every task, and the budget (hence the run key) takes the task's."""
    for name in ("paper", "paper-cpu"):
        p = load_profile(name)
        for task in ("smax-2s3z", "smax-6h_vs_8z", "smac-2s3z", "smac-5m_vs_6m"):
            b = p.train_budget(task, "medium-replay")
            assert (b["eval_episodes"], b["final_eval_episodes"]) == (32, 640), (name, task)
            assert p.updates_for(task, "expert") == p.updates_for(task.replace("smac-", "smax-"), "expert")
        b = p.train_budget("mpe-cn", "random")
        assert (b["updates"], b["eval_episodes"], b["final_eval_episodes"]) == (6001, 10, 100)
    smoke = load_profile("smoke")
    assert smoke.train_budget("smax-2s3z", "expert")["eval_episodes"] == smoke.train_budget("mpe-cn", "expert")["eval_episodes"]


def test_paper_matrix_is_the_papers_32_combinations():
    """Tasks cross only the tiers they have: 4 continuous tasks x 4 tiers + 4 SMAC maps x 4 tiers."""
    from plcql_bench.suite.runs.matrix import matrix_blocks, matrix_datasets
    from plcql_bench.suite.envs.tasks import get_task, task_ids, task_tiers

    for name in ("paper", "paper-cpu"):
        p = load_profile(name)
        combos = matrix_datasets(p)
        assert len(combos) == len(set(combos)) == 32
        assert ("smax-2s3z", "random") not in combos and ("mpe-cn", "mixed") not in combos
        cells = select_cells(p, parse_only(["task=smax-2s3z,mpe-cn,dataset=random,mixed,seed=0"]))
        assert {(c.task, c.tier) for c in cells} == {("smax-2s3z", "mixed"), ("mpe-cn", "random")}
        blocks = matrix_blocks(p)
        per_block = [sum(q in task_tiers(t) for t in b["tasks"] for q in b["tiers"]) * len(b["algos"]) * len(b["seeds"])
                     for b in blocks]
        assert per_block[0] == 32 * len(p.matrix["algos"]) * len(p.matrix["seeds"])
        assert len(select_cells(p)) == sum(per_block)  # the blocks do not overlap
    for t in task_ids():  # the prefix rule agrees with every registered task's own tiers
        assert set(task_tiers(t)) == set(get_task(t).spec.tiers), t


def test_paper_matrix_covers_every_cell_of_the_papers_tables():
    """Every algorithm of the paper's main tables on every one of their rows, and every ablation row on
    its columns, is a cell of the `paper` matrix (SMAC rows run on SMAX)."""
    import yaml
    from importlib import resources

    paper = yaml.safe_load(resources.files("plcql_bench.leaderboard").joinpath("paper_results.yaml").read_text())
    task_of = {v: k for k, v in paper["task_map"].items()}
    tier_of = {v: k for k, v in paper["tier_map"].items()}
    cells = {(c.algo, c.task, c.tier) for c in select_cells(load_profile("paper"), parse_only(["seed=0"]))}
    want = set()
    for table in ("main_results", "starcraft_results"):
        t = paper["tables"].get(table)
        if t is None:
            continue
        for row, tiers in t["rows"].items():
            for tier in tiers:
                for algo in t["columns"]:
                    want.add((algo, task_of.get(row, f"smax-{row}"), tier_of[tier]))
    for v in paper["tables"]["ablation"]["variants"]:
        for col in paper["tables"]["ablation"]["columns"]:
            want.add((v["algo"], task_of.get(col["task"], f"smax-{col['task']}"), tier_of[col["tier"]]))
    assert len(want) > 250 and not want - cells, sorted(want - cells)[:10]


def test_plan_totals_from_a_machine_calibration(tmp_path, profile):
    """Per-task and per-algorithm totals from measured round and evaluation costs: a cell costs
    rounds x round_ms + (evaluations at round 0 and every eval_every) x eval + the final evaluation."""
    from plcql_bench.suite.runs.calibration import cell_cost, load_calibration, makespan

    calib_path = tmp_path / "m.json"
    calib_path.write_text(json.dumps({"machine": "m", "description": "test machine", "default_jobs": 4, "costs": {
        "bc": {"mpe-cn": {"round_ms": 1000.0, "eval_s": [1.0, 0.0]}},
        "cfcql": {"mpe-cn": {"round_ms": 3000.0, "eval_s": [1.0, 0.5], "proxy": "another task"}}}}))
    calib = load_calibration(str(calib_path))
    # bc: 2 rounds x 1 s + 2 evaluations (rounds 0 and 2) x 1 s + final 1 s = 5 s
    assert cell_cost(Cell("bc", "mpe-cn", "expert", 0), profile, calib).seconds == pytest.approx(5.0)
    # cfcql: 2 x 3 s + 2 x (1 + 0.5 x 1 episode) + final (1 + 0.5 x 2 episodes) = 11 s
    assert cell_cost(Cell("cfcql", "mpe-cn", "expert", 0), profile, calib).seconds == pytest.approx(11.0)
    assert cell_cost(Cell("plcql", "mpe-cn", "expert", 0), profile, calib).seconds is None
    assert makespan([5.0] * 6, 4) == 10.0 and makespan([5.0] * 6, 1) == 30.0

    out = _invoke(tmp_path, "plan", "--profile", str(tmp_path / "p.yaml"), "--machine", str(calib_path),
                  "--no-cells").output
    lines = [line.split() for line in out.splitlines()]
    assert "estimate on m (test machine" in out
    assert ["mpe-cn", "12", "1m36s", "48s", "48s", "26s"] in lines  # per task: 6 x 5 s + 6 x 11 s
    assert ["bc", "6", "30s", "12s", "18s", "10s"] in lines  # per algorithm, and on 4 jobs
    assert ["cfcql", "6", "1m06s", "36s", "30s", "22s"] in lines
    assert "~26s with 4 job(s) (1m36s serial)" in out  # longest first on 4 slots: 11+11, 11+11, 11+5+5+5, ...
    assert "6 cell(s) from stand-in measurements" in out and "6 cell(s) not counted" in out
    assert "plcql/mpe-cn" in out


def test_plan_shows_coverage_per_table_and_algorithm(tmp_path, profile):
    """Rows (algo x task x tier) with >= 3 finished seeds, with 1-2, and with none."""
    build_dataset("mpe-cn", "random", 6, tmp_path / "data" / "plantest", profile="plantest")
    for cell in (*(Cell("bc", "mpe-cn", "random", s) for s in (0, 1, 2)), Cell("cfcql", "mpe-cn", "random", 0)):
        execute(plan_run(cell, profile, tmp_path / "data", tmp_path / "results"), log=lambda *_: None)
    out = _invoke(tmp_path, "plan", "--profile", str(tmp_path / "p.yaml"), "--no-cells").output
    rows = {tuple(line.split()[:2]): line.split()[2:] for line in out.splitlines() if line.startswith(("  table", "  algo"))}
    assert rows[("table", "mpe+mamujoco")] == ["1", "1", "4"]  # 3 algos x 2 tiers
    assert rows[("algo", "bc")] == ["1", "0", "1"]
    assert rows[("algo", "cfcql")] == ["0", "1", "1"]
    assert rows[("algo", "plcql")] == ["0", "0", "2"]


def test_per_task_evaluation_and_checkpoint_intervals(tmp_path):
    """eval_every and checkpoint_every are per-task tables like updates (the paper evaluates every 1,000
    virtual steps: 10 rounds on CN, 50 on World, 500 on Half-Cheetah); the cell's interval enters its budget."""
    (tmp_path / "p.yaml").write_text(PROFILE.replace(
        "eval_every: 2,", "eval_every: {default: 2, mpe-world: 4},").replace(
        "checkpoint_every: 2}", "checkpoint_every: {default: 2, mpe-world: 8}}"))
    prof = load_profile(str(tmp_path / "p.yaml"))
    assert prof.train_budget("mpe-cn", "expert")["eval_every"] == 2 and prof.checkpoint_every_for("mpe-cn", "expert") == 2
    assert prof.train_budget("mpe-world", "expert")["eval_every"] == 4 and prof.checkpoint_every_for("mpe-world", "random") == 8
    paper = load_profile("paper")
    assert [paper.train_budget(t, "expert")["eval_every"] for t in ("mpe-cn", "mpe-world", "mamujoco-halfcheetah-2x3")] == [10, 50, 500]
    assert paper.checkpoint_every_for("mamujoco-halfcheetah-2x3", "expert") % 500 == 0


def test_plan_variants_cost_as_their_base_and_gpu_calibrations_skip_recorded_runtimes(tmp_path, profile):
    """A variant (plcql-k1) the calibration does not name costs as its base algorithm, as a stand-in;
    a calibration with "recorded_fallback": false (another kind of machine) does not borrow this
    machine's recorded runtimes for the cells it has no cost for."""
    from plcql_bench.suite.runs.calibration import cell_cost, load_calibration
    from plcql_bench.suite.runs.matrix import estimate_cells, resolve

    costs = {"plcql": {"mpe-cn": {"round_ms": 1000.0, "eval_s": [0.0, 0.0]}}}
    calib_path = tmp_path / "gpu.json"
    calib_path.write_text(json.dumps({"machine": "gpu", "recorded_fallback": False, "costs": costs}))
    calib = load_calibration(str(calib_path))
    variant = cell_cost(Cell("plcql-k1", "mpe-cn", "expert", 0), profile, calib)
    assert variant.seconds == pytest.approx(2.0) and variant.proxy
    assert not cell_cost(Cell("plcql", "mpe-cn", "expert", 0), profile, calib).proxy
    assert cell_cost(Cell("cfcql", "mpe-cn", "expert", 0), profile, calib).seconds is None  # cfcql is no variant

    build_dataset("mpe-cn", "random", 6, tmp_path / "data" / "plantest", profile="plantest")
    execute(plan_run(Cell("bc", "mpe-cn", "random", 0), profile, tmp_path / "data", tmp_path / "results"),
            log=lambda *_: None)  # a recorded runtime for bc
    items = resolve(select_cells(profile), profile, tmp_path / "data", tmp_path / "results")
    sources = {(e.cell.algo, e.source) for e in estimate_cells(items, tmp_path / "results", profile, calib)}
    assert ("bc", "none") in sources and ("bc", "recorded") not in sources
    calib["recorded_fallback"] = True
    sources = {(e.cell.algo, e.source) for e in estimate_cells(items, tmp_path / "results", profile, calib)}
    assert ("bc", "recorded") in sources


def test_committed_h100_calibration_names_its_sources():
    """h100-docs is transcribed, not measured by bench-speed: every entry says where its number comes from,
    and it never borrows this VM's recorded runtimes."""
    from plcql_bench.suite.runs.calibration import load_calibration

    calib = load_calibration("h100-docs")
    assert calib["recorded_fallback"] is False and calib["default_jobs"] == 1
    entries = [e for tasks in calib["costs"].values() for e in tasks.values()]
    assert len(entries) == 12 and all("docs/algorithms/" in e["note"] and e["round_ms"] > 0 for e in entries)
    assert calib["costs"]["cfcql"]["mpe-cn"]["round_ms"] == 40.2  # docs/algorithms/cfcql.md, "On a GPU"
    assert all(calib["costs"][a]["mpe-pp"].get("proxy") for a in ("cfcql", "plcql", "spacql"))


def test_runs_done_on_a_dataset_not_built_here_count_by_its_committed_card(tmp_path, profile, monkeypatch):
    """A fresh clone has the committed results but not the datasets: `plan` and `campaign status` take
    the dataset's sha256 from its committed card, so those runs show as done, not as todo."""
    from plcql_bench.datasets import cards, manifest
    from plcql_bench.suite.runs.matrix import resolve

    build_dataset("mpe-cn", "random", 6, tmp_path / "data" / "plantest", profile="plantest")
    for seed in (0, 1, 2):
        execute(plan_run(Cell("bc", "mpe-cn", "random", seed), profile, tmp_path / "data", tmp_path / "results"),
                log=lambda *_: None)
    entry = manifest.lookup(tmp_path / "data" / "plantest", "mpe-cn", "random")
    shutil.rmtree(tmp_path / "data")  # the datasets are gone; the results stay
    monkeypatch.setattr(cards, "CARDS_DIR", tmp_path / "cards")

    def plan_rows():
        out = _invoke(tmp_path, "plan", "--profile", str(tmp_path / "p.yaml"), "--only", "algo=bc").output
        return [line.split() for line in out.splitlines() if line.startswith("bc ")]

    assert [r[4] for r in plan_rows()] == ["todo"] * 6  # no card: nothing to plan the runs on
    (tmp_path / "cards" / "plantest" / "mpe-cn").mkdir(parents=True)
    (tmp_path / "cards" / "plantest" / "mpe-cn" / "random.json").write_text(json.dumps(entry))
    rows = plan_rows()
    assert [(r[2], r[4]) for r in rows] == [("expert", "todo")] * 3 + [("random", "done")] * 3
    assert all("dataset not built yet" in " ".join(r) for r in rows if r[2] == "expert")
    items = resolve([Cell("bc", "mpe-cn", "random", 0)], profile, tmp_path / "data", tmp_path / "results")
    assert items[0].dataset_missing and items[0].plan.dataset_sha256 == entry["sha256"]
    # `all` skips them without building the dataset (a fresh clone builds only what it trains on)
    done = _invoke(tmp_path, "all", "--profile", str(tmp_path / "p.yaml"), "--only", "algo=bc,dataset=random")
    assert done.exit_code == 0 and "trained 0, skipped 3 (done)" in done.output, done.output
    assert "not built yet" not in done.output and not (tmp_path / "data").exists()
    # a card of another dataset (another sha256) plans other run keys: the runs do not count
    (tmp_path / "cards" / "plantest" / "mpe-cn" / "random.json").write_text(json.dumps({**entry, "sha256": "0" * 64}))
    assert [r[4] for r in plan_rows() if r[2] == "random"] == ["todo"] * 3


def test_a_rebuild_of_a_cards_recipe_on_another_cpu_keeps_the_cards_name(tmp_path, profile, monkeypatch):
    """Another CPU's floating-point kernels give a rebuild other bytes (another sha256) but the same recipe and,
    to rounding, the same statistics: its runs take the committed card's sha256 as the dataset's name (so the
    committed runs on that card stay done), load the file by its own sha256, record both in final.json, and
    score with the card's reference returns (they drift in the last bits too). A different recipe, or
    statistics or reference returns further off than REBUILD_RTOL, make a dataset of its own."""
    from plcql_bench.datasets import cards, manifest

    build_dataset("mpe-cn", "random", 6, tmp_path / "data" / "plantest", profile="plantest")
    entry = manifest.lookup(tmp_path / "data" / "plantest", "mpe-cn", "random")
    monkeypatch.setattr(cards, "CARDS_DIR", tmp_path / "cards")
    card_file = tmp_path / "cards" / "plantest" / "mpe-cn" / "random.json"
    card_file.parent.mkdir(parents=True)
    cell = Cell("bc", "mpe-cn", "random", 0)

    def plan_with_card(**changes):
        card_file.write_text(json.dumps({**entry, "sha256": "c" * 64, **changes}))
        return plan_run(cell, profile, tmp_path / "data", tmp_path / "results")

    own = plan_run(cell, profile, tmp_path / "data", tmp_path / "results")
    assert own.dataset_sha256 == entry["sha256"] and own.dataset_rebuild is None  # no card here yet
    lo, hi = entry["ref_return_random"], entry["ref_return_expert"]
    card_hi = hi + 1e-4 * abs(hi)  # far more than rounding, so a score from the build's refs would differ
    rebuilt = plan_with_card(return_mean=entry["return_mean"] * (1 + 1e-5), ref_return_expert=card_hi)
    assert rebuilt.dataset_sha256 == "c" * 64 and rebuilt.file_sha256 == entry["sha256"]
    assert rebuilt.run_key != own.run_key and 0 < rebuilt.dataset_rebuild["max_rel_diff"] < 2e-4
    execute(rebuilt, log=lambda *_: None)  # loads: the file is checked against its own sha256
    final = json.loads(rebuilt.final_path.read_text())
    assert final["dataset_sha256"] == "c" * 64 and final["dataset_rebuild"] == {
        "card_sha256": "c" * 64, "file_sha256": entry["sha256"], "max_rel_diff": rebuilt.dataset_rebuild["max_rel_diff"],
        "card_refs": {"ref_return_random": lo, "ref_return_expert": card_hi},
        "file_refs": {"ref_return_random": lo, "ref_return_expert": hi}}
    ret = final["final_eval"]["return_mean"]
    assert final["score"] == pytest.approx(100 * (ret - lo) / (card_hi - lo), rel=1e-12)
    assert final["score"] != pytest.approx(100 * (ret - lo) / (hi - lo), rel=1e-7)
    assert plan_with_card().is_done()  # the card's runs count as done for the rebuild
    # an episode a step longer in a large dataset is rounding; in this 6-episode one it is other data
    assert cards.rebuild_difference({**entry, "n_transitions": 149_475}, {**entry, "n_transitions": 149_474}) < 1e-5
    assert plan_with_card(n_transitions=entry["n_transitions"] + 1).dataset_rebuild is None
    for other in ({"return_mean": entry["return_mean"] * 1.01},         # statistics off: other data
                  {"ref_return_expert": hi * 1.01},                      # reference returns off: other policies
                  {"generator_seed": 1}, {"behaviour_policy_id": "matd3:other"}, {"n_episodes": 7}):
        p = plan_with_card(**other)
        assert (p.dataset_sha256, p.dataset_rebuild, p.run_key) == (entry["sha256"], None, own.run_key), other
    card_file.write_text(json.dumps(entry))  # the card's own file: no rebuild
    assert plan_run(cell, profile, tmp_path / "data", tmp_path / "results").dataset_rebuild is None


def test_recorded_estimates_name_their_basis_and_weak_ones_never_start_under_a_deadline(tmp_path, monkeypatch):
    """An estimate from recorded runtimes says which runs it came from (the same cell, the algorithm on the task,
    the algorithm elsewhere, anything); --finish-within gives a job priced only from other tasks no estimate,
    so it is left for later instead of being started and cut off."""
    from plcql_bench.suite.commands import runs as cli_module
    from plcql_bench.suite.runs.executors import Job
    from plcql_bench.suite.runs.matrix import estimate_cells, resolve

    (tmp_path / "p.yaml").write_text(PROFILE.replace("tasks: [mpe-cn]", "tasks: [mpe-cn, mpe-pp]"))
    prof = load_profile(str(tmp_path / "p.yaml"))
    data, results = tmp_path / "data", tmp_path / "results"
    build_dataset("mpe-cn", "random", 6, data / "plantest", profile="plantest")
    execute(plan_run(Cell("bc", "mpe-cn", "random", 0), prof, data, results), log=lambda *_: None)
    empty = {"machine": "empty", "costs": {}}
    cells = {"cell": Cell("bc", "mpe-cn", "random", 1), "task": Cell("bc", "mpe-cn", "expert", 0),
             "algo": Cell("bc", "mpe-pp", "random", 0), "any": Cell("cfcql", "mpe-pp", "expert", 0)}
    estimates = {e.cell: e for e in estimate_cells(resolve(list(cells.values()), prof, data, results), results, prof, empty)}
    assert {basis: estimates[c].basis for basis, c in cells.items()} == {b: b for b in cells}
    assert all(estimates[c].source == "recorded" and estimates[c].seconds > 0 for c in cells.values())
    assert [basis for basis, c in cells.items() if estimates[c].weak] == ["algo", "any"]

    monkeypatch.setattr(cli_module, "calibration_for", lambda machine=None: empty)  # as the CLI looks it up
    jobs = [Job(cell=c, profile=prof, data_dir=data, results_dir=results) for c in cells.values()]
    cli_module._set_estimates(jobs, prof, {"data_dir": data, "results_dir": results})
    priced = {basis: job.estimate_s is not None for basis, job in zip(cells, jobs)}
    assert priced == {"cell": True, "task": True, "algo": False, "any": False}
    out = _invoke(tmp_path, "plan", "--profile", str(tmp_path / "p.yaml"), "--machine", str(_empty_calibration(tmp_path))).output
    assert "only from other tasks' runs, which --finish-within does not start" in out, out


def _empty_calibration(tmp: Path) -> Path:
    path = tmp / "empty.json"  # a machine calibration that knows nothing: recorded runtimes only
    path.write_text(json.dumps({"machine": "empty", "costs": {}}))
    return path


def test_recorded_runtimes_count_a_resumed_run_whole_and_skip_runs_trained_on_another_device(tmp_path, profile):
    """A resumed run's cost is all its processes' training time (train_s), not its last process's wall clock;
    a run trained partly on a GPU, or with no device recorded, does not price a CPU's cells."""
    from plcql_bench.suite.runs.matrix import _recorded_rates, recorded_runtimes

    data, results = tmp_path / "data", tmp_path / "results"
    build_dataset("mpe-cn", "random", 6, data / "plantest", profile="plantest")
    runs = {}
    for seed in (0, 1, 2):
        plan = plan_run(Cell("bc", "mpe-cn", "random", seed), profile, data, results)
        execute(plan, log=lambda *_: None)
        runs[seed] = plan.final_path
    edits = {0: {"train_s": 100.0, "wall_clock_s": 10.0},  # resumed: its last process ran 10 s of 100
             1: {"train_s": 1.0, "wall_clock_s": 1.0, "devices": [{"from_update": 0, "device": "cuda:0"},
                                                                  {"from_update": 1, "device": "cpu"}]},
             2: {"train_s": 1.0, "wall_clock_s": 1.0}}
    for seed, edit in edits.items():
        raw = json.loads(runs[seed].read_text())
        raw["train"].update(edit)
        if seed == 2:
            raw.pop("hardware")
        runs[seed].write_text(json.dumps(raw))
    recorded = sorted((sorted(r["devices"]), r["seconds"]) for r in recorded_runtimes(results))
    assert recorded == [([], 1.0), (["cpu"], 100.0), (["cpu", "cuda"], 1.0)]
    assert _recorded_rates(results, "plantest")[("bc", "mpe-cn", "random")] == [100.0 / 2]  # 2 updates
    assert _recorded_rates(results, "plantest", "cuda") == {}
