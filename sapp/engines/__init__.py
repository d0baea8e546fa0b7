"""Plans in and out of the engines users train with: Megatron-LM arguments, torchtitan 0.3's typed Python
job configuration (`torchtitan`; 0.2.2's TOML as `torchtitan@0.2.2`), DeepSpeed JSON (one module each;
`mapping` is the engine-neutral middle).

    text, plan, notes = export_plan(plan, "megatron")             # `sapp export`
    plan = import_config(text, "megatron", graph, cluster, name)  # `sapp import`

An element an engine cannot state is refused in one line (EngineError), or exported as the nearest
configuration the engine runs with a note, and re-priced as exported: never dropped silently.
Engine files are read as data (shlex tokens, tomllib, json, ast): nothing in them is executed."""
from __future__ import annotations

import dataclasses
import importlib

from ..units import printable
from .mapping import EngineConfig, EngineError, comparison, from_plan, price

from sapp.search.targets import ENGINES as TABLE

MAX_FACT = 1 << 40         # a model dimension an engine file states (vocabularies, sequences): far past any model


def get(name: str):
    """The module that reads and writes engine `name`'s files (its row's `module`, under sapp/engines/)."""
    if name not in TABLE:
        raise EngineError(f"unknown engine {str(name)[:40]!r}; use one of {', '.join(TABLE)}")
    mod = TABLE[name].module
    return importlib.import_module(mod if "." in mod else f"sapp.engines.{mod}")


def model_facts(meta: dict, names) -> dict:
    """The model's shape as an engine states it, from a plan's / graph's meta (zoo config or HF
    config facts); None where unknown.  `layers` is the captured block count.  Every fact is written
    into the engine's file as a number, so a plan whose meta holds anything else (a string carrying a
    newline and a flag) is refused here."""
    c = meta.get("config") if isinstance(meta, dict) else None
    c = dict(c) if isinstance(c, dict) else {}
    hf = {"h": "hidden_size", "a": "num_attention_heads", "kv": "num_key_value_heads", "ffn": "intermediate_size",
          "V": "vocab_size", "experts": "num_local_experts", "top_k": "num_experts_per_tok"}
    for k, key in hf.items():
        if k not in c and key in c:
            c[k] = c[key]
    # the dense MLP's width and the experts' apart (Megatron's --ffn-hidden-size and --moe-ffn-hidden-size):
    # DeepSeek-V3's dense 18432 was compared with its experts' 2048 and its own export refused (issue 52).
    # An MoE model with no dense layer has no dense width to check (Megatron builds no dense MLP);
    # Mixtral's HF config states its experts' width as intermediate_size.
    experts = c.get("experts")
    ffn = c.get("ffn") if not experts or c.get("dense") else None
    expert_ffn = (c.get("expert_ffn") or c.get("ffn")) if experts else None
    out = {"hidden": c.get("h"), "heads": c.get("a"), "kv_heads": c.get("kv"), "ffn": ffn, "expert_ffn": expert_ffn,
           "seq": meta.get("seq") or c.get("s"), "vocab": c.get("V"), "experts": experts,
           "top_k": c.get("top_k")}
    for k, v in out.items():
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_FACT):
            raise EngineError(f"the model's {k} is {str(v)[:40]!r}, not a whole number up to {MAX_FACT}; "
                              f"search the plan again with this sapp")
    return {"layers": len(names), "names": list(names), **out}


def arch_facts(name, meta, layers) -> dict:
    """{"arch": the architecture an engine builds (sapp/engines/arch.py) or None, "arch_why": why not}."""
    from .arch import architecture
    try:
        return {"arch": architecture(name, meta, layers), "arch_why": None}
    except EngineError as e:
        return {"arch": None, "arch_why": str(e)}


def block_names(graph) -> list:
    from ..pipeline.units import split_units
    return [u.name for u in split_units(graph) if u.kind == "block"]


