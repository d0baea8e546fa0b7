"""Every key of the installed DeepSpeed's configuration surface is classified by sapp's importer
(sapp/engines/deepspeed_fields.py): priced, refused in one line, or irrelevant with a reason.  The
surface is read off DeepSpeed's own config code by running it (tests/deepspeed_surface.py): a key
DeepSpeed adds that the table lacks fails here, as does a table key DeepSpeed never reads, a key the
table accepts that DeepSpeed's config rejects, or a refused field at DeepSpeed's own default.

The dropped fields of issue 36 each have a test: AutoTP, Ulysses sequence parallelism, ZeRO++, ZenFlow,
mics_shard_size and `bf16.enabled: "auto"` are refused in one line; bf16 master weights / optimizer
states are priced as fewer optimizer bytes and survive export -> import."""
import json

import pytest

import sapp.engines as E
from sapp import api
from sapp.engines import EngineError, deepspeed
from sapp.engines.deepspeed_fields import CLOSED, FIELDS, check

from tests import engine_validate as V

SMALL = "a100-80g:devices=8"
BASE = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 2},
        "bf16": {"enabled": True}}


@pytest.fixture(scope="module")
def ds():
    pytest.importorskip("deepspeed")
    from tests import deepspeed_surface as S
    return S, {".".join(p): v for p, v in S.surface().items()}


def _covered(path):
    parts = path.split(".")
    return any(".".join(parts[:n]) in FIELDS for n in range(len(parts), 0, -1))


def test_every_deepspeed_key_is_classified(ds):
    _, surface = ds
    missing = sorted(p for p in surface if not _covered(p))
    assert not missing, f"DeepSpeed keys sapp's importer does not classify: {missing}"
    for path, kind in FIELDS.items():
        assert kind[0] in ("priced", "refused", "irrelevant"), path
        assert len(kind[-1]) > 10, f"{path}: say how it is priced, what to change, or why it is irrelevant"


def test_the_table_names_only_keys_deepspeed_reads(ds):
    _, surface = ds
    stale = [k for k in FIELDS if k not in surface and not any(p.startswith(k + ".") for p in surface)]
    assert not stale, f"table keys DeepSpeed's config never reads: {stale}"


def test_closed_sections_are_the_ones_deepspeed_validates(ds):
    S, surface = ds
    parents = {p.rsplit(".", 1)[0] for p, (kind, _) in surface.items() if kind == "field"}
    assert parents <= CLOSED, parents - CLOSED
    for section in sorted(CLOSED):      # DeepSpeed rejects a key it does not know there, as sapp does
        d = {S.PROBE: 0}
        for k in reversed(section.split(".")):
            d = {k: d}
        with pytest.raises(Exception, match="xtra|not permitted"):
            S.parse({**S.BASE, **d})
        with pytest.raises(EngineError) as e:      # (ZenFlow: refused as a section before its keys)
            check(d)
        assert "rejects it" in str(e.value) or FIELDS[section][0] == "refused", str(e.value)


def test_keys_deepspeed_rejects_are_refused(ds):
    S, surface = ds
    removed = [p for p, (kind, _) in surface.items() if kind == "removed"]
    assert "zero_optimization.mics_shard_size" in removed       # 0.19.8 removed MiCS
    for path in removed:
        assert FIELDS[path][:2] == ("refused", ()), path
        d = 1
        for k in reversed(path.split(".")):
            d = {k: d}
        with pytest.raises(Exception, match="removed"):
            S.parse({**S.BASE, **d})


def _at(path, value):
    d = value
    for k in reversed(path.split(".")):
        d = {k: d}
    return d


