"""The input classes of `python -m bench.fuzz` beyond plans and clusters: engine configurations for
`sapp import` (Megatron argument files, torchtitan TOML, DeepSpeed JSON), Hugging Face configs for
`--hf-config`, `--data` files, checkpoint markers and DCP metadata re-sealed after an edit (sizes, CRCs and
the marker's checksum recomputed, as whoever edits one does), and capture-cache entries re-signed after
an edit.  Each is made from a real one sapp wrote or reads, then mutated.  What must hold: success or a
one-line SappError (the fuzzer's rule for every input); a verify() of a checkpoint returns a reason in
words, never raises; a cache entry is a graph whose facts match its header, or a miss."""
from __future__ import annotations

import hashlib
import json
import os
import pickle
import random
import shutil

from . import fuzz_hostile as hostile

ENGINE_JUNK = ["0", "-1", "-5", "abc", "1e20", "2e21", "9.2e18", "x.py", "1.5", "", "nan", "inf", "true",
               "999999999999999999999", "\n--save /tmp/x", "'", "\"", "[1, 2]", "{a = 1}", "[[[[[[1]]]]]]", "1e-300"]


class Surfaces:
    def __init__(self, rng: random.Random, tmp: str, graph, mutate):
        """`graph`: gpt-tiny's captured graph; `mutate(rng, doc)`: bench.fuzz's JSON mutator."""
        from sapp.api import search
        from sapp.cluster import Cluster
        from sapp.engines import export_plan
        self.rng, self.tmp, self.graph, self.mutate = rng, tmp, graph, mutate
        self.cluster = Cluster.parse("a100-80g:nodes=1")
        self.engines = {}
        for engine, zero in (("megatron", 1), ("torchtitan", 3), ("torchtitan@0.2.2", 3), ("deepspeed", 1)):   # what each engine runs
            plan = search("gpt-tiny", self.cluster, global_batch=16, graph=graph,
                          constraints={"tp": 1, "pp": 2 if engine != "deepspeed" else 1, "zero": zero,
                                       "placement": {"optimizer": "device"}})
            self.engines[engine] = export_plan(plan, engine, graph=graph)[0]
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        with open(os.path.join(here, "tests", "data", "llama.json")) as f:
            self.hf = json.load(f)
        self.ckpt = self._checkpoint()
        self.cache_key, self.cache_entry = self._cache_entry()

    # -- the real inputs the mutations start from --
    def _checkpoint(self):
        import torch
        import sapp.models as models
        from sapp.emit import emit
        from sapp.emit.runtime import checkpoint as ck
        from sapp.emit.runtime.train_state import model_names
        from tests.emit_workers.plans import make_plan
        torch.manual_seed(0)
        m = models.get("mlp-tiny", device="cpu")
        prog = emit(m, make_plan(params=sum(p.numel() for p in m.parameters()), global_batch=4), rank=0, world=1)
        prog.step(torch.randn(4, 32), torch.randint(0, 10, (4,)))
        d = os.path.join(self.tmp, "ckpt-seed")
        ck.Checkpointer(d, keep=1, names=model_names(m)).save(prog, 1, {"global_batch": 4, "data": "synthetic",
                                                                    "shuffle": False, "seed": 0})
        return os.path.join(d, "step-00000001")

    def _cache_entry(self):
        from sapp.capture import cache
        os.environ["SAPP_CACHE_DIR"] = os.path.join(self.tmp, "cache")
        key = "f" * 32
        cache.store(key, self.graph, {"name": "gpt-tiny"})
        with open(os.path.join(cache.directory(), key + ".json"), "rb") as f:
            return key, f.read()

    # -- one input --
    def one(self):
        r = self.rng.random()
        if r < 0.35:
            engine = self.rng.choice(sorted(self.engines))
            return f"engine-{engine}", lambda a=(engine, self._engine_text(engine)): self.engine_entry(*a)
        if r < 0.5:
            return "hf-config", lambda d=self._hf_doc(): self.hf_entry(d)
        if r < 0.65:
            return "data-file", lambda o=self._data_obj(): self.data_entry(o)
        if r < 0.85:
            return "checkpoint", lambda e=self.rng.random(): self.checkpoint_entry(e)
        return "cache-entry", lambda b=self._cache_body(): self.cache_entry_check(b)

    def _engine_text(self, engine):
        rng, text = self.rng, self.engines[engine]
        if rng.random() < 0.05:
            return hostile.deep_text(rng)
        if engine == "deepspeed":
            try:
                return json.dumps(self.mutate(rng, json.loads(text)))
            except ValueError:
                return text
        lines = text.splitlines()
        for _ in range(rng.randint(1, 3)):
            i = rng.randrange(len(lines))
            if engine == "megatron":
                parts = lines[i].split()
                if parts and rng.random() < 0.8:
                    parts[-1] = rng.choice(ENGINE_JUNK)
                    lines[i] = " ".join(parts)
                else:
                    lines.insert(i, f"--{rng.choice(['global-batch-size', 'micro-batch-size', 'num-layers'])} "
                                    f"{rng.choice(ENGINE_JUNK)}")
            elif "=" in lines[i]:
                k = lines[i].split("=", 1)[0]
                lines[i] = f"{k}= {rng.choice(ENGINE_JUNK)}"
            else:
                lines.insert(i, rng.choice(["[job]", "[parallelism]", "parallelism = 5", "[[x]]"]))
        return "\n".join(lines) + "\n"

    def _hf_doc(self):
        doc = self.mutate(self.rng, self.hf)
        if isinstance(doc, dict) and self.rng.random() < 0.3:
            doc[self.rng.choice(["num_hidden_layers", "hidden_size", "vocab_size", "num_attention_heads",
                                 "max_position_embeddings", "model_type", "num_key_value_heads"])] = \
                self.rng.choice([0, -1, 1.5, "8", [4], None, True, 1 << 30, 10 ** 9, 5000, 2])
        return doc

    def _data_obj(self):
        import torch
        rng = self.rng
        def tensor():
            shape = [rng.choice([0, 1, 4, 8]) for _ in range(rng.randint(0, 3))]
            return torch.zeros(shape, dtype=rng.choice([torch.float32, torch.int64, torch.bool]))
        pick = rng.random()
        if pick < 0.4:
            return (tensor() if rng.random() < 0.7 else (tensor(), tensor()), tensor())
        if pick < 0.7:
            return (rng.choice([tensor(), {"x": tensor()}, [tensor()], 5, "x", None]),
                    rng.choice([tensor(), 5, [1, 2], None, {"y": tensor()}]))
        return rng.choice([tensor(), [tensor()] * rng.randint(0, 4), {"a": 1}, 3.5, None, "text"])

    def _cache_body(self):
        head, body = self.cache_entry.split(b"\n", 1)
        d = json.loads(body)
        g = d["graph"]
        part = self.rng.choice(["nodes", "params", "blocks", "meta", "outputs", "batch_size", "all"])
        if part == "all":
            d = self.mutate(self.rng, d)
        elif part == "nodes" and isinstance(g, dict) and g.get("nodes"):
            i = self.rng.randrange(len(g["nodes"]))
            edited = self.mutate(self.rng, {"row": g["nodes"][i]})      # (junk itself when nothing is left)
            g["nodes"][i] = edited.get("row") if isinstance(edited, dict) and self.rng.random() < 0.9 else edited
        else:
            d["graph"] = self.mutate(self.rng, g)
        new = json.dumps(d).encode() if not isinstance(d, bytes) else d
        h = json.loads(head)
        h.update(bytes=len(new), sha256=hashlib.sha256(new).hexdigest())
        return json.dumps(h).encode() + b"\n" + new

    # -- entry points --
    def engine_entry(self, engine, text):
        from sapp.engines import import_config
        plan = import_config(text, engine, self.graph, self.cluster, "gpt-tiny")
        hostile.check_plan(plan)

    def hf_entry(self, doc):
        from sapp.models import hf
        path = os.path.join(self.tmp, "hf-config.json")
        with open(path, "w") as f:
            json.dump(doc, f)
        hf.build(path, device="meta")

    def data_entry(self, obj):
        import torch
        from sapp.emit.runtime import data
        path = os.path.join(self.tmp, "data.pt")
        torch.save(obj, path)
        data.load(path)

    def checkpoint_entry(self, which):
        from sapp.emit.runtime import checkpoint as ck
        from sapp.emit.runtime import dcp_reader
        d = os.path.join(self.tmp, "ckpt-try", "step-00000001")
        shutil.rmtree(os.path.dirname(d), ignore_errors=True)
        shutil.copytree(self.ckpt, d)
        mp, mdp = os.path.join(d, ck.MARKER), os.path.join(d, ".metadata")
        if which < 0.5:                        # the .metadata's numbers and names, then re-sealed
            md = dcp_reader.read(d)
            items = list(md.storage_data.items())
            idx, info = self.rng.choice(items)
            field = self.rng.choice(["offset", "length", "relative_path"])
            setattr(info, field, self.rng.choice([-1, 0, 1 << 40, "x", None, 2.5, "../x", ".metadata"]))
            if self.rng.random() < 0.3:
                md.storage_data = self.rng.choice([5, None, [], {}])
            with open(mdp, "wb") as f:
                f.write(pickle.dumps(md))
        meta = json.load(open(mp))
        meta["files"] = {n: [os.path.getsize(os.path.join(d, n)), ck._crc(os.path.join(d, n))] for n in meta["files"]}
        if which >= 0.5:                       # the marker itself, then re-sealed
            meta = self.mutate(self.rng, meta)
            if not isinstance(meta, dict):
                meta = {"files": meta}
        meta["checksum"] = ck.checksum(meta)
        with open(mp, "w") as f:
            json.dump(meta, f)
        got, why = ck.verify(d)
        if got is None and not (isinstance(why, str) and why.strip() and "\n" not in why):
            raise hostile.Nonsense(f"verify() gave no reason in one line: {why!r}")

    def cache_entry_check(self, blob):
        from sapp.capture import cache
        with open(os.path.join(cache.directory(), self.cache_key + ".json"), "wb") as f:
            f.write(blob)
        hit = cache.load(self.cache_key)
        if hit is not None:
            head = json.loads(blob.split(b"\n", 1)[0])
            if head.get("graph") != cache.graph_facts(hit[0]):
                raise hostile.Nonsense("a cache entry was read back as another graph than its header vouches for")