def export_plan(plan, engine: str, *, graph=None, cluster=None, model=None, trust_plan_model=False):
    """(text, plan as exported, notes).  When the engine runs something other than the plan says, the
    configuration is conformed to what it runs, re-priced (capturing `model`, else the plan's model,
    unless `graph` is given) and every change is in `notes`.  The plan's model name is data: a zoo
    name or a config.json is built from it, a pkg.module:factory only with `trust_plan_model`."""
    from ..cluster import Cluster
    from . import fp8
    mod = get(engine)
    ecfg = from_plan(plan, engine)
    names = block_order(plan, graph)
    # FP8 linears as the engine states them (engines/fp8.py), first: refused where it states none
    # (DeepSpeed, torchtitan 0.3's rowwise-only converter), the other recipe re-priced as the engine's own
    first = []
    fp8.conform(ecfg, engine, first)
    out, notes = mod.conform(ecfg, names)
    notes = first + notes
    if out.grad_fp32 and engine != "megatron":
        out = out.replace(grad_fp32=False)
        notes.append(f"the plan holds and reduces fp32 gradients (Megatron's main_grads); {engine} keeps them at "
                     f"its own width: re-priced so")
    if out.recompute_modules and engine != "megatron":
        notes.append(f"the plan recomputes Megatron's modules {' '.join(out.recompute_modules)}; {engine} states its "
                     f"own selective recomputation: re-priced so")
        out = out.replace(recompute_modules=())
    if out.moe_a2a_overlap and engine != "megatron":
        notes.append(f"the plan hides MoE all-to-alls behind the paired micro-batch (Megatron's "
                     f"--overlap-moe-expert-parallel-comm); {engine} runs them exposed: re-priced so")
        out = out.replace(moe_a2a_overlap=False, delay_wgrad=False)
    exported = plan
    if notes:
        if graph is None:
            from ..api import capture_graph, resolve_model
            from .megatron_build import from_file, names_a_file
            spec = model if model is not None else _plan_model(plan, trust_plan_model)
            module = from_file(spec) if model is None and names_a_file(plan) else resolve_model(spec)[0]
            graph, _ = capture_graph(module)
            plan.check_model(graph.fingerprint(), spec)
        cl = cluster or Cluster.from_dict(plan["cluster"], where="plan's cluster section: ")
        exported = price(graph, cl, out, name=plan["model"]["name"],
                         notes=[f"exported to {engine}: {n}" for n in notes])
    facts = model_facts(plan["model"].get("meta") or {}, names)
    if TABLE[engine].builds_model:  # (DeepSpeed trains the user's own module)
        facts.update(arch_facts(plan["model"]["name"], plan["model"].get("meta") or {}, len(names)))
    pr = exported["predicted"]
    header = [f"{engine} configuration written by `sapp export` for {plan['model']['name']} on {plan['devices']} GPUs",
              f"priced {pr['step_time_s']:.4g} s/step, MFU {pr['mfu']:.1%} ({out.runtime} runtime): {out.describe()}"]
    header = [printable(h) for h in header + [f"NOTE: {n}" for n in notes]]
    return mod.export(out, facts, names, header=header), exported, notes


def _plan_model(plan, trusted: bool) -> str:
    from ..models.resolve import kind_of
    spec = plan["model"]["name"]
    if not isinstance(spec, str):
        raise EngineError("the plan's model name is not a string; pass --model NAME")
    if kind_of(spec) == "factory" and not trusted:
        raise EngineError(f"re-pricing the export needs the model; the plan names '{printable(spec[:120])}', "
                          f"code that would be imported and run: pass --model {printable(spec[:120])} if you "
                          f"trust it (or --trust-plan-model), or --model NAME")
    return spec


def block_order(plan, graph=None) -> list:
    if graph is not None:
        return block_names(graph)
    from .mapping import block_order as order
    return order(plan)


