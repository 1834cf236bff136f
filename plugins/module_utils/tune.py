# -*- coding: utf-8 -*-
# ddtree-fleet: the search of tune.yml (issue 29) - one architecture group's best serving
# configuration, found under the deploy's own gate.
#
# Pure logic, no I/O: the search space, a trial's record and its score at a latency bound, the
# search itself, its bound on trials, the winner's gain over the known-good with an interval, and
# the group_vars it proposes. Whatever runs the trials records each outcome and asks
# ``next_trial`` what to run next: today the unit tests and tests/bench/tune_search.py against the
# lab physics (lab/tune_physics.py); next the playbook tune.yml (docs/tune.md), through the one
# gated candidate path (watchdog, probe, lossless agreement, the speed gate's load runner).
#
# The search is plain sequential code (``_search``) that asks a ``measure`` callback for each
# trial. ``next_trial`` replays it over the recorded trials: a trial already recorded is answered
# from its record, the first one that is not is the next to run. So the records alone are the
# state: an interrupted tune continues where it stopped, and a second tune over the same records
# runs nothing again. Replay is deterministic because the search reads nothing but the records.
#
# The search, for one group, starting from its current values (the warm start):
#   1. memory: the highest mem_fraction_static that starts and serves, stepping down from the
#      top of the ladder like vLLM's auto_tune (each step a trial that may crash: recorded, never
#      proposed). It holds for the rest of the search; a bigger decode-graph batch that no
#      longer starts there steps it down again, for that batch only.
#   2. screen: every algorithm at its warm knobs, with few rounds.
#   3. successive halving: the best ``keep`` algorithms that served go on; each climbs its own
#      knob's ladder (the DDTree budget, the NEXTN depth) from the warm value, one rung at a time in
#      the direction that improves, while the score improves by more than ``min_gain``.
#   4. the leader's decode-graph max batch, climbed the same way.
#   5. confirm: the best ``keep`` distinct configurations and the warm start (the known-good
#      configuration) again with more rounds; the winner is the best confirmed score.
# A configuration that failed (start, serve, quality or lossless gate) scores nothing at any
# stage and can never be the winner or the proposal.

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from statistics import median

# The speed gate's statistics, for the winner's gain interval.
from ansible_collections.ddtree.fleet.plugins.module_utils.speed import shift_interval

ALGORITHMS = ("NEXTN", "DFLASH", "DDTREE")
# The latency percentiles the speed gate's load runner reports per level (sglang_speed_gate).
LATENCY_METRICS = ("itl_p50_ms", "itl_p99_ms", "ttft_p50_ms", "ttft_p99_ms")
SCREEN, CONFIRM = "screen", "confirm"


class TuneError(ValueError):
    """A space, settings or record that cannot be searched; the message names the field."""


@dataclass(frozen=True)
class Config:
    """One serving configuration of the knobs tune searches. Knobs that do not apply to the
    algorithm are 0 (``canonical``), so one configuration has one key."""
    algorithm: str
    mem_fraction_static: float
    cuda_graph_max_bs: int
    ddtree_budget: int = 0
    nextn_steps: int = 0
    nextn_topk: int = 0
    nextn_draft_tokens: int = 0

    def canonical(self) -> "Config":
        c = replace(self, mem_fraction_static=round(float(self.mem_fraction_static), 3))
        if c.algorithm != "DDTREE":
            c = replace(c, ddtree_budget=0)
        if c.algorithm != "NEXTN":
            c = replace(c, nextn_steps=0, nextn_topk=0, nextn_draft_tokens=0)
        return c

    @property
    def key(self) -> str:
        c = self.canonical()
        parts = [c.algorithm, "mfs%.3f" % c.mem_fraction_static, "bs%d" % c.cuda_graph_max_bs]
        if c.algorithm == "DDTREE":
            parts.append("budget%d" % c.ddtree_budget)
        if c.algorithm == "NEXTN":
            parts.append("nextn%d-%d-%d" % (c.nextn_steps, c.nextn_topk, c.nextn_draft_tokens))
        return "/".join(parts)

    def group_vars(self) -> dict:
        """The project variables this configuration sets (what a trial overrides and what the
        proposal writes into group_vars/<group>.yml)."""
        c = self.canonical()
        out = {"sglang_speculative_algorithm": c.algorithm,
               "sglang_mem_fraction_static": c.mem_fraction_static,
               "sglang_cuda_graph_max_bs": c.cuda_graph_max_bs}
        if c.algorithm == "DDTREE":
            out["sglang_ddtree_budget"] = c.ddtree_budget
        if c.algorithm == "NEXTN":
            out["sglang_speculative_params"] = {"NEXTN": {"num_steps": c.nextn_steps, "eagle_topk": c.nextn_topk,
                                                          "num_draft_tokens": c.nextn_draft_tokens}}
        return out

    @classmethod
    def from_dict(cls, d: dict) -> "Config":
        try:
            return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d}).canonical()
        except TypeError as exc:
            raise TuneError("a trial's config is not a tune configuration: %s" % exc) from exc


