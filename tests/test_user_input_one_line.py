"""Bad user input is one line that names what to change, never a traceback: HF configs with sizes of the
wrong type or range (or nested past JSON's reader), --data files holding the wrong things, and the
Python API given values of the wrong type."""
import json
import os

import pytest
import torch

import sapp
from sapp.commands.cli import main
from sapp.plan import Plan

HF = os.path.join(os.path.dirname(__file__), "data", "llama.json")


@pytest.mark.parametrize("edit,words", [
    ({"num_attention_heads": 0}, "num_attention_heads must be an integer from 1"),
    ({"hidden_size": 64.5}, "hidden_size must be an integer from 1 to 16777216, got 64.5"),
    ({"model_type": ["llama"]}, "model_type must be a name"),
    ({"vocab_size": "1000"}, "vocab_size must be an integer from 1 to 16777216, got str"),
    ({"max_position_embeddings": 10 ** 9}, "max_position_embeddings must be an integer from 1 to 1048576 (the sequence"),
    ({"num_hidden_layers": True}, "num_hidden_layers must be an integer"),
    ({"num_hidden_layers": 10 ** 6}, "num_hidden_layers must be an integer from 1 to 4096"),
    ({"architectures": [{"a": 1}]}, "architectures must be a list of class names"),
])
def test_hf_config_sizes_are_checked(tmp_path, capsys, edit, words):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(dict(json.loads(open(HF).read()), **edit)))
    assert main(["search", "--hf-config", str(cfg), "--cluster", "a100-80g:nodes=1", "--no-cache"]) != 0
    err = capsys.readouterr().err.strip()
    assert words in err and len(err.splitlines()) == 1 and "Traceback" not in err, err


def test_hf_config_nested_past_the_reader_and_catalogue_shapes(tmp_path, capsys):
    cfg = tmp_path / "config.json"
    cfg.write_text("[" * 100000 + "]" * 100000)
    assert main(["search", "--hf-config", str(cfg), "--cluster", "a100-80g:nodes=1", "--no-cache"]) != 0
    assert "nests deeper than JSON's reader allows" in capsys.readouterr().err
    # per-stage sizes (Swin's heads, LXMERT's layer counts) and a derived head_dim of 0 stay legal
    from sapp.models import hf
    hf.check_sizes("x", {"model_type": "swin", "num_heads": [3, 6, 12, 24], "head_dim": 0,
                         "num_hidden_layers": {"vision": 5, "language": 9}, "max_position_embeddings": 1200.0})
    with pytest.raises(hf.HFConfigError, match="num_heads must be an integer from 1"):
        hf.check_sizes("x", {"model_type": "swin", "num_heads": [3, 0]})


@pytest.mark.parametrize("obj,words", [
    ((torch.randn(8, 4), 5), "targets is of type int"),
    ((torch.randn(8, 4), [1, 2]), "targets is of type list"),
    (({"x": torch.randn(8, 4)}, torch.zeros(8)), "input 0 is of type dict"),
    ((torch.tensor(1.0), torch.zeros(8)), "input 0 is a 0-d tensor"),
    (((), torch.zeros(8)), "holds no inputs"),
])
def test_data_file_contents_are_checked(tmp_path, obj, words):
    from sapp.emit.runtime.data import DataError, load
    path = tmp_path / "d.pt"
    torch.save(obj, path)
    with pytest.raises(DataError, match=words):
        load(str(path))
    torch.save((torch.randn(8, 4), torch.zeros(8)), path)
    inputs, targets = load(str(path))
    assert len(inputs) == 1 and targets.shape == (8,)


def test_api_values_of_the_wrong_type(tmp_path):
    with pytest.raises(sapp.SappError, match="progress must be a callable"):
        sapp.search("mlp-tiny", "cpu:gpus=1", progress=5)
    with pytest.raises(sapp.SappError, match="from_json takes the JSON text"):
        Plan.from_json(5)
    plan = sapp.search("mlp-tiny", "cpu:gpus=1")
    with pytest.raises(sapp.SappError, match="a file path is needed, got NoneType"):
        plan.save(None)
    plan.save(tmp_path / "p.json")
    assert Plan.load(tmp_path / "p.json").to_json() == plan.to_json()
