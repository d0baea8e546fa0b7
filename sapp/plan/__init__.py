"""The Plan: a versioned JSON document users save, load, diff and hand-edit.

Same inputs give byte-identical JSON: keys are sorted, floats are rounded to 6 significant digits,
nothing time- or machine-dependent is stored (search time is printed, not saved).
The schema is sapp/schema/plan.schema.json (`sapp schema plan`), checked on every load and save;
the checks that need the whole document follow it (`_semantic`): dp x tp x pp (x cp) = devices,
micro-batches <= global batch, stages numbered 0..n-1 (pp or pp·v of them), each block in one stage,
one split entry per mesh level.  Fields a reader meets first:
  - `pipeline.stages[i].split_before`: the first module of the next stage (a plan giving only
    `blocks` runs too); an interleaved plan lists pp·v virtual stages, stage s on pp rank s % pp;
  - `tp_modules` styles: `colwise` / `rowwise` (DTensor's), `colwise_gather` (a lone column split with
    its output gathered: an LM head), `vocab` (an embedding split by vocabulary); searched plans add
    `tp_layout` (its regions, and `sp` where sequence parallelism runs);
  - `mesh.roles`: "dp" or "tp" per level; `predicted.compute_s` includes the optimizer update and
    `comm_s` is the sum of `comm_by_kind`.
Sizes are bounded so that no input makes the search spin (devices, per-node counts, global batch,
interleaved chunk operations, nesting, string lengths: sapp/schema)."""
from __future__ import annotations

import json
import os
import math

from sapp import schema as _schema
from sapp.errors import PlanError
from sapp.pipeline.dualpipe import rank_of

SCHEMA = "sapp.plan/1"
REQUIRED = ("schema", "model", "cluster", "devices", "parallel", "mesh", "operators", "pipeline",
            "recompute", "zero", "placement", "predicted")
PREDICTED_KEYS = ("step_time_s", "peak_memory_bytes", "mfu", "compute_s", "comm_s")