def _merge(a, b):
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def test_what_the_table_accepts_deepspeed_accepts_at_its_default(ds):
    """Each pydantic field at DeepSpeed's own default: DeepSpeed's config parses it and sapp's check
    lets it through (a refused field's default is one of the values it accepts)."""
    S, surface = ds
    for path, (kind, f) in sorted(surface.items()):
        if kind != "field":
            continue
        default = f.get_default(call_default_factory=True)
        cfg = _merge(S.BASE, _at(path, default))
        S.parse(cfg)
        parts = path.split(".")
        if any(FIELDS.get(".".join(parts[:n]), ("",))[0] == "refused" for n in range(1, len(parts))):
            continue        # a section refused whenever present (ZenFlow: present is on)
        try:
            check(cfg)
        except EngineError as e:
            pytest.fail(f"{path} at DeepSpeed's default {default!r} is refused: {e}")


# ---- the dropped fields of issue 36 ----------------------------------------------------------------
REFUSED = [
    ("tensor_parallel.autotp_size", {"tensor_parallel": {"autotp_size": 4}}),
    ("sequence_parallel_size", {"sequence_parallel_size": 4}),
    ("zero_quantized_weights", {"zero_optimization": {"stage": 3, "zero_quantized_weights": True}}),
    ("zero_quantized_gradients", {"zero_optimization": {"stage": 3, "zero_quantized_gradients": True}}),
    ("zero_hpz_partition_size", {"zero_optimization": {"stage": 3, "zero_hpz_partition_size": 8}}),
    ("zenflow", {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"},
                                       "zenflow": {"topk_ratio": 0.1, "update_interval": 4}}}),
    ("mics_shard_size", {"zero_optimization": {"stage": 3, "mics_shard_size": 8}}),
    ("bf16.enabled", {"bf16": {"enabled": "auto"}}),
    ("fp16.enabled", {"bf16": {}, "fp16": {"enabled": "auto"}}),
]


@pytest.mark.parametrize("key,extra", REFUSED, ids=[r[0] for r in REFUSED])
def test_a_dropped_field_is_refused_in_one_line(key, extra):
    cfg = _merge(BASE, extra)
    with pytest.raises(EngineError, match=key.replace(".", r"\.")) as e:
        E.parse_safely(deepspeed, "deepspeed", json.dumps(cfg), {}, 8)
    assert "\n" not in str(e.value) and ("set it" in str(e.value) or "remove" in str(e.value)
                                         or "write" in str(e.value)), str(e.value)


def test_the_same_fields_at_their_defaults_are_accepted():
    for extra in ({"tensor_parallel": {"autotp_size": 0}}, {"tensor_parallel": {"autotp_size": 1}},
                  {"sequence_parallel_size": 1}, {"zero_optimization": {"stage": 3, "zero_hpz_partition_size": 1,
                                                                        "zero_quantized_weights": False}},
                  {"zero_optimization": {"zenflow": None}}, {"bf16": {"enabled": True, "check_grad_overflow": "auto"}}):
        assert deepspeed.parse(json.dumps(_merge(BASE, extra)), {}, 8).precision == "bf16-mixed"


@pytest.mark.parametrize("refused", [r for r in sorted(FIELDS) if FIELDS[r][0] == "refused"])
def test_every_refused_key_is_refused_in_one_line(refused):
    ok = FIELDS[refused][1]
    value = next(v for v in (True, 8, "other", {"x": 1}) if not any(v == o and type(v) is type(o) for o in ok))
    with pytest.raises(EngineError, match=refused.rsplit(".", 1)[-1]) as e:
        deepspeed.parse(json.dumps(_merge(BASE, _at(refused, value))), {}, 8)
    assert "\n" not in str(e.value)


def test_an_unknown_key_is_refused_where_deepspeed_rejects_it_and_noted_where_it_ignores_it():
    with pytest.raises(EngineError, match="zero_optimization.stage3_max_live_param: DeepSpeed 0.19.8 rejects"):
        deepspeed.parse(json.dumps(_merge(BASE, {"zero_optimization": {"stage3_max_live_param": 1}})), {}, 8)
    cfg = deepspeed.parse(json.dumps(_merge(BASE, {"zero_optimisation": {"stage": 3}})), {}, 8)
    assert cfg.zero == 2 and any("zero_optimisation is not read" in n for n in cfg.notes)