def parse_safely(mod, engine, text, facts, devices, job=None):
    """`mod.parse`, whose every failure on a file's values is one line: the parsers check what they know
    (EngineError); a value they never expected (a zero, a string where a number goes, nesting too deep
    for the reader) still ends here, named, never as a traceback.  `job`: the job function of a torchtitan
    0.3 file of several (only that parser takes one)."""
    if job is not None and engine != "torchtitan":
        raise EngineError(f"--job picks a job function of a torchtitan 0.3 Python file; a {engine} "
                          f"configuration has none")
    try:
        return mod.parse(text, facts, devices) if job is None else mod.parse(text, facts, devices, job=job)
    except EngineError:
        raise
    except RecursionError:
        raise EngineError(f"the {engine} configuration nests too deeply to be a configuration") from None
    except (ValueError, TypeError, ArithmeticError, KeyError, AttributeError, IndexError) as e:
        raise EngineError(f"the {engine} configuration has a value sapp cannot use ({type(e).__name__}: "
                          f"{printable(str(e))[:120]}); check its numbers and types") from None


def import_config(text: str, engine: str, graph, cluster, name: str, *, meta=None, source="", runtime=None,
                  job=None):
    """The sapp Plan of the engine configuration `text` on `cluster` for the captured `graph`; `runtime`
    prices it under another profile of the same engine (bench.published_torchtitan: "torchtitan-2412",
    the stack of torchtitan's published benchmark); `job`: the job function of a torchtitan 0.3 file of
    several (`sapp import --job`)."""
    mod = get(engine)
    names = block_names(graph)
    facts = model_facts(meta if meta is not None else graph.meta, names)
    if TABLE[engine].builds_model:
        facts.update(arch_facts(name, meta if meta is not None else graph.meta, len(names)))
    ecfg = parse_safely(mod, engine, text, facts, cluster.devices, job)
    if runtime is not None:
        ecfg.runtime = runtime
    where = f" {source}" if source else ""
    return price(graph, cluster, ecfg, name=name, notes=[f"imported from {engine}{where}: {ecfg.describe()}"])


def target_of(engine: str, runtime: str) -> str:
    """The target of `engine`'s family whose profile `runtime` is: a torchtitan 0.2.2 TOML given as
    `--from torchtitan` is priced, and compared, as torchtitan@0.2.2."""
    from sapp.search.constraints import TARGETS
    family = [t for t in TABLE if t.split("@")[0] == engine.split("@")[0]]
    return next((t for t in [engine] + family if runtime in TARGETS[t]["runtimes"]), engine)