def warm_start(group_vars: dict, algorithm: str) -> Config:
    """The configuration a group's current values give ``algorithm`` (its NEXTN parameters from
    sglang_speculative_params; topk 1 resolves the draft tokens to num_steps + 1 as 0.5.23 does)."""
    nextn = ((group_vars.get("sglang_speculative_params") or {}).get("NEXTN") or {})
    steps = int(nextn.get("num_steps", 3))
    topk = int(nextn.get("eagle_topk", 1))
    draft = steps + 1 if topk == 1 else int(nextn.get("num_draft_tokens", steps + 1))
    return Config(algorithm=algorithm,
                  mem_fraction_static=float(group_vars.get("sglang_mem_fraction_static", 0.9)),
                  cuda_graph_max_bs=int(group_vars.get("sglang_cuda_graph_max_bs", 48)),
                  ddtree_budget=int(group_vars.get("sglang_ddtree_budget", 32)),
                  nextn_steps=steps, nextn_topk=topk, nextn_draft_tokens=draft).canonical()


@dataclass(frozen=True)
class Space:
    """The values tune may try. Ladders are in increasing order except ``mem_fractions``, which is
    the step-down order (highest first)."""
    algorithms: tuple = ALGORITHMS
    mem_fractions: tuple = (0.95, 0.93, 0.91, 0.89, 0.87, 0.85, 0.82, 0.8)
    cuda_graph_max_bs: tuple = (16, 32, 48, 64, 96)
    ddtree_budgets: tuple = (8, 16, 24, 32, 48, 64, 96, 128)
    nextn_steps: tuple = (1, 2, 3, 4, 5, 6, 7, 8)   # topk 1, draft tokens num_steps + 1

    def check(self) -> "Space":
        for name in ("algorithms", "mem_fractions", "cuda_graph_max_bs", "ddtree_budgets", "nextn_steps"):
            if not getattr(self, name):
                raise TuneError("tune space %s is empty; expected at least one value" % name)
        bad = [a for a in self.algorithms if a not in ALGORITHMS]
        if bad:
            raise TuneError("tune space algorithms: %s not among %s" % (", ".join(bad), ", ".join(ALGORITHMS)))
        if list(self.mem_fractions) != sorted(self.mem_fractions, reverse=True) \
                or not all(0.0 < m < 1.0 for m in self.mem_fractions):
            raise TuneError("tune space mem_fractions must be in (0, 1), highest first; got %r" % (self.mem_fractions,))
        for name, lo in (("cuda_graph_max_bs", 1), ("ddtree_budgets", 1), ("nextn_steps", 1)):
            values = list(getattr(self, name))
            if values != sorted(set(values)) or values[0] < lo:
                raise TuneError("tune space %s must be distinct integers >= %d in increasing order; got %r"
                                % (name, lo, tuple(values)))
        return self

    def knob(self, algorithm: str) -> tuple:
        """(field, ladder) of the algorithm's own knob, or (None, ()) for DFLASH."""
        if algorithm == "DDTREE":
            return "ddtree_budget", self.ddtree_budgets
        if algorithm == "NEXTN":
            return "nextn_steps", self.nextn_steps
        return None, ()

    def grid(self, mem_fraction: float) -> list:
        """Every configuration of the space at one memory fraction: the exhaustive grid."""
        out = []
        for algo in self.algorithms:
            _, ladder = self.knob(algo)
            for bs in self.cuda_graph_max_bs:
                for v in ladder or (0,):
                    out.append(with_knob(Config(algo, mem_fraction, bs), self, v) if ladder
                               else Config(algo, mem_fraction, bs).canonical())
        return out


