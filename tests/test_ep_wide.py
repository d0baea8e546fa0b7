"""Wide expert parallelism (ep 32-64, DeepSeek-V3's EP 64 over 8 nodes) is among the configurations the
free search prices: every ep dividing both the stage's dp ranks and the expert count is enumerated."""
import pytest

import sapp.models as zoo
from sapp.capture import capture
from sapp.cluster import Cluster
from sapp.costmodel import CostSettings
from sapp.search.constraints import Constraints
from sapp.search.joint.configs import enumerate_configs
from sapp.search.joint.context import SearchContext


@pytest.fixture(scope="module")
def deepseek():
    return capture(zoo.get("deepseek-v3"), batch=1)


def test_the_published_ep64_layout_is_enumerated(deepseek):
    cl = Cluster.parse("h800:nodes=256")
    ctx = SearchContext(deepseek, cl, 15360, Constraints(tp=1, pp=16), CostSettings(runtime="fused"), None)
    eps = {c.ep for c in enumerate_configs(ctx) if c.dp == 128 and c.zero == 1}
    # 256 experts over dp 128: every power of two up to 128 divides both
    assert {2, 4, 8, 16, 32, 64, 128} <= eps
    published = [c for c in enumerate_configs(ctx) if (c.dp, c.ep, c.zero, c.m) == (128, 64, 1, 120)]
    assert published, "DeepSeek-V3's tp1 pp16 dp128 ep64 ZeRO-1 with 120 micro-batches is not searched"
