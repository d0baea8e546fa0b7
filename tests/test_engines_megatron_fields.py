"""Every flag of Megatron-LM core_v0.16.1's training parser (tests/data/megatron_core_v0.16.1_args.json,
taken from the release by bench/megatron_arg_list.py: Megatron's training arguments are not in the
megatron-core package) is classified by sapp's importer (sapp/engines/megatron_fields.py): priced
(read by megatron.parse), refused in one line when set to what sapp does not price, rejected as
Megatron rejects it, or irrelevant to the priced step with a reason; a flag Megatron does not have
is refused.  The layout flag --pipeline-model-parallel-layout prices as the stage flags it equals."""
import ast
import collections
import json
import re
from pathlib import Path

import pytest

import sapp.engines as E
from sapp import api
from sapp.engines import EngineError, megatron, megatron_model, megatron_recompute
from sapp.engines import fp8 as engine_fp8
from sapp.engines import megatron_fields as F

DATA = json.loads((Path(__file__).parent / "data" / "megatron_core_v0.16.1_args.json").read_text())
ARGS = {f: a for a in DATA["flags"] for f in a["flags"]}
FACTS = {"layers": 8, "names": [f"b{i}" for i in range(8)], "seq": None}


def test_the_stored_list_is_the_targeted_release():
    assert DATA["version"] == F.VERSION and re.fullmatch(r"[0-9a-f]{40}", DATA["commit"])
    assert len(DATA["flags"]) > 600           # the parser's arguments, dataclass-generated ones included
    assert "--num-distributed-optimizer-instances" in ARGS and "--tensor-model-parallel-size" in ARGS


def test_every_megatron_flag_is_classified_and_none_is_invented():
    missing = sorted(set(ARGS) - set(F.FIELDS))
    extra = sorted(set(F.FIELDS) - set(ARGS))
    assert not missing, f"Megatron-LM flags sapp's importer does not classify: {missing}"
    assert not extra, f"flags the table classifies that Megatron-LM {F.VERSION} does not have: {extra}"
    assert F.MULTI == {f for f, a in ARGS.items() if a["nargs"] not in (0, 1)}


def test_no_flag_is_classified_twice():
    """The table merges families (**{...}); a flag in two of them would silently take the later kind."""
    tree = ast.parse(Path(F.__file__).read_text())
    node = next(n for n in tree.body if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "FIELDS")
    seen = collections.Counter()
    for k, v in zip(node.value.keys, node.value.values):
        if k is None:
            seen.update(list(eval(compile(ast.Expression(v), "FIELDS", "eval"), vars(F))))
        else:
            seen[ast.literal_eval(k)] += 1
    assert sum(seen.values()) == len(F.FIELDS), [f for f, n in seen.items() if n > 1]


def test_each_kind_agrees_with_megatrons_own_argument():
    for flag, kind in F.FIELDS.items():
        a = ARGS[flag]
        if kind == "priced":
            continue
        assert kind[0] in ("refused", "rejected", "irrelevant") and len(kind[1]) > 10, (flag, kind)
        if kind[0] == "refused":
            # a switch is refused when present; a flag with a value unless the value is one of `ok`,
            # which holds Megatron's default whenever Megatron has one
            assert (len(kind) == 2) == (a["nargs"] == 0), (flag, kind, a["nargs"])
            d = a["default"]
            if len(kind) == 3 and d is not None:
                d = " ".join(map(str, d)) if isinstance(d, list) else d
                assert F._same(d, kind[2]), f"{flag}: Megatron's default {d!r} would be refused"


def _constants(module):
    return {n.value for n in ast.walk(ast.parse(Path(module.__file__).read_text()))
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and re.fullmatch(r"--[a-z0-9-]+", n.value)}


def test_the_parser_reads_only_megatrons_flags_and_every_priced_one():
    read = (_constants(megatron) | _constants(megatron_model) | _constants(F) | _constants(engine_fp8)
            | _constants(megatron_recompute))
    assert not sorted(read - set(ARGS)), "sapp reads flags Megatron-LM does not have"
    priced = {f for f, k in F.FIELDS.items() if k == "priced"}
    assert not sorted(priced - read), "priced flags the parser never reads"


def _bad_value(flag):
    kind, a = F.FIELDS[flag], ARGS[flag]
    ok = kind[2] if len(kind) == 3 else ()
    for c in a["choices"] or []:
        if not F._same(c, ok):
            return str(c)
    return "7" if not F._same("7", ok) else "x"


REFUSED = sorted(f for f, k in F.FIELDS.items() if k != "priced" and k[0] in ("refused", "rejected"))


@pytest.mark.parametrize("flag", REFUSED)
def test_a_refused_flag_is_refused_in_one_line(flag):
    kind = F.FIELDS[flag]
    text = f"--num-layers 8 --recompute-granularity selective {flag}"
    if kind[0] == "refused" and len(kind) == 3:
        text += f" {_bad_value(flag)}"
        if kind[2]:         # Megatron's default (and what sapp prices) is accepted
            megatron.parse(f"--num-layers 8 --recompute-granularity selective {flag} {kind[2][0]}", FACTS, 8)
    with pytest.raises(EngineError, match=re.escape(flag)) as e:
        megatron.parse(text, FACTS, 8)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("text, says", [
    ("--fp8 hybrid", "--fp8: Megatron-LM core_v0.16.1's parser has no such argument"),
    ("--use-custom-fsdp", "no such argument"),
    ("--no-position-embedding", "rejects it without --position-embedding-type rope"),
    ("--recompute-activations --recompute-modules core_attn mla_up_proj", "--recompute-modules mla_up_proj: Megatron-Core supports it only with --multi-latent-attention"),
    ("--recompute-activations --recompute-modules core_attn mpl", "--recompute-modules mpl: Megatron-Core core_v0.16.1 "
                                                                  "allows only"),
])
def test_unknown_and_conditional_flags(text, says):
    with pytest.raises(EngineError, match=re.escape(says)):
        megatron.parse("--num-layers 8 " + text, FACTS, 8)