def with_knob(config: Config, space: Space, value: int) -> Config:
    """``config`` with its algorithm's own knob at ``value`` (NEXTN: topk 1, draft num_steps + 1)."""
    name, _ = space.knob(config.algorithm)
    if name == "ddtree_budget":
        return replace(config, ddtree_budget=int(value)).canonical()
    if name == "nextn_steps":
        return replace(config, nextn_steps=int(value), nextn_topk=1, nextn_draft_tokens=int(value) + 1).canonical()
    return config.canonical()


@dataclass(frozen=True)
class Settings:
    concurrency: tuple = (1, 4, 16)
    latency_metric: str = "itl_p99_ms"
    latency_bound_ms: float = 60.0
    max_trials: int = 30
    screen_rounds: int = 3       # speed-gate rounds per concurrency level while searching
    confirm_rounds: int = 8      # and in the confirmation (the gain interval needs a few)
    keep: int = 2                # algorithms kept after the screen; configurations confirmed
    min_gain: float = 0.03       # a climb goes on while the score improves by more than this (above the noise)
    confidence: float = 0.95     # of the winner's gain interval

    def check(self) -> "Settings":
        if not self.concurrency or any(int(c) < 1 for c in self.concurrency):
            raise TuneError("tune_concurrency must be a non-empty list of integers >= 1; got %r" % (self.concurrency,))
        if self.latency_metric not in LATENCY_METRICS:
            raise TuneError("tune_latency_metric %r is not one of %s" % (self.latency_metric, ", ".join(LATENCY_METRICS)))
        if not self.latency_bound_ms > 0:
            raise TuneError("tune_latency_bound_ms must be > 0; got %r" % (self.latency_bound_ms,))
        if self.max_trials < 1 or self.keep < 1 or self.screen_rounds < 1 or self.confirm_rounds < 1:
            raise TuneError("tune_max_trials, tune_keep, tune_screen_rounds and tune_confirm_rounds must be >= 1")
        if not 0.0 <= self.min_gain < 1.0 or not 0.5 <= self.confidence < 1.0:
            raise TuneError("tune_min_gain must be in [0, 1) and tune_confidence in [0.5, 1)")
        return self

    def rounds(self, fidelity: str) -> int:
        return self.confirm_rounds if fidelity == CONFIRM else self.screen_rounds


# ------------------------------------------------------------------------------------- records
# A trial record (JSON): {"key", "config": {...}, "fidelity": "screen" | "confirm", "status":
# "ok" | "failed", "stage" (where a failed one stopped: start, serve, quality, lossless, ...),
# "reason", "evidence", "seconds", "levels": [{"concurrency", "rounds": [tok/s, ...],
# "itl_p50_ms", "itl_p99_ms", "ttft_p50_ms", "ttft_p99_ms"}]}: the levels as the speed gate's load
# runner returns them (sglang_speed_gate, measure mode).

def record_id(config: Config, fidelity: str) -> str:
    return "%s@%s" % (config.key, fidelity)


def index(records) -> dict:
    """record_id -> the newest record of each (configuration, fidelity)."""
    out = {}
    for r in records:
        try:
            out[record_id(Config.from_dict(r["config"]), r["fidelity"])] = r
        except (KeyError, TypeError) as exc:
            raise TuneError("a trial record lacks %s" % exc) from exc
    return out


