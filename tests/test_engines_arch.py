"""Every field of the model reaches the engine, or the export refuses (issue 52): a sliding window, the
rope scaling factor, a torchtitan flavor, the plan's sequence parallelism; each checked with the
engine's own parser where the `engines` extra is installed."""
from __future__ import annotations

import pytest

import sapp.engines as E
from sapp.engines import EngineError, torchtitan
from sapp.models.registry import NAMED

from tests import engine_validate


def _facts(name):
    kind, cfg = NAMED[name]
    meta = {"kind": kind, "config": cfg, "seq": cfg["s"]}
    names = [f"layers.{i}" for i in range(cfg["l"])]
    return {**E.model_facts(meta, names), **E.arch_facts(name, meta, len(names))}


TOML_70B = """[model]
name = "llama3"
flavor = "70B"

[parallelism]
data_parallel_shard_degree = -1

[training]
local_batch_size = 1
seq_len = 8192
"""


def test_a_022_toml_of_another_flavor_than_the_model_is_refused_in_one_line(tmp_path):
    with pytest.raises(EngineError) as e:
        torchtitan.parse(TOML_70B, _facts("llama3-8b"), 64)
    msg = str(e.value)
    assert "flavor = '70B'" in msg and "8B" in msg and "\n" not in msg, msg
    # the same file of the model it names is read; a flavor sapp does not price is refused
    assert torchtitan.parse(TOML_70B, _facts("llama3-70b"), 64).dp == 64
    with pytest.raises(EngineError, match="debugmodel"):
        torchtitan.parse(TOML_70B.replace('"70B"', '"debugmodel"'), _facts("llama3-8b"), 64)
    # torchtitan 0.2.2's own ConfigManager reads the flavor the file states (what it would build)
    try:
        path = tmp_path / "job.toml"
        path.write_text(TOML_70B)
        cfg = engine_validate.torchtitan(str(path))
    except ImportError:
        return
    assert (cfg.model.name, cfg.model.flavor) == ("llama3", "70B")