def test_only_irrelevant_flags_are_listed_as_not_read():
    e = megatron.parse("--num-layers 8 --recompute-granularity full --recompute-modules mlp --optimizer adam "
                       "--position-embedding-type rope --no-position-embedding --lr 1e-4 --data-path 0.3 a 0.7 b "
                       "--use-precision-aware-optimizer --exp-avg-dtype fp32", FACTS, 8)
    note = next(n for n in e.notes if "were not read" in n)
    assert note.startswith("4 argument(s)") and "--data-path, --lr, --no-position-embedding, " \
                                                "--use-precision-aware-optimizer" in note
    assert e.recompute == "full"           # --recompute-modules is read with selective recomputation only
    toks = megatron.tokens("--data-path 0.3 a 0.7 b --recompute-modules core_attn mlp --lr 1e-4")
    assert toks == {"--data-path": "0.3 a 0.7 b", "--recompute-modules": "core_attn mlp", "--lr": "1e-4"}


@pytest.mark.parametrize("layout, flags, device, chunks", [
    ("Ettt|tttttL", "--decoder-first-pipeline-num-layers 3", [3, 5], None),
    ("Et,t|t*5,tL", "--decoder-first-pipeline-num-layers 2 --decoder-last-pipeline-num-layers 6", [2, 6], None),
    ("E(tt|)*3,ttL", "--num-layers-per-virtual-pipeline-stage 2", [4, 4], [2, 2, 2, 2]),
    ("E|(t|)*8,L", "--num-layers-per-virtual-pipeline-stage 1 --account-for-embedding-in-pipeline-split "
                   "--account-for-loss-in-pipeline-split", [4, 4], [0] + [1] * 8 + [0]),
])
def test_a_layout_reads_as_the_stage_flags_it_equals(layout, flags, device, chunks):
    base = "--num-layers 8 --pipeline-model-parallel-size 2 "
    a = megatron.parse(base + f"--pipeline-model-parallel-layout '{layout}'", FACTS, 8)
    b = megatron.parse(base + flags, FACTS, 8)
    assert (a.device_blocks, a.chunk_blocks, a.schedule, a.v) == (b.device_blocks, b.chunk_blocks, b.schedule, b.v)
    assert a.device_blocks == device and (chunks is None or a.chunk_blocks == chunks)


@pytest.mark.parametrize("layout, extra, says", [
    ("Ettt|ttt|t|tL", "", "sapp prices interleaving with equal virtual stages"),
    ("Et*3|t*5,mL", "", "multi-token prediction"),
    ("Et*3|t*4L", "", "places 7 decoder layers but the model has 8"),
    ("tEtt|t*5L", "", "the embedding E once, first"),
    ("Et*3|t*5|L", "", "3 stages, not a multiple of"),
    ("E(t)*99999999|L", "", "far more layers"),
    ("Et*3|t*5xL", "", "'x' is not a layer"),
    ("Et*3|t*5L", "--decoder-first-pipeline-num-layers 3", "rejects the two together"),
])
def test_a_layout_sapp_cannot_price_is_refused_in_one_line(layout, extra, says):
    with pytest.raises(EngineError) as e:
        megatron.parse(f"--num-layers 8 --pipeline-model-parallel-size 2 {extra} "
                       f"--pipeline-model-parallel-layout '{layout}'", FACTS, 8)
    assert says in str(e.value) and "\n" not in str(e.value)


@pytest.fixture(scope="module")
def small():
    return api.capture_graph(api.resolve_model("gpt-small")[0])[0], api.resolve_cluster("a100-80g:devices=8")


def test_a_layout_with_an_empty_stage_is_refused_in_one_line(small):
    graph, cl = small
    with pytest.raises(EngineError, match="leaves pipeline stage 0 without layers") as e:
        E.import_config("--num-layers 4 --pipeline-model-parallel-size 2 --global-batch-size 16 "
                        "--pipeline-model-parallel-layout 'E|ttttL'", "megatron", graph, cl, "gpt-small")
    assert "\n" not in str(e.value)


def test_a_layout_prices_as_the_flags_it_equals(small):
    graph, cl = small
    base = "--num-layers 4 --pipeline-model-parallel-size 2 --global-batch-size 16 --bf16 "
    for layout, flags in (("Et|tttL", "--decoder-first-pipeline-num-layers 1"),
                          ("E|t|t|t|t|L", "--num-layers-per-virtual-pipeline-stage 1 --account-for-embedding-in-"
                                          "pipeline-split --account-for-loss-in-pipeline-split")):
        a = E.import_config(base + f"--pipeline-model-parallel-layout '{layout}'", "megatron", graph, cl, "gpt-small")
        b = E.import_config(base + flags, "megatron", graph, cl, "gpt-small")
        assert a["predicted"] == b["predicted"] and a["pipeline"] == b["pipeline"]