def level_score(level: dict, settings: Settings):
    """The level's throughput (median of its rounds) if its latency is within the bound, else None."""
    latency = level.get(settings.latency_metric)
    rounds = [float(x) for x in level.get("rounds") or []]
    if latency is None or not rounds or float(latency) > settings.latency_bound_ms:
        return None
    return median(rounds)


def score(record, settings: Settings):
    """(throughput, concurrency) of the record's best level within the latency bound: None for a
    failed trial, (0.0, None) when no level met the bound."""
    if record is None or record.get("status") != "ok":
        return None
    best = (0.0, None)
    for level in record.get("levels") or []:
        s = level_score(level, settings)
        if s is not None and s > best[0]:
            best = (s, int(level["concurrency"]))
    return best


# -------------------------------------------------------------------------------------- search

class _NeedTrial(Exception):
    def __init__(self, config: Config, fidelity: str):
        super().__init__(record_id(config, fidelity))
        self.config, self.fidelity = config, fidelity


class _Budget(Exception):
    """The trial budget is spent: the search stops where it is and reports its best."""


@dataclass
class _Run:
    space: Space
    settings: Settings
    measure: object                               # (config, fidelity) -> record
    seen: dict = field(default_factory=dict)      # record id -> (config, record), in the order asked

    def get(self, config: Config, fidelity: str = SCREEN) -> dict:
        config = config.canonical()
        rid = record_id(config, fidelity)
        if rid not in self.seen:
            if len(self.seen) >= self.settings.max_trials:
                raise _Budget()
            self.seen[rid] = (config, self.measure(config, fidelity))
        return self.seen[rid][1]

    def value(self, config: Config, fidelity: str = SCREEN) -> float:
        """The trial's score; -1 for a failed one (below any that served)."""
        s = score(self.get(config, fidelity), self.settings)
        return -1.0 if s is None else s[0]

    def better(self, v: float, than: float) -> bool:
        if than < 0:
            return v >= 0
        return v > than * (1.0 + self.settings.min_gain)


def _memory(run: _Run, warm: Config) -> Config:
    """Step 1: the highest memory fraction of the ladder that starts and serves ``warm``."""
    for mfs in run.space.mem_fractions:
        c = replace(warm, mem_fraction_static=mfs).canonical()
        if score(run.get(c), run.settings) is not None:
            return c
    return replace(warm, mem_fraction_static=run.space.mem_fractions[-1]).canonical()


def _climb(run: _Run, start: Config, ladder: tuple, move, rung) -> Config:
    """Hill-climb one ladder from ``start``: ``move(config, value)`` sets the knob, ``rung(config)``
    reads it. Tries the rung above, then (if that did not improve) the one below, and goes on in the
    direction that improved while each step improves by more than min_gain."""
    values = list(ladder)
    here = min(range(len(values)), key=lambda i: (abs(values[i] - rung(start)), i))
    cur = move(start, values[here])
    cur_v = run.value(cur)
    for step in (1, -1):
        i, moved = here, False
        while 0 <= i + step < len(values):
            cand = move(cur, values[i + step])
            v = run.value(cand)
            if not run.better(v, cur_v):
                break
            cur, cur_v, i, moved = cand, v, i + step, True
        if moved:
            break
    return cur


def _graph_move(run: _Run):
    """Set the decode-graph max batch. A bigger batch needs more reserved memory: when it does not
    start at the current fraction, step the fraction down the ladder for it until it does."""
    def move(config: Config, bs: int) -> Config:
        c = replace(config, cuda_graph_max_bs=int(bs)).canonical()
        if c == config:
            return c
        for mfs in [m for m in run.space.mem_fractions if m <= config.mem_fraction_static]:
            c2 = replace(c, mem_fraction_static=mfs).canonical()
            rec = run.get(c2)
            if rec.get("status") == "ok" or rec.get("stage") != "start":
                return c2
        return c
    return move


