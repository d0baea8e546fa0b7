"""Every note a plan carries says what the plan is (issue 55 item 7).  The notes of the zoo's plans
are parsed for layout claims (dp=N, tp=N, pp=N, cp=N, ep=N, zero=N, ZeRO-N, sp, v=N, m=N, mbs=N,
'N pipeline stages with M micro-batches', 'recomputation: POLICY xN, ...') and compared with the plan's
fields.

Which claims are about the plan: a note compares candidates as 'NAME best TIME (LAYOUT)' ("placement
weighed: device best 35.76 ms (pp=1 dp=2 ...); embedding-host best ... -> embedding-host wins"); each
parenthesised LAYOUT there describes another configuration, except the one of the candidate the note
names the winner ('-> NAME wins'), which is the plan's (sp aside: those layouts never state it).
Every claim outside such a parenthesis is about the plan."""
import re

import pytest

CASES = [          # small models searched whole; large ones on the cost model alone (seconds each)
    ("gpt-tiny", "cpu:nodes=1", 16), ("gpt-small", "a100-80g:nodes=1", 16), ("mlp", "a100-80g:nodes=1", 64),
    ("moe-tiny", "cpu:nodes=1", 8), ("wide-deep-100m", "a100-80g:nodes=1", None), ("wide-deep", "a100-80g:nodes=1", 16384),
    ("resnet50", "v100-32g:nodes=1", 256), ("llama3-8b", "h100-80g:nodes=1", None),
    ("gpt3-175b", "a100-80g:nodes=128", 1536), ("mixtral-8x7b", "h100-80g:nodes=4", None),
]
CANDIDATE = re.compile(r"([\w+-]+) best [\d.]+ \w+ \(((?:[^()]|\([^()]*\))*)\)")     # one nested level
WINNER = re.compile(r"-> ([\w+-]+) wins")
KV = re.compile(r"\b(dp|tp|pp|cp|ep|zero|v|m|mbs)=(\d+)\b")


def _truth(d):
    par, pipe = d["parallel"], d["pipeline"]
    return {"dp": par["dp"], "tp": par["tp"], "pp": par["pp"], "cp": par.get("cp", 1), "ep": par.get("ep", 1),
            "zero": d["zero"], "v": pipe.get("virtual_chunks", 1), "m": pipe["micro_batches"],
            "mbs": pipe.get("micro_batch_size"), "sp": bool(par.get("sp"))}


def _claims(note):
    """(claims about the plan as [(key, value)], the winner's layout text or None)."""
    winner = WINNER.search(note)
    plan_layout = None
    outside = note
    for name, layout in CANDIDATE.findall(note):
        if winner and name == winner.group(1):
            plan_layout = layout
        outside = outside.replace(f"({layout})", "")
    found = [(k, int(v)) for k, v in KV.findall(outside)]
    found += [("zero", int(z)) for z in re.findall(r"\bZeRO-(\d)\b", outside)]
    return found, plan_layout


def _recompute_counts(d):
    rc = d["recompute"]
    blocks = [b for s in d["pipeline"]["stages"] for b in (s.get("blocks") or [])]
    counts = {}
    for b in blocks:
        pol = (rc.get("blocks") or {}).get(b, rc["default"])
        counts[pol] = counts.get(pol, 0) + 1
    return counts


@pytest.fixture(scope="module")
def plans():
    from sapp import api
    return {m: api.search(m, c, global_batch=b, cache=True).to_dict() for m, c, b in CASES}


@pytest.mark.parametrize("model", [c[0] for c in CASES])
def test_notes_claim_what_the_plan_is(plans, model):
    d = plans[model]
    truth = _truth(d)
    for note in d["notes"]:
        found, layout = _claims(note)
        m = re.search(r"dp x cp = (\d+)x(\d+)", note)     # "ZeRO-1 over dp x cp = 4x2": the factors, in order
        if m:
            found += [("dp", int(m.group(1))), ("cp", int(m.group(2)))]
        for k, v in found:
            assert truth[k] == v, f"{model}: note says {k}={v}, the plan {k}={truth[k]}: {note}"
        if layout is not None:          # the winner's layout is the plan's, sp included
            for k, v in KV.findall(layout):
                assert truth[k] == int(v), f"{model}: the winner's {k}={v}, the plan {k}={truth[k]}: {note}"
            # no layout there claims sp either way (search/joint/notes._as_placed: whether SP is placed
            # depends on the model's ops, which the comparison does not work out; parallel.sp says it)
            assert "sp" not in layout.split(), f"{model}: a placement layout claims sp: {note}"
        stages = re.search(r"(\d+) pipeline stages with (\d+) micro-batches(?: \((\w+)(?:, v=(\d+))?\))?", note)
        if stages:
            assert (int(stages.group(1)), int(stages.group(2))) == (truth["pp"], truth["m"]), note
            if stages.group(3):
                assert stages.group(3) == d["pipeline"]["schedule"], note
            assert int(stages.group(4) or 1) == truth["v"], note
        rec = re.match(r"recomputation: (.*)", note)
        if rec:
            said = {p: int(n) for p, n in re.findall(r"(none|selective|full) x(\d+)", rec.group(1))}
            assert said == _recompute_counts(d), f"{model}: {note} vs {d['recompute']}"
        if re.search(r"\bno pipeline\b", note):
            assert truth["pp"] == 1, note


def test_the_rule_tells_candidates_from_the_plan():
    note = ("placement weighed: device best 7.80 ms (pp=1 dp=1 tp=8 m=1 mbs=16384 zero=0); embedding-host best "
            "21.33 ms (pp=1 dp=2 tp=4 m=1 mbs=8192 zero=3 sp); x best 1 ms (pp=2 dp=1 tp=4 m=2 mbs=1 "
            "schedule=interleaved(v=2) zero=1) -> embedding-host wins")
    found, layout = _claims(note)
    assert found == [] and layout == "pp=1 dp=2 tp=4 m=1 mbs=8192 zero=3 sp"
    assert sorted(_claims("ZeRO-2 over dp=8: model states per device 1 MB")[0]) == [("dp", 8), ("zero", 2)]
