"""Plans unchanged by a speed-up: `python -m bench.plan_golden save DIR` writes the plan JSON of a
fixed set of searches (the main job, DeepSeek-V3-like, zoo models on 8 / 64 / 1024 devices, pinned,
MoE, SP + CP, host placement, an HF config) into DIR with the code as it is; after a change
`python -m bench.plan_golden check DIR` searches them again and compares the files byte for byte.
Every plan is also checked against the plan JSON Schema (the search's own plans skip it: Plan.built).

Nothing here is an expected result committed to the repository: DIR is written by the code before
the change and read by the code after it (the tests compare a search run twice the same way).
`--only SUBSTR` runs the cases whose name contains it.  Each model is captured once per process."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

HF_LLAMA = os.path.join(os.path.dirname(__file__), "..", "tests", "data", "llama.json")

# (name, model, cluster, search keywords)
CASES = [
    ("main-gpt3-175b-1024", "gpt3-175b", "a100-80g:nodes=128", {}),
    ("deepseek-v3-like-2048", "deepseek-v3-like", "h800:nodes=256", {"global_batch": 4096}),
    ("gpt3-1.3b-8", "gpt3-1.3b", "a100-80g:nodes=1", {}),
    ("gpt3-13b-64", "gpt3-13b", "a100-80g:nodes=8", {}),
    ("llama3-70b-1024", "llama3-70b", "h100-80g:nodes=128", {}),
    ("gpt3-6.7b-64-pinned-tp4-pp2", "gpt3-6.7b", "a100-80g:nodes=8", {"constraints": {"tp": 4, "pp": 2}}),
    ("gpt3-175b-1024-pinned-tp8-pp16-sel", "gpt3-175b", "a100-80g:nodes=128",
     {"constraints": {"tp": 8, "pp": 16, "recompute": "selective"}}),
    ("gpt3-175b-1024-megatron", "gpt3-175b", "a100-80g:nodes=128", {"constraints": {"target": "megatron"}}),
    ("mixtral-8x7b-64", "mixtral-8x7b", "h100-80g:nodes=8", {}),
    ("llama3-8b-64-sp-cp2", "llama3-8b", "h100-80g:nodes=8", {"constraints": {"sp": True, "cp": 2}}),
    ("gpt3-1.3b-1-v100-host", "gpt3-1.3b", "v100-32g:nodes=1,gpus=1", {"global_batch": 8}),
    ("wide-deep-100m-8", "wide-deep-100m", "a100-80g:nodes=1", {}),
    ("bert-large-64-v100", "bert-large", "v100-32g:nodes=8", {}),
    ("hf-llama-tiny-cpu", HF_LLAMA, "cpu", {}),
]


def run(directory, mode, only=None):
    from sapp.api import capture_graph, resolve_model, search
    from sapp.schema import first_error
    graphs, bad, n = {}, [], 0
    os.makedirs(directory, exist_ok=True)
    for name, model, cluster, kw in CASES:
        if only and only not in name:
            continue
        if model not in graphs:
            graphs[model] = capture_graph(resolve_model(model)[0])[0]
        t = time.process_time()
        plan = search(model, cluster, graph=graphs[model], **kw)
        text = plan.to_json()
        cpu = time.process_time() - t
        err = first_error("plan", json.loads(text))      # built plans skip the schema (Plan.built): check here
        if err:
            bad.append(name)
            print(f"INVALID {name}: {err}", flush=True)
        path = os.path.join(directory, name + ".json")
        n += 1
        if mode == "save":
            with open(path, "w") as f:
                f.write(text)
            print(f"saved   {name:40s} {cpu:6.2f} CPU s (search + plan)", flush=True)
        else:
            with open(path) as f:
                same = f.read() == text
            if not same:
                bad.append(name)
                with open(path + ".new", "w") as f:
                    f.write(text)
            print(f"{'same' if same else 'DIFFERS':7s} {name:40s} {cpu:6.2f} CPU s (search + plan)", flush=True)
    if mode == "check" or bad:
        print(f"{n - len(bad)}/{n} plans byte-identical" + (f"; differ: {', '.join(bad)} (new text in *.json.new)"
                                                            if bad else ""))
    return 1 if bad else 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=("save", "check"))
    ap.add_argument("directory")
    ap.add_argument("--only", default=None)
    a = ap.parse_args(argv)
    return run(a.directory, a.mode, a.only)


if __name__ == "__main__":
    sys.exit(main())
