"""Megatron-LM example shell scripts imported as published (issue 52 item 5): bash arrays, their
expansion on the launch line, assignments with positional defaults, arithmetic, quoting and string
tests are read as text (sapp/engines/megatron_script.py), never run.  Our own small scripts in that
style; the published ones from the fetched Megatron-LM when present, priced as their hand-written
transcriptions in bench/megatron_args/ are."""
from __future__ import annotations

import os
import subprocess

import pytest

from sapp.engines import EngineError, megatron

MIRROR = "/work/.mirror/NVIDIA+Megatron-LM/repo"

SCRIPT = r"""#!/bin/bash
# a launch script in the style of Megatron-LM's examples
export CUDA_DEVICE_MAX_CONNECTIONS=1
GPUS_PER_NODE=8
NNODES=${SLURM_NNODES:-"2"}
WORLD_SIZE=$(($GPUS_PER_NODE*$NNODES))
CKPT=$1            # a path the user passes
DATA=${2:-"MOCK"}
TP=${TP:-2}
LAYERS=4
HALF=$(( LAYERS / 2 ))
DIST=( --nproc_per_node $GPUS_PER_NODE --nnodes $NNODES )
MODEL=(
    --num-layers $LAYERS   # the decoder stack
    --hidden-size 64 \
    --num-attention-heads 4
)
EXTRA=()
if [[ "$DATA" == "MOCK" ]]; then
    EXTRA+=("--mock-data" "--split '99,1,0'")
else
    EXTRA+=(--data-path $DATA)
fi
PAR=( "--tensor-model-parallel-size $TP" --decoder-first-pipeline-num-layers $HALF )
mkdir -p "$(dirname "$CKPT")"
torchrun ${DIST[@]} pretrain_gpt.py ${MODEL[@]} \
    ${PAR[@]} ${EXTRA[@]} --save $CKPT --load "$CKPT"
"""


def test_the_launch_line_reads_as_bash_expands_it():
    a = megatron.tokens(SCRIPT)
    assert a["--num-layers"] == "4" and a["--hidden-size"] == "64" and a["--num-attention-heads"] == "4"
    assert a["--tensor-model-parallel-size"] == "2"           # "--flag $TP" split into two words, as bash does
    assert a["--decoder-first-pipeline-num-layers"] == "2"    # $(( LAYERS / 2 ))
    assert a["--mock-data"] is True and a["--split"] == "'99,1,0'"   # quotes inside a quoted element stay
    assert a["--save"] == "<unset:$CKPT>" and a["--load"] == "<unset:$CKPT>"
    assert "--data-path" not in a and "--nproc_per_node" not in a


def test_environment_defaults_and_overrides_in_the_script():
    a = megatron.tokens(SCRIPT.replace("TP=${TP:-2}", "TP=${TP:-2}\nTP=8"))
    assert a["--tensor-model-parallel-size"] == "8"


def test_a_priced_flag_reading_an_unset_variable_is_refused_naming_it():
    with pytest.raises(EngineError, match=r"--tensor-model-parallel-size reads \$TP_SIZE") as e:
        megatron.tokens(SCRIPT.replace("TP=${TP:-2}", "TP=$TP_SIZE"))
    assert "\n" not in str(e.value)


def test_a_test_on_an_unset_variable_is_followed_both_ways():
    # DATA=$2 with no default: the test reads an unset variable; the two ways differ only in the data flags
    a = megatron.tokens(SCRIPT.replace('DATA=${2:-"MOCK"}', "DATA=$2"))
    assert a["--num-layers"] == "4"
    # ... but where a priced flag differs between the ways, refused naming the variable
    text = SCRIPT.replace('DATA=${2:-"MOCK"}', "DATA=$2").replace('EXTRA+=(--data-path $DATA)',
                                                                   'EXTRA+=(--data-path $DATA --micro-batch-size 2)')
    with pytest.raises(EngineError, match=r"depend on \$DATA") as e:
        megatron.tokens(text)
    assert "\n" not in str(e.value)


