"""Megatron argument files: the launcher and its script are skipped, a flag's value ending in .py is
not taken for the script (issue 53, finding 7: `--data-path x.py` dropped every flag before it)."""
import pytest

from sapp.engines import megatron

CASES = {
    "flags alone, a .py value": ("--num-layers 2 --data-path x.py --hidden-size 64",
                                 {"--num-layers": "2", "--data-path": "x.py", "--hidden-size": "64"}),
    "a .py value given with =": ("--num-layers 2 --data-path=x.py --hidden-size 64",
                                 {"--num-layers": "2", "--data-path": "x.py", "--hidden-size": "64"}),
    "torchrun with a valued flag": ("torchrun --nproc-per-node 8 pretrain_gpt.py --num-layers 2 --data-path x.py",
                                    {"--num-layers": "2", "--data-path": "x.py"}),
    "torchrun with a switch": ("torchrun --standalone pretrain_gpt.py \\\n --data-path a.py b.py --num-layers 2",
                               {"--data-path": "a.py b.py", "--num-layers": "2"}),
    "python and the script": ("python pretrain_gpt.py --num-layers 2  # a comment x.py\n--data-path y.py",
                              {"--num-layers": "2", "--data-path": "y.py"}),
}


@pytest.mark.parametrize("what", sorted(CASES))
def test_script_and_py_values(what):
    text, want = CASES[what]
    assert megatron.tokens(text) == want