@pytest.fixture(scope="module")
def small():
    cl = api.resolve_cluster(SMALL)
    graph, _ = api.capture_graph(api.resolve_model("gpt3-350m")[0])
    return graph, cl


@pytest.mark.parametrize("flags,optimizer,per_param", [
    ({}, "adam", 12), ({"bf16_master_weights_and_grads": True}, "adam-bf16-master", 10),
    ({"bf16_master_weights_and_grads": True, "bf16_optimizer_states": True}, "adam-bf16-states", 6)])
def test_bf16_master_weights_are_priced_and_round_trip(small, flags, optimizer, per_param):
    graph, cl = small
    cfg = _merge(BASE, {"bf16": flags})
    plan = E.import_config(json.dumps(cfg), "deepspeed", graph, cl, "gpt3-350m")
    assert plan["settings"]["optimizer"] == optimizer
    adam = E.import_config(json.dumps(BASE), "deepspeed", graph, cl, "gpt3-350m")
    # the optimizer states, sharded over the 8 ZeRO-2 ranks, are (12 - per_param) bytes a parameter smaller
    saved = adam["predicted"]["peak_memory_bytes"] - plan["predicted"]["peak_memory_bytes"]
    # (within 5% of the bare parameter count: the peak carries the memory model's own state accounting)
    assert saved == pytest.approx((12 - per_param) * plan["model"]["params"] / 8, rel=0.05, abs=1e6)
    text, exported, notes = E.export_plan(plan, "deepspeed", graph=graph, cluster=cl)
    assert not notes and json.loads(text)["bf16"] == {"enabled": True, **({
        "bf16_master_weights_and_grads": True, "bf16_optimizer_states": per_param == 6} if flags else {})}
    back = E.import_config(text, "deepspeed", graph, cl, "gpt3-350m")
    assert back["settings"]["optimizer"] == optimizer
    assert back["predicted"]["step_time_s"] == plan["predicted"]["step_time_s"]
    assert back["predicted"]["peak_memory_bytes"] == plan["predicted"]["peak_memory_bytes"]
    if flags:
        with pytest.raises(EngineError, match="bf16 master weights"):
            E.export_plan(plan, "megatron", graph=graph, cluster=cl)
        pytest.importorskip("deepspeed")
        cfg = V.deepspeed(text, plan["parallel"]["dp"])     # DeepSpeed's own parser accepts the export
        assert cfg.bfloat16_config.bf16_master_weights_and_grads


def test_bf16_master_weights_where_deepspeed_refuses_them():
    for extra, what in (({"zero_optimization": {"stage": 0}, "bf16": {"bf16_master_weights_and_grads": True}},
                         "ZeRO stage 1, 2 or 3"),
                        ({"bf16": {"bf16_optimizer_states": True}}, "needs bf16.bf16_master_weights_and_grads")):
        with pytest.raises(EngineError, match=what):
            deepspeed.parse(json.dumps(_merge(BASE, extra)), {}, 8)


def test_sapp_run_refuses_a_plan_priced_with_bf16_master_weights():
    """A plan priced for DeepSpeed's bf16 masters runs under DeepSpeed only: sapp's own program keeps
    fp32 masters and moments (more memory than priced), so emit refuses it in one line."""
    from torch import nn
    from sapp.emit.checks import plan as checks
    from sapp.errors import PlanError
    from sapp.plan import Plan
    from tests.emit_workers.plans import make_plan
    model = nn.Linear(4, 4)
    d = make_plan(params=sum(p.numel() for p in model.parameters()), global_batch=4).to_dict()
    d.setdefault("settings", {})["optimizer"] = "adam-bf16-master"
    with pytest.raises(PlanError) as e:
        checks.check_optimizer(Plan(d))
    assert "sapp export --to deepspeed" in str(e.value) and "\n" not in str(e.value)