def test_an_exit_in_a_branch_ends_that_way_only():
    text = SCRIPT.replace("mkdir -p", 'if [ ! -f "$CKPT/x" ]; then\n  echo missing; exit 1\nfi\nmkdir -p')
    assert megatron.tokens(text)["--num-layers"] == "4"


@pytest.mark.parametrize("text, says", [
    ("for i in 1 2; do echo $i; done\ntorchrun pretrain_gpt.py --num-layers 2\n", "uses `for`"),
    ("f() { echo; }\nA=1\ntorchrun pretrain_gpt.py --num-layers 2\n", "a function"),
    ("source env.sh\nA=1\ntorchrun pretrain_gpt.py --num-layers 2\n", "uses `source`"),
    ("A=( --num-layers 2 )\necho ${A[@]}\n", "no launch line"),
    ('A="x\n', "unclosed"),
    ("A=1\nif [ $A == 1 ]; then\ntorchrun pretrain_gpt.py --num-layers 2\n", "without its `fi`"),
])
def test_what_sapp_does_not_follow_is_refused_in_one_line(text, says):
    with pytest.raises(EngineError, match=says) as e:
        megatron.tokens(text)
    assert "\n" not in str(e.value)


def test_nothing_in_the_script_is_run(tmp_path):
    mark = tmp_path / "ran"
    text = (f"A=$(touch {mark})\nB=`touch {mark}`\ntouch {mark}\nC=$((1+1))\n"
            f"torchrun pretrain_gpt.py --num-layers $C --data-path $A\n")
    assert megatron.tokens(text)["--num-layers"] == "2"
    assert not mark.exists()


def _published(path):
    r = subprocess.run(["git", "--git-dir", MIRROR, "show", f"core_v0.16.1:{path}"], capture_output=True, text=True)
    if r.returncode:
        pytest.skip(f"{path} not in the fetched Megatron-LM")
    return r.stdout


@pytest.mark.skipif(not os.path.isdir(MIRROR), reason="needs the fetched Megatron-LM")
@pytest.mark.parametrize("script, args, model, cluster", [
    ("examples/gpt3/train_gpt3_175b_distributed.sh", "example_gpt3_175b.args", "gpt3-175b", "h100-80g:devices=1024"),
    ("examples/mixtral/train_mixtral_8x7b_distributed.sh", "example_mixtral_8x7b.args", "mixtral-8x7b",
     "h100-80g:devices=64"),
])
def test_published_scripts_price_as_their_transcriptions(script, args, model, cluster):
    from sapp import api
    from sapp.engines import import_config
    text = _published(script)
    with open(f"bench/megatron_args/{args}", encoding="utf-8") as f:
        hand = f.read()
    graph = api.capture_graph(api.resolve_model(model)[0])[0]
    cl = api.resolve_cluster(cluster)
    a, b = (import_config(t, "megatron", graph, cl, model) for t in (text, hand))
    assert a["predicted"]["step_time_s"] == b["predicted"]["step_time_s"]
    assert a["predicted"]["peak_memory_bytes"] == b["predicted"]["peak_memory_bytes"]
    assert a["parallel"] == b["parallel"]


@pytest.mark.skipif(not os.path.isdir(MIRROR), reason="needs the fetched Megatron-LM")
def test_the_published_llama3_fp8_script_is_read_and_refused_where_sapp_prices_no_fp8_gathers():
    text = _published("examples/llama/train_llama3_8b_h100_fp8.sh")
    a = megatron.tokens(text)
    assert a["--fp8-format"] == "hybrid" and a["--num-layers"] == "32" and a["--mock-data"] is True
    with pytest.raises(EngineError, match="--fp8-param-gather") as e:
        megatron.parse(text, {"layers": 32, "names": [f"layers.{i}" for i in range(32)]}, 8)
    assert "\n" not in str(e.value)
