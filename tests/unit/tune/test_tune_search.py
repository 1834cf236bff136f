"""tune.yml's search (plugins/module_utils/tune.py): the space, the score at a latency bound, the
search and its replay over recorded trials, the bound, the gain and the proposal.

The objective is the lab physics (lab/tune_physics.py: the stand-in's own start-up rules and
rates, with seeded noise), so the search meets the curves docs/lab-physics.md documents: memory
that crashes above a fraction, DDTREE's "!!!!" on sm86, interior optima of the budget and the
NEXTN depth, graphs that stop covering a batch."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import pytest
import yaml

import tune_physics
from ansible_collections.ddtree.fleet.plugins.module_utils import tune
from ansible_collections.ddtree.fleet.plugins.module_utils.tune import Config, Settings, Space

REPO = Path(__file__).resolve().parents[3]


def group_vars(arch: str, algorithm: str | None = None) -> dict:
    gv = yaml.safe_load((REPO / "group_vars" / "all.yml").read_text())
    gv.update(yaml.safe_load((REPO / "group_vars" / f"{arch}.yml").read_text()) or {})
    if algorithm:
        gv["sglang_speculative_algorithm"] = algorithm
    return gv


def lab_measure(arch: str, settings: Settings, calls: list | None = None, seed: str = ""):
    def measure(config: Config, fidelity: str) -> dict:
        if calls is not None:
            calls.append(tune.record_id(config, fidelity))
        out = tune_physics.measure(arch, asdict(config), fidelity, settings.concurrency,
                                    rounds=settings.rounds(fidelity), seed=seed)
        return tune.trial_record(config, fidelity, out["status"], out["levels"], out["stage"], out["reason"])
    return measure


# sm86's known-good is NEXTN (DDTREE fails there); sm120's is the fleet's DDTREE.
CASES = [("sm120", None), ("sm86", "NEXTN")]


@pytest.mark.parametrize("arch,algorithm", CASES)
def test_the_search_finds_the_grids_best_within_a_few_percent_in_a_third_of_its_trials(arch, algorithm):
    settings, space = Settings(), Space()
    res = tune.search(space, group_vars(arch, algorithm), settings, lab_measure(arch, settings))
    assert res["stopped"] is None and res["winner"] is not None
    mfs = res["winner"].mem_fraction_static
    grid = {c.key: tune_physics.true_score(arch, asdict(c), settings.latency_bound_ms, settings.concurrency)
            for c in space.grid(mfs)}
    best = max(v for v in grid.values() if v is not None)
    found = tune_physics.true_score(arch, asdict(res["winner"]), settings.latency_bound_ms, settings.concurrency)
    assert found >= 0.97 * best, (res["winner"].key, found, best)
    assert len(res["trials"]) < len(grid) / 3, (len(res["trials"]), len(grid))
    assert len(res["trials"]) <= tune.trial_bound(space, settings)


def test_a_failed_configuration_is_never_the_winner_ddtree_on_sm86():
    settings = Settings()
    calls = []
    res = tune.search(Space(), group_vars("sm86", "NEXTN"), settings, lab_measure("sm86", settings, calls))
    assert any(c.startswith("DDTREE/") for c in calls), "DDTREE was screened"
    assert res["winner"].algorithm != "DDTREE"
    # and the memory step-down began above what starts there: 0.95 crashed, recorded, not proposed
    assert calls[0].startswith("NEXTN/mfs0.950/") and res["winner"].mem_fraction_static < 0.95


def test_a_winner_is_only_proposed_with_a_significant_gain_over_the_known_good():
    settings = Settings()
    gv = group_vars("sm86", "NEXTN")
    records = []
    measure = lab_measure("sm86", settings)

    def recording(config, fidelity):
        rec = measure(config, fidelity)
        records.append(rec)
        return rec
    res = tune.search(Space(), gv, settings, recording)
    g = tune.gain(records, res["winner"], res["current"], settings)
    assert g["low"] is not None and g["low"] > 1.0, g     # DFLASH over NEXTN on sm86 (48 vs 40 tok/s)
    rec = tune.recommend(gv, res["winner"], res["current"], g)
    assert rec["propose"] and rec["changes"]["sglang_speculative_algorithm"] == ("NEXTN", res["winner"].algorithm)
    # the known-good itself as the winner, or a gain whose interval reaches 1: nothing proposed
    assert not tune.recommend(gv, res["current"], res["current"], g)["propose"]
    assert not tune.recommend(gv, res["winner"], res["current"], dict(g, low=0.98))["propose"]


def test_replay_resumes_an_interrupted_tune_and_a_second_run_reuses_every_trial():
    settings, space, gv = Settings(), Space(), group_vars("sm120")
    measure = lab_measure("sm120", settings)
    records = []
    # an interrupted tune: 4 trials recorded, then the run died
    for _ in range(4):
        step = tune.next_trial(space, gv, settings, records)
        assert not step["done"] and step["reused"] == len(records)
        cfg = Config.from_dict(step["next"]["config"])
        assert step["next"]["group_vars"]["sglang_speculative_algorithm"] == cfg.algorithm
        assert step["next"]["rounds"] == settings.rounds(step["next"]["fidelity"])
        records.append(measure(cfg, step["next"]["fidelity"]))
    ran = len(records)
    while True:
        step = tune.next_trial(space, gv, settings, records)
        if step["done"]:
            break
        records.append(measure(Config.from_dict(step["next"]["config"]), step["next"]["fidelity"]))
    first = step
    assert first["winner"] is not None and first["asked"] == len(records) > ran
    # the whole search again over the same records runs nothing and ends the same
    again = tune.next_trial(space, gv, settings, records)
    assert again["done"] and again["reused"] == len(records) and again["winner"] == first["winner"]
    # and it is the search the callback way gives
    assert tune.search(space, gv, settings, measure)["winner"].key == first["winner"]["key"]


def test_the_trial_budget_stops_the_search_with_the_best_it_has():
    settings = Settings(max_trials=5)
    res = tune.search(Space(), group_vars("sm120"), settings, lab_measure("sm120", settings))
    assert "tune_max_trials=5" in res["stopped"] and len(res["trials"]) == 5
    assert res["winner"] is not None
    assert tune.trial_bound(Space(), settings) == 5


def test_score_is_the_best_throughput_within_the_latency_bound():
    s = Settings(latency_metric="itl_p99_ms", latency_bound_ms=50)
    levels = [{"concurrency": 1, "rounds": [100, 110, 90], "itl_p99_ms": 12},
              {"concurrency": 4, "rounds": [300, 320, 310], "itl_p99_ms": 40},
              {"concurrency": 16, "rounds": [900, 950, 920], "itl_p99_ms": 75}]
    cfg = Config("DFLASH", 0.9, 48)
    assert tune.score(tune.trial_record(cfg, "screen", "ok", levels), s) == (310.0, 4)
    assert tune.score(tune.trial_record(cfg, "screen", "ok", levels), Settings(latency_bound_ms=100)) == (920.0, 16)
    assert tune.score(tune.trial_record(cfg, "screen", "ok", levels), Settings(latency_bound_ms=5)) == (0.0, None)
    assert tune.score(tune.trial_record(cfg, "screen", "failed", stage="start"), s) is None


def test_configurations_have_one_key_and_render_the_projects_variables():
    a = Config("DFLASH", 0.9, 48, ddtree_budget=64, nextn_steps=5)
    assert a.key == Config("DFLASH", 0.90000001, 48).key == "DFLASH/mfs0.900/bs48"
    nextn = tune.with_knob(Config("NEXTN", 0.85, 16), Space(), 6)
    assert nextn.key == "NEXTN/mfs0.850/bs16/nextn6-1-7"
    assert nextn.group_vars() == {"sglang_speculative_algorithm": "NEXTN", "sglang_mem_fraction_static": 0.85,
                                  "sglang_cuda_graph_max_bs": 16,
                                  "sglang_speculative_params": {"NEXTN": {"num_steps": 6, "eagle_topk": 1,
                                                                          "num_draft_tokens": 7}}}
    # the warm start reads the group's values (topk 1: draft tokens num_steps + 1, as 0.5.23 does)
    warm = tune.warm_start(group_vars("sm120"), "DDTREE")
    assert warm == Config("DDTREE", 0.9, 48, ddtree_budget=32)
    assert tune.warm_start(group_vars("sm86"), "NEXTN").key == "NEXTN/mfs0.850/bs16/nextn3-1-4"
    gv = group_vars("sm86")
    assert tune.proposal(gv, tune.with_knob(tune.warm_start(gv, "NEXTN"), Space(), 3)) == {
        "sglang_speculative_algorithm": ("DDTREE", "NEXTN")}


@pytest.mark.parametrize("space,field", [
    (Space(algorithms=()), "algorithms"),
    (Space(algorithms=("NEXTN", "MEDUSA")), "MEDUSA"),
    (Space(mem_fractions=(0.8, 0.9)), "mem_fractions"),
    (Space(mem_fractions=(1.2,)), "mem_fractions"),
    (Space(ddtree_budgets=(32, 16)), "ddtree_budgets"),
    (Space(cuda_graph_max_bs=(0, 16)), "cuda_graph_max_bs"),
])
def test_a_bad_space_is_refused_naming_the_field(space, field):
    with pytest.raises(tune.TuneError, match=field):
        space.check()


@pytest.mark.parametrize("settings,field", [
    (Settings(latency_metric="p90_e2e"), "tune_latency_metric"),
    (Settings(latency_bound_ms=0), "tune_latency_bound_ms"),
    (Settings(concurrency=()), "tune_concurrency"),
    (Settings(max_trials=0), "tune_max_trials"),
    (Settings(min_gain=1.5), "tune_min_gain"),
])
def test_bad_settings_are_refused_naming_the_variable(settings, field):
    with pytest.raises(tune.TuneError, match=field):
        settings.check()
