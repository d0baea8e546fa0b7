"""Host placement inside the joint search: embedding tables go to the host when the device is too
small, and placement pins are honoured."""
import importlib

from sapp.api import capture_graph, search


def test_tables_move_to_host_when_the_device_is_small():
    g, _ = capture_graph(importlib.import_module("sapp.models").get("wide-deep-100m"))
    roomy = search("wide-deep-100m", "a100-80g:nodes=1", global_batch=16384, graph=g)
    tight = search("wide-deep-100m", "a100-80g:nodes=1,device_memory=16GB", global_batch=16384, graph=g)
    groups = tight["placement"]["groups"]
    assert groups["deep_emb.weight"]["weights"] == "host"
    assert tight["predicted"]["peak_memory_bytes"] <= 16e9
    assert tight["predicted"]["host_s"] > 0
    assert tight["predicted"]["step_time_s"] >= roomy["predicted"]["step_time_s"]


def test_placement_pin_is_honoured():
    p = search("wide-deep", "a100-80g:nodes=1", global_batch=4096, constraints={"placement": {"deep_emb.*": "host"}})
    assert p["placement"]["groups"]["deep_emb.weight"]["weights"] == "host"
    assert p["parallel"]["pp"] == 1
    assert p["constraints"] == {"placement": {"deep_emb.*": "host"}}