def _search(space: Space, warm: dict, settings: Settings, measure) -> dict:
    run = _Run(space=space, settings=settings, measure=measure)
    current = warm["current"]
    winner, stopped = None, None
    try:
        first = current.algorithm if current is not None and current.algorithm in space.algorithms \
            else space.algorithms[0]
        mfs = _memory(run, warm["by_algorithm"][first]).mem_fraction_static
        screened = []
        for algo in space.algorithms:
            c = replace(warm["by_algorithm"][algo], mem_fraction_static=mfs).canonical()
            v = run.value(c)
            if v >= 0:
                screened.append((v, c))
        screened.sort(key=lambda t: (-t[0], t[1].key))
        leaders = []
        for _, c in screened[:settings.keep]:
            name, ladder = space.knob(c.algorithm)
            if ladder:
                c = _climb(run, c, ladder, lambda cfg, val: with_knob(cfg, space, val),
                           lambda cfg, name=name: getattr(cfg, name))
            leaders.append((run.value(c), c))
        leaders.sort(key=lambda t: (-t[0], t[1].key))
        if leaders:
            top = _climb(run, leaders[0][1], space.cuda_graph_max_bs, _graph_move(run),
                         lambda cfg: cfg.cuda_graph_max_bs)
            leaders[0] = (run.value(top), top)
            leaders.sort(key=lambda t: (-t[0], t[1].key))
        confirmed = []
        for _, c in leaders[:settings.keep]:
            v = run.value(c, CONFIRM)
            if v >= 0:
                confirmed.append((v, c))
        if current is not None:
            run.get(current, CONFIRM)   # the known-good configuration, measured as the winner is
        if confirmed:
            winner = sorted(confirmed, key=lambda t: (-t[0], t[1].key))[0][1]
    except _Budget:
        stopped = "the trial budget (tune_max_trials=%d) ran out" % settings.max_trials
    if winner is None:   # stopped early: the best that served, preferring confirmed measurements
        served = []
        for rid, (cfg, rec) in run.seen.items():
            s = score(rec, settings)
            if s is not None:
                served.append((rid.endswith("@" + CONFIRM), s[0], cfg))
        if served:
            winner = sorted(served, key=lambda t: (not t[0], -t[1], t[2].key))[0][2]
    return {"trials": list(run.seen), "winner": winner, "stopped": stopped, "current": current}


def warm_configs(space: Space, group_vars: dict) -> dict:
    """{current: the group's configuration as deployed (None when its algorithm is not tuned),
    by_algorithm: each algorithm's warm start}."""
    algo = str(group_vars.get("sglang_speculative_algorithm", "NEXTN")).upper()
    return {"current": warm_start(group_vars, algo) if algo in ALGORITHMS else None,
            "by_algorithm": {a: warm_start(group_vars, a) for a in space.algorithms}}


def search(space: Space, group_vars: dict, settings: Settings, measure) -> dict:
    """The whole search with ``measure(config, fidelity) -> record`` called for every trial (a
    bench against a model, or a test). Returns {trials: record ids in order, winner: Config or
    None, stopped: None or why it ended early, current: the warm start's own configuration}."""
    return _search(space.check(), warm_configs(space, group_vars), settings.check(), measure)


def next_trial(space: Space, group_vars: dict, settings: Settings, records) -> dict:
    """What to run next, from the recorded trials alone.

    Returns {done: false, next: {id, config, group_vars, fidelity, rounds}, asked, reused} while
    a trial is missing, and {done: true, winner, stopped, asked, reused} once the search is over
    (``asked``: the trials the search has asked for so far, ``reused``: how many of them were
    answered from records)."""
    known = index(records)
    used = set()

    def measure(config: Config, fidelity: str) -> dict:
        rid = record_id(config, fidelity)
        if rid in known:
            used.add(rid)
            return known[rid]
        raise _NeedTrial(config, fidelity)
    try:
        result = search(space, group_vars, settings, measure)
    except _NeedTrial as need:
        return {"done": False, "asked": len(used) + 1, "reused": len(used),
                "next": {"id": record_id(need.config, need.fidelity), "config": asdict(need.config),
                         "group_vars": need.config.group_vars(), "fidelity": need.fidelity,
                         "rounds": settings.rounds(need.fidelity)}}
    winner = result["winner"]
    return {"done": True, "asked": len(result["trials"]), "reused": len(used), "stopped": result["stopped"],
            "winner": None if winner is None else {"config": asdict(winner), "key": winner.key,
                                                   "group_vars": winner.group_vars()},
            "trials": result["trials"]}