def best_plan(graph, cluster, engine: str, *, global_batch, settings: dict, model=None, constraints=None,
              fits=None, progress=None, must_fit=False):
    """sapp's fastest plan for `engine` as the engine runs it (`sapp import`'s comparison): the search under
    --target `engine`, exported (conformed and re-priced).  The search may pick a per-block recomputation
    mix the engine states only coarsely (Megatron: full on the first N layers of every virtual stage),
    which conforming can make slower than the user's own configuration, or too big to fit; so when
    conforming changed the plan, the search runs again with each recomputation the engine states on
    every layer pinned, and the fastest exported plan that fits is kept (the first one if none fits); a
    conformed plan that outgrew memory is searched for again with what conforming added held back.
    `sapp search --target` runs this too.  `settings`: api.search's runtime / precision / optimizer /
    grad_fp32; `constraints`: the user's pins (a pinned recomputation is not varied); `fits`: api.search's
    further test (estimate_fit.py), applied to the exported plans as well; `must_fit` (`sapp search
    --target`): when no exported plan fits, InfeasibleError naming the nearest, never a plan that does not
    fit (`sapp import` compares with the nearest instead)."""
    from .. import api
    from sapp.search.constraints import TARGETS
    from ..errors import InfeasibleError

    pinned, errors = dict(constraints or {}), []
    # the searches below differ in pins and headroom only: what the joint search finds that depends on
    # neither (tp layouts, stage numbers) is found once per cluster (api.search's `caches`)
    shared = {}

    def one(pins, searched=cluster, mods=()):
        try:
            # (a search pricing other modules keeps its own caches: they hold numbers of its settings)
            p = api.search(graph=graph, model=model, cluster=searched, global_batch=global_batch,
                           constraints={**pinned, "target": engine, **pins}, fits=fits, progress=progress,
                           caches=shared.setdefault((id(searched), mods), {}), **settings,
                           **({"recompute_modules": mods} if mods else {}))
        except InfeasibleError as e:
            errors.append(e)
            return None
        text, out, notes = export_plan(p, engine, graph=graph, cluster=cluster)
        out._timing = getattr(p, "_timing", {})
        out._searched_peak = p["predicted"]["peak_memory_bytes"]
        return out, bool(notes), text

    first = one({})
    found = [first] if first else []
    # A plan the search packed to the edge of memory can outgrow it once conformed (the engine's equal
    # stages, its coarser recomputation): search again with what conforming added held back from the
    # usable memory, twice at most.
    last, held = first, cluster
    for _ in range(2):
        if last is None or not last[1] or last[0]["predicted"]["peak_memory_bytes"] <= cluster.usable_memory:
            break
        grew = last[0]["predicted"]["peak_memory_bytes"] - last[0]._searched_peak
        room = min(held.usable_memory, cluster.usable_memory - max(grew, 0.0)) - 0.005 * cluster.device_memory
        held = dataclasses.replace(held, memory_headroom=min(0.5, 1.0 - room / cluster.device_memory))
        last = one({}, held)
        found += [last] if last else []
    if (first is None or first[1]) and pinned.get("recompute") is None:
        found += [r for r in (one({"recompute": rc}) for rc in TARGETS[engine]["recompute"]) if r]
    if engine == "megatron" and pinned.get("recompute") is None and any(_full(p) for p, _, _ in found):
        # where memory asks for full recomputation, Megatron's selective recomputation of named modules
        # (--recompute-modules) may fit for less (sapp/recompute/modules.py)
        from ..pipeline.profile import attention_core
        from ..recompute.modules import search_candidates
        found += [r for r in (one({"recompute": "selective"}, mods=m) for m in search_candidates(graph, attention_core))
                  if r]
    if fits is not None:
        found = [r for r in found if fits_file(engine, r[2], cluster, getattr(fits, "version", "main"))]
    if not found:
        raise errors[0] if errors else InfeasibleError(f"no {engine} configuration of this model fits the cluster")
    ok = [p for p, _, _ in found if p["predicted"]["peak_memory_bytes"] <= cluster.usable_memory]
    if not ok and must_fit:
        raise near_miss(engine, [p for p, _, _ in found], cluster)
    return min(ok, key=lambda p: p["predicted"]["step_time_s"]) if ok else found[0][0]


def _full(plan) -> bool:
    rc = plan["recompute"] or {}
    return rc.get("default") == "full" or "full" in (rc.get("blocks") or {}).values()


def near_miss(engine: str, plans, cluster):
    """The one-line InfeasibleError of a --target search whose exported plans all outgrow the devices:
    the one nearest to fitting, as the engine runs it (a plan that does not fit was written with exit 0,
    DeepSeek-V3 at 146 GB a device of 77.6 usable, issue 52)."""
    from ..errors import InfeasibleError
    from ..units import fmt_bytes
    best = min(plans, key=lambda p: p["predicted"]["peak_memory_bytes"])
    peak, cap = best["predicted"]["peak_memory_bytes"], cluster.usable_memory
    return InfeasibleError(f"no {engine} configuration that fits was found: the nearest ({from_plan(best, engine).describe()}) "
                           f"needs {fmt_bytes(peak)} per device of {fmt_bytes(cap)} usable as {engine} runs it; use more "
                           f"devices, devices with more memory, or a smaller batch", needed_bytes=peak, capacity_bytes=cap,
                           best=best)


def fits_file(engine: str, text: str, cluster, version: str = "main") -> bool:
    """Whether the engine's own memory estimate of an exported file is within usable memory (Megatron's,
    main's formula or core_v0.16.1's; the other engines publish none)."""
    if engine != "megatron":
        return True
    from .estimate_fit import file_estimate_bytes
    return file_estimate_bytes(text, cluster.devices, version) <= cluster.usable_memory