def _round(x):
    """Stable float representation: 6 significant digits, ints stay ints."""
    if isinstance(x, bool) or x is None or isinstance(x, (int, str)):
        return x
    if isinstance(x, float):
        if math.isnan(x) or math.isinf(x):
            raise PlanError(f"plan holds a non-finite number ({x}); the cost model produced an invalid value")
        return float(f"{x:.6g}")
    if isinstance(x, dict):
        return {str(k): _round(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_round(v) for v in x]
    if hasattr(x, "item"):          # numpy scalar
        return _round(x.item())
    raise PlanError(f"plan field of type {type(x).__name__} cannot be stored in JSON")


def empty_sections() -> dict:
    """Defaults for the sections later stages fill."""
    return {
        "pipeline": {"schedule": "none", "micro_batches": 1, "virtual_chunks": 1, "stages": []},
        "recompute": {"default": "none", "blocks": {}},
        "zero": 0,
        "placement": {"groups": {}, "predicted": {}},
    }


class Plan:
    """A parallel plan: the layout :func:`sapp.search` chose, its per-stage prediction and its notes.

    Sections read as ``plan["parallel"]`` or ``plan.parallel`` (``model``, ``cluster``, ``parallel``,
    ``pipeline``, ``zero``, ``predicted``, ``notes``, ...; ``sapp schema plan`` prints the JSON
    Schema every load and save is checked against).  :meth:`save` / :meth:`load` write and read the
    file ``sapp run``, ``sapp explain`` and ``sapp export`` take.

    Examples
    --------
    >>> import os, tempfile, sapp
    >>> plan = sapp.search("gpt-tiny", "cpu:nodes=1", global_batch=16, constraints={"dp": 2})
    >>> plan.parallel["dp"], plan["devices"], plan["predicted"]["step_time_s"] > 0
    (2, 2, True)
    >>> path = os.path.join(tempfile.mkdtemp(), "plan.json")
    >>> plan.save(path)
    >>> sapp.Plan.load(path) == plan
    True
    """

    def __init__(self, data: dict):
        self._init(data, schema=True)

    @classmethod
    def built(cls, data: dict) -> "Plan":
        """A plan sapp's search has just built (api.build_plan): every check but the JSON Schema's
        (the search writes each field from typed values; jsonschema took ~2 s on a 175B plan).  The
        schema still runs at the edges: on every load, on a save of a plan edited since it was built,
        and in tests/test_plan_built.py over the plans the search builds."""
        self = cls.__new__(cls)
        self._init(data, schema=False)
        self._built_text = self.to_json()      # save() skips the schema only for exactly this text
        return self

    def _init(self, data, schema):
        if not isinstance(data, dict):
            raise PlanError(f"a plan must be a JSON object, got {type(data).__name__}")
        bad = _schema.shape_problem(data)
        if bad:
            raise PlanError(f"{bad}; not a sapp plan")
        bad = _schema.non_finite_path(data)
        if bad:
            raise PlanError(f"{bad} holds a non-finite number; write a finite value or regenerate the plan")
        self._d = _round(data)
        self._validate(schema)

    # ---- field access --------------------------------------------------------------------------
    def __getitem__(self, key):
        return self._d[key]

    def __getattr__(self, key):
        if key.startswith("_"):
            raise AttributeError(key)
        try:
            return self._d[key]
        except KeyError:
            raise AttributeError(key) from None

    def __eq__(self, other):
        return isinstance(other, Plan) and self.to_json() == other.to_json()

    def get(self, key, default=None):
        return self._d.get(key, default)

    def __contains__(self, key):
        return key in self._d

    @property
    def mixed(self) -> bool:
        """A mixed cluster's plan (a `groups` section: sapp/plan/mixed.py); False for one device kind."""
        return "groups" in self._d

    def __repr__(self):
        if self.mixed:
            return (f"Plan(model={self._d['model'].get('name')!r}, devices={self._d['devices']}, "
                    f"groups={[g['name'] for g in self._d['groups']['members']]}, mode={self._d['groups']['mode']!r}, "
                    f"step_time_s={self._d['predicted'].get('step_time_s')})")
        p, pr = self._d["parallel"], self._d["predicted"]
        return (f"Plan(model={self._d['model'].get('name')!r}, devices={self._d['devices']}, "
                f"dp={p.get('dp')}, tp={p.get('tp')}, pp={p.get('pp')}, step_time_s={pr.get('step_time_s')})")

    def to_dict(self) -> dict:
        return json.loads(self.to_json())

    def to_json(self) -> str:
        return json.dumps(self._d, indent=1, sort_keys=True) + "\n"

    def save(self, path, under=None, operators_beside=False) -> None:
        """Written atomically without following a symlink (fileio.write_atomic).  `under`: a folder
        sapp manages that `path` lies in (a checkpoint directory): no symlink below it is followed either.
        `operators_beside`: the operators map (most of a large plan's bytes, one entry per operator)
        goes to a side file next to `path` (`operators_path`), which the plan names with its SHA-256,
        so the plan itself stays short enough to read; Plan.load reads the pair back as one plan."""
        # sections are plain dicts callers can edit in place: check again what is about to be written
        if not isinstance(path, (str, bytes, os.PathLike)):
            raise PlanError(f"plan.save: a file path is needed, got {type(path).__name__} (a str or os.PathLike)")
        self._d = _round(self._d)
        text = self.to_json()
        if text != self.__dict__.get("_built_text"):
            self._validate()
        if operators_beside and not self.mixed:
            text = self._write_operators(path)
        from sapp.fileio import write_atomic
        try:        # never through a symlink: a link planted at `path` is replaced, not followed
            write_atomic(path, text, under=under, make=under is not None)
        except OSError as e:
            if under is not None:
                raise PlanError(f"cannot write plan to {path}: {e.strerror or e}") from None
            raise PlanError(f"cannot write plan to {path}: {e.strerror or e}; choose another --out") from None

    def _write_operators(self, path) -> str:
        """Write the operators map beside `path` and return the plan's text that names it."""
        side = operators_path(path)
        body = json.dumps({"schema": OPERATORS_SCHEMA, "operators": self._d["operators"]}, indent=1,
                          sort_keys=True) + "\n"
        from sapp.fileio import write_atomic
        try:
            write_atomic(side, body)
        except OSError as e:
            raise PlanError(f"cannot write the plan's operators to {side}: {e.strerror or e}; choose another --out") from None
        d = {k: v for k, v in self._d.items() if k != "operators"}
        d["operators_file"] = {"path": os.path.basename(side), "sha256": _sha256(body)}
        return json.dumps(d, indent=1, sort_keys=True) + "\n"

    @classmethod
    def load(cls, path) -> "Plan":
        """The plan in the file `path`, checked against the plan schema and its own invariants.

        Parameters
        ----------
        path : str or os.PathLike
            A file :meth:`save` or ``sapp search --out`` wrote.

        Returns
        -------
        Plan

        Raises
        ------
        PlanError
            Not a plan this sapp reads (JSON, schema, or a section that contradicts another); the
            message says what to fix or to regenerate it with ``sapp search``.

        Examples
        --------
        >>> import os, tempfile, sapp
        >>> path = os.path.join(tempfile.mkdtemp(), "plan.json")
        >>> sapp.search("gpt-tiny", "cpu:gpus=1", global_batch=4).save(path)
        >>> sapp.Plan.load(path).parallel["dp"]
        1
        """
        return cls.from_json(_read_text(path), source=str(path), folder=os.path.dirname(os.fspath(path)))

    @classmethod
    def from_json(cls, text: str, source="plan", folder=None) -> "Plan":
        """`folder`: where a plan whose operators sit in a side file (`operators_file`) finds it."""
        if not isinstance(text, (str, bytes, bytearray)):
            raise PlanError(f"{source}: Plan.from_json takes the JSON text (str or bytes), got {type(text).__name__}; "
                            "use Plan.load for a path")
        try:
            d = _schema.strict_loads(text)
        except json.JSONDecodeError as e:
            raise PlanError(f"{source} is not valid JSON ({e.msg} at line {e.lineno}); fix or regenerate it with `sapp search`") from None
        except (ValueError, RecursionError) as e:
            raise PlanError(f"{source} is not a usable JSON plan ({str(e)[:80]}); fix or regenerate it with `sapp search`") from None
        if not isinstance(d, dict):
            raise PlanError(f"{source} must hold a JSON object, found {type(d).__name__}")
        if "operators_file" in d:
            d = _with_operators(d, folder, source)
        try:
            return cls(_migrated(d))
        except PlanError as e:
            raise PlanError(f"{source}: {e}") from None

    def check_model(self, fingerprint: str, name: str = "") -> None:
        """Refuse a plan made for another model."""
        mine = self._d["model"].get("fingerprint")
        if mine != fingerprint:
            raise PlanError(f"plan was made for model {self._d['model'].get('name')!r} (fingerprint {mine}) but this "
                            f"model{(' ' + repr(name)) if name else ''} has fingerprint {fingerprint}; search a new plan for it")

    # ---- validation ----------------------------------------------------------------------------
    def _validate(self, schema=True):
        d = self._d
        if d.get("schema") != SCHEMA:
            raise PlanError(schema_problem(d))
        if "groups" in d:
            return self._validate_mixed(schema)
        missing = [k for k in REQUIRED if k not in d]
        if missing:
            raise PlanError(f"missing field(s) {', '.join(missing)}")
        for k in PREDICTED_KEYS:
            if isinstance(d["predicted"], dict) and k not in d["predicted"]:
                raise PlanError(f"predicted.{k} is missing")
        err = _schema.first_error("plan", d) if schema else None
        if err:
            raise PlanError(err)
        _semantic(d)

    def _validate_mixed(self, schema):
        """A mixed cluster's plan: the schema (both kinds are one schema), the groups' checks, and in
        pipeline mode every check of the ordinary pp plan at its top (sapp/plan/mixed.py)."""
        from sapp.plan import mixed
        err = _schema.first_error("plan", self._d) if schema else None
        if err:
            raise PlanError(f"mixed-cluster plan: {err}")
        if not isinstance(self._d.get("groups"), dict) or self._d["groups"].get("mode") not in ("data", "pipeline"):
            raise PlanError("mixed-cluster plan: groups.mode must be data or pipeline")
        mixed.check(self._d)
        if mixed.mode(self._d) == "pipeline":
            _semantic(self._d)


MAX_FILE_BYTES = 256 << 20     # a 175B-parameter plan is ~2 MB; refuse to parse a huge unrelated file
OPERATORS_SCHEMA = "sapp.plan-operators/1"


def operators_path(path) -> str:
    """The side file of a plan written with its operators beside it: plan.json -> plan.operators.json."""
    path = os.fspath(path)
    stem = path[:-5] if path.lower().endswith(".json") else path
    return stem + ".operators.json"


def _sha256(text: str) -> str:
    import hashlib
    return hashlib.sha256(text.encode()).hexdigest()


def _with_operators(d, folder, source) -> dict:
    """The plan `d` with the operators map of the side file it names read in.  The name must be a bare
    file name (the file lies beside the plan: no folder, no `..`), the file a regular one of this
    plan's operators (its SHA-256 the plan's), else one line saying what to do."""
    ref = d["operators_file"]
    name = ref.get("path") if isinstance(ref, dict) else None
    digest = ref.get("sha256") if isinstance(ref, dict) else None
    if (not isinstance(name, str) or not isinstance(digest, str) or not name or len(name) > 255 or "/" in name
            or "\\" in name or name.startswith(".") or "\0" in name):
        raise PlanError(f"{source}: operators_file must be {{\"path\": a file name beside the plan, \"sha256\": ...}}; "
                        "write the plan again with `sapp search --out` (or --full for one file)")
    if folder is None:
        raise PlanError(f"{source}: its operators are in {name!r} beside the plan file; load it with Plan.load(path)")
    side = os.path.join(folder or ".", name)
    body = _read_text(side)
    if _sha256(body) != digest:
        raise PlanError(f"{source}: {name} beside it is not the operators file written with this plan (its SHA-256 "
                        "differs); keep the two files a search wrote together, or search again")
    try:
        ops = _schema.strict_loads(body)
    except (ValueError, RecursionError) as e:
        raise PlanError(f"{side} is not valid JSON ({str(e)[:80]})") from None
    if not isinstance(ops, dict) or ops.get("schema") != OPERATORS_SCHEMA or not isinstance(ops.get("operators"), dict):
        raise PlanError(f"{side} is not a plan's operators file (schema {OPERATORS_SCHEMA!r}); search again")
    out = {k: v for k, v in d.items() if k != "operators_file"}
    out["operators"] = ops["operators"]
    return out


def summary(plan) -> dict:
    """A plan's layout and prediction in a few keys: what a re-plan logs of the old and the new plan
    (sapp/api/replan.py, and the elastic worker, which sits below it: sapp/emit/runtime/elastic.py)."""
    return {"parallel": dict(plan["parallel"]), "micro_batches": plan["pipeline"].get("micro_batches", 1),
            "zero": plan["zero"], "devices": plan["devices"], "step_time_s": plan["predicted"]["step_time_s"]}


def _read_text(path) -> str:
    from sapp.fileio import read_text
    return read_text(path, MAX_FILE_BYTES, what="plan file", give="give the plan's JSON file", too_big="not a sapp plan",
                     not_text="give a JSON plan from `sapp search`", error=PlanError)


def load_any(path):
    """("plan", Plan) or ("mixed", Plan) for the plan file `path`: both kinds are one Plan type
    (a mixed cluster's plan has a `groups` section, sapp/plan/mixed.py); the kind tells a command which
    of its views to take.  Plan.load reads both the same way."""
    plan = Plan.load(path)
    return ("mixed" if plan.mixed else "plan"), plan


def _migrated(d: dict) -> dict:
    """An older layout of a plan, moved to this one on read (nothing re-priced): a mixed-cluster plan
    written as sapp.hetero-plan/1."""
    from sapp.plan import mixed
    if d.get("schema") == mixed.LEGACY:
        return mixed.migrate(d)
    return d


def schema_problem(d: dict) -> str:
    """Why the document `d` (its schema not this sapp's plan's) is not a plan Plan reads, and how to get
    one: the plan is searched again, for the model and cluster it names (sapp.hetero-plan/1 files are
    migrated before this check: Plan.from_json)."""
    found = d.get("schema")
    return (f"schema is {str(found)[:60]!r}; this sapp reads {SCHEMA!r} plans (and migrates sapp.hetero-plan/1 "
            f"ones) and has no converter from {str(found)[:60]!r}: search the plan again (`sapp search --model "
            f"{_named(d, 'model', 'NAME')} --cluster {_named(d, 'cluster', 'SPEC')} --out FILE`)")


def _named(d, section, placeholder) -> str:
    """The name a section of an unreadable document gives (a cluster with its nodes), else `placeholder`."""
    sec = d.get(section)
    name = sec.get("name") if isinstance(sec, dict) else None
    if not isinstance(name, str) or not name or len(name) > 64 or any(c.isspace() for c in name):
        return placeholder
    nodes = sec.get("nodes")
    return f"{name}:nodes={nodes}" if section == "cluster" and isinstance(nodes, int) and nodes > 1 else name


def _semantic(d):
    """What the schema cannot say: fields that must agree with each other."""
    par = d["parallel"]
    cp = par.get("cp", 1)          # plans before context parallelism have none: 1
    if par["dp"] * par["tp"] * par["pp"] * cp != d["devices"]:
        what = "dp x tp x pp" + (" x cp" if cp > 1 else "")
        vals = f"{par['dp']}x{par['tp']}x{par['pp']}" + (f"x{cp}" if cp > 1 else "")
        raise PlanError(f"{what} = {vals} does not equal devices={d['devices']}")
    if par["dp"] % par.get("ep", 1):
        raise PlanError(f"parallel.ep={par['ep']} must divide dp={par['dp']} (EP groups are made of data-parallel ranks)")
    if par.get("etp") and (par.get("ep", 1) < 2 or par["tp"] < 2):
        raise PlanError(f"parallel.etp={par['etp']} (experts whole beside tensor parallelism) needs ep > 1 and tp > 1")
    rep = par.get("dp_replicate", 1)
    if rep > 1 and (par["dp"] % rep or d.get("zero", 0) < 2 or par["dp"] // rep < 2):
        raise PlanError(f"parallel.dp_replicate={rep} needs ZeRO-2/3 and to divide dp={par['dp']} into shard groups "
                        f"of 2 or more ranks (HSDP)")
    if par.get("sp") and par["tp"] < 2:
        raise PlanError(f"parallel.sp is true but tp={par['tp']}; sequence parallelism splits within a tp group "
                        f"of 2 or more: set sp to false or tp > 1")
    pipe, gb = d["pipeline"], d["model"].get("global_batch")
    if pipe.get("scatter_gather") and (par["tp"] < 2 or par["pp"] < 2 or par.get("sp")):
        raise PlanError(f"pipeline.scatter_gather is true with tp={par['tp']}, pp={par['pp']}"
                        f"{', sp' if par.get('sp') else ''}; it splits a replicated stage boundary over a tp group "
                        f"of 2 or more between pipeline stages without sequence parallelism: set it to false")
    if gb is not None and pipe["micro_batches"] > gb:
        raise PlanError(f"pipeline.micro_batches={pipe['micro_batches']} exceeds model.global_batch={gb}; "
                        f"a micro-batch holds at least one sample")
    mbs, m = pipe.get("micro_batch_size"), pipe["micro_batches"]
    if gb is not None and mbs is not None and par["dp"] * m * mbs != gb:
        raise PlanError(f"pipeline.micro_batch_size={mbs} x micro_batches={m} x dp={par['dp']} = {par['dp'] * m * mbs} "
                        f"samples, but model.global_batch={gb}; set micro_batch_size to {gb // max(1, par['dp'] * m)} "
                        "or regenerate the plan")
    if pipe.get("schedule") == "interleaved" and par["pp"] > 1 and (pipe.get("virtual_chunks") or 1) < 2:
        raise PlanError("pipeline.virtual_chunks must be >= 2 for the interleaved schedule; set it or use 1f1b")
    stages = pipe.get("stages") or []
    if stages:
        v = pipe.get("virtual_chunks") or 1 if pipe.get("schedule") == "interleaved" else 1
        v = 2 if pipe.get("schedule") == "dualpipev" else v     # 2 stages a rank, in a V
        # interleaved plans list every virtual stage (what search writes) or one entry per device
        if len(stages) not in (par["pp"], par["pp"] * v):
            raise PlanError(f"pipeline.stages lists {len(stages)} stages but pp={par['pp']}"
                            + (f" (x virtual_chunks={v})" if v > 1 else "") + f" needs {par['pp'] * v}")
        if sorted(st["index"] for st in stages) != list(range(len(stages))):
            raise PlanError(f"pipeline.stages indices must be 0..{len(stages) - 1}, each once; got "
                            f"{[st['index'] for st in stages][:8]}")
        for i, st in enumerate(stages):
            if st.get("device_stage", 0) >= par["pp"]:
                raise PlanError(f"pipeline.stages[{i}].device_stage={st['device_stage']} is not a stage of pp={par['pp']}")
            # the runtime places virtual stage k on pipeline rank k % pp (torch's looped schedules; the V
            # for dualpipev)
            r = rank_of(pipe.get("schedule"), par["pp"], st["index"])
            if "device_stage" in st and st["device_stage"] != r:
                raise PlanError(f"pipeline.stages[{i}] (index {st['index']}) has device_stage={st['device_stage']}, but "
                                f"stage {st['index']} runs on pipeline rank {r} ("
                                + ("the V: r and 2 pp - 1 - r" if pipe.get("schedule") == "dualpipev" else "index mod pp")
                                + "); set it or drop the field")
        seen = {}
        for i, st in enumerate(stages):
            for b in st.get("blocks") or []:
                if b in seen:
                    raise PlanError(f"pipeline.stages[{i}].blocks lists {b!r}, which stage {seen[b]} already holds")
                seen[b] = i
    # (mesh level sizes are not checked against dp x tp: hand-written plans give a nominal mesh)
    levels = d["mesh"].get("levels") or []
    if levels:
        roles = d["mesh"].get("roles")
        if roles and len(roles) != len(levels):
            raise PlanError(f"mesh.roles has {len(roles)} entries for {len(levels)} mesh levels")
        for name, op in d["operators"].items():
            split = op.get("split")
            if split is not None and len(split) != len(levels):
                raise PlanError(f"operators.{name}.split has {len(split)} entries but mesh.levels has {len(levels)}")