def trial_bound(space: Space, settings: Settings) -> int:
    """The most trials the search can ask for: memory ladder, one screen per algorithm, each kept
    algorithm's whole knob ladder, the graph ladder with a memory step-down on every rung, and the
    confirmation (kept configurations and the known-good one); capped by max_trials."""
    space.check()
    ladders = sorted((len(space.knob(a)[1]) for a in space.algorithms), reverse=True)[:settings.keep]
    graph = len(space.cuda_graph_max_bs) * len(space.mem_fractions)
    total = len(space.mem_fractions) + len(space.algorithms) + sum(ladders) + graph + settings.keep + 1
    return min(settings.max_trials, total)


def gain(records, winner: Config, current: Config, settings: Settings) -> dict:
    """The winner's confirmed throughput over the known-good configuration's, at the winner's best
    concurrency within the latency bound: the speed gate's Hodges-Lehmann ratio and interval of
    their rounds. {ratio, low, high, concurrency} (low/high None with too few rounds)."""
    known = index(records)
    w = known.get(record_id(winner, CONFIRM))
    k = known.get(record_id(current, CONFIRM))
    ws = score(w, settings)
    if ws is None or ws[1] is None or score(k, settings) is None:
        raise TuneError("no confirmed measurement of both %s and %s to compare" % (winner.key, current.key))
    conc = ws[1]

    def rounds(rec):
        for level in rec["levels"]:
            if int(level["concurrency"]) == conc:
                return tuple(float(x) for x in level["rounds"])
        raise TuneError("%s has no level at concurrency %d" % (rec["key"], conc))
    iv = shift_interval(rounds(w), rounds(k), settings.confidence)
    return {"ratio": iv["ratio"], "low": iv["low"], "high": iv["high"], "concurrency": conc}


def trial_record(config: Config, fidelity: str, status: str, levels=(), stage: str = "", reason: str = "",
                 evidence: str = "", seconds: float = 0.0) -> dict:
    """A trial's record as the store keeps it."""
    if status not in ("ok", "failed"):
        raise TuneError("a trial's status is ok or failed, got %r" % (status,))
    return {"key": config.key, "config": asdict(config.canonical()), "fidelity": fidelity, "status": status,
            "stage": stage, "reason": reason, "evidence": evidence, "seconds": round(float(seconds), 1),
            "levels": [dict(level) for level in levels]}


def proposal(group_vars: dict, winner: Config) -> dict:
    """The variables of group_vars/<group>.yml the winner changes: {name: (old, new)}."""
    out = {}
    for name, new in winner.group_vars().items():
        old = group_vars.get(name)
        if name == "sglang_speculative_params":
            merged = dict(old or {})
            merged.update(new)
            new = merged
        if old != new:
            out[name] = (old, new)
    return out


def recommend(group_vars: dict, winner, current, gain_result) -> dict:
    """What tune proposes: the winner's changes when its gain interval lies above 1 (the winner is
    significantly faster than the known-good configuration), else nothing.
    {propose: bool, changes: {name: (old, new)}, why}."""
    if winner is None:
        return {"propose": False, "changes": {}, "why": "no configuration served and passed the gate"}
    if current is not None and winner == current:
        return {"propose": False, "changes": {}, "why": "the current configuration is the best found"}
    changes = proposal(group_vars, winner)
    if gain_result is None or gain_result.get("low") is None:
        return {"propose": False, "changes": changes,
                "why": "too few confirmation rounds for an interval of the gain over the known-good"}
    text = "gain x%.3f [%.3f, %.3f]" % (gain_result["ratio"], gain_result["low"], gain_result["high"])
    if gain_result["low"] <= 1.0:
        return {"propose": False, "changes": changes,
                "why": "%s over the known-good is not significant: keep the current values" % text}
    return {"propose": True, "changes": changes, "why": "%s over the known-good" % text}
