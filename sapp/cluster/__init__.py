"""Cluster descriptions: presets from vendor data sheets, spec strings, JSON load/save, validation.

All quantities are SI base units: bytes, bytes/s, FLOP/s, seconds.  Bandwidths are *per device and per
direction*; `inter_bw` is a device's share of its node's network (e.g. 8 x 200 Gb/s IB over 8 GPUs gives
25 GB/s each).  Host quantities are per node and shared by the node's devices.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

from sapp import schema
from sapp.errors import ClusterError
from sapp.cluster.values import _check_curve, _check_named_pairs, _is_number, _named_pairs, _to_bool, _to_curve, _to_float, _to_int

# Bounds that keep every search finite (the joint search enumerates divisors of these): the largest
# clusters built have ~10^5 accelerators; a node (one NVLink domain) a few hundred.
MAX_DEVICES = 1 << 20
MAX_PER_NODE = 4096
MAX_FILE_BYTES = 64 << 20

_POSITIVE = (
    "nodes", "gpus_per_node", "peak_flops", "device_memory", "mem_bandwidth", "intra_bw", "inter_bw",
    "host_memory", "host_mem_bandwidth", "h2d_bw", "host_flops", "rng_rate", "compute_scale",
)
_NON_NEGATIVE = ("intra_latency", "inter_latency", "op_overhead", "sharded_op_overhead", "update_op_overhead",
                 "fsdp_unit_overhead", "fsdp_tensor_overhead")
# fractions of peak where 0 means "unset": as compute_efficiency, the flash_attention ones as the
# attention ones (fields added after the first presets)
# Sane bounds of every rate, size and time (validate; mirrored in cluster.schema.json, tested equal):
# from a slow CPU core to well past any accelerator built.  Without them a schema-valid 5e-324 FLOP/s
# divides to inf and 1.7e308 s of latency to NaN, and the report says "step nan" or "MFU 324%".
_FLOPS, _BYTES_S, _SECONDS = (1e6, 1e18), (1e3, 1e16), (0.0, 1.0)
RANGES = {
    "peak_flops": _FLOPS, "host_flops": _FLOPS, "rng_rate": (1e3, 1e18),
    "mem_bandwidth": _BYTES_S, "intra_bw": _BYTES_S, "inter_bw": _BYTES_S, "host_mem_bandwidth": _BYTES_S,
    "h2d_bw": _BYTES_S, "device_memory": (1e3, 1e16), "host_memory": (1e3, 1e18),
    "intra_latency": _SECONDS, "inter_latency": _SECONDS, "op_overhead": _SECONDS, "sharded_op_overhead": _SECONDS,
    "update_op_overhead": _SECONDS, "fsdp_unit_overhead": _SECONDS, "fsdp_tensor_overhead": _SECONDS,
    "compute_scale": (0.01, 100.0),
}
# [size, rate] curves, {op: [fwd, bwd] elements/s}, {collective: [alpha s, beta bytes/s]}
CURVE_RANGES = {"mem_bw_curve": ((0.0, 1e16), _BYTES_S), "rng_curve": ((0.0, 1e18), (1e3, 1e18)),
                "op_rates": ((1e3, 1e18), (1e3, 1e18)), "collective_fits": (_SECONDS, _BYTES_S)}
_OPTIONAL_FRACTIONS = ("attention_efficiency", "attention_bwd_efficiency", "flash_attention_efficiency",
                       "flash_attention_bwd_efficiency", "gemm_memory_overlap")
_BOOLS = ("async_launch", "fused_dropout")
_FRACTIONS = ("compute_efficiency", "memory_efficiency")
_CURVES = ("mem_bw_curve", "rng_curve")
PRECISIONS = ("bf16-mixed", "fp16-mixed", "fp32")


@dataclass(frozen=True)
class Cluster:
    """A homogeneous cluster: nodes of identical devices, the figures the cost model prices them with.

    Presets (``sapp clusters`` lists them) are read with :meth:`parse`; ``sapp calibrate`` measures
    the figures of the machine it runs on; :meth:`replace` changes a few.  Sizes are in bytes, rates
    in bytes or FLOP per second per device, latencies in seconds.

    Examples
    --------
    >>> import sapp
    >>> cluster = sapp.Cluster.parse("a100-80g:nodes=2")
    >>> cluster.devices, cluster.gpus_per_node, cluster.device_memory
    (16, 8, 80000000000.0)
    >>> cluster.replace(nodes=4).devices
    32
    """
    name: str = "custom"
    nodes: int = 1
    gpus_per_node: int = 8
    peak_flops: float = 312e12          # dense bf16 FLOP/s per device
    device_memory: float = 80e9         # bytes per device
    mem_bandwidth: float = 2.0e12       # device memory bytes/s
    intra_bw: float = 300e9             # bytes/s per device per direction inside a node
    intra_latency: float = 5e-6
    inter_bw: float = 25e9              # bytes/s per device per direction across nodes
    inter_latency: float = 10e-6
    host_memory: float = 1e12           # bytes per node
    host_mem_bandwidth: float = 200e9   # bytes/s per node
    h2d_bw: float = 25e9                # host<->device bytes/s per device per direction
    host_flops: float = 3e12            # FLOP/s per node (fp32, vectorised)
    compute_efficiency: float = 0.8     # fraction of peak large GEMMs reach
    memory_efficiency: float = 0.8      # fraction of memory bandwidth streaming ops reach
    # Device memory kept free for what the cost model does not see (CUDA context, allocator
    # fragmentation, communication buffers): plans that fit on paper and then OOM are the top complaint.
    memory_headroom: float = 0.03
    # Host time per operator launch of the model's graph (framework dispatch + kernel launch),
    # seconds.  It dominates ops whose shard is tiny.  CUDA: ~4-10 us per launch.  CPU eager training:
    # `sapp calibrate` times a training step of a transformer with tiny dimensions and divides by the
    # launches the cost model counts for it (~20 us on a 2-core VM, where a bare op dispatches in ~5 us:
    # nn.Module calls, autograd nodes, the transposes / views / gradient accumulation of the backward
    # that a captured graph does not list all come with each counted op).
    op_overhead: float = 5e-6
    # Whether that dispatch overlaps the device's work.  GPUs: yes - the host enqueues kernels
    # asynchronously and runs ahead, so an op costs max(roofline, launch) and only launch-bound tiny
    # ops pay it.  CPU eager: no - the process that dispatches is the one that computes, so it adds.
    async_launch: bool = True
    # Dispatch of one op on a *sharded* parameter (torch DTensor: FSDP2 ZeRO-2/3 and tensor-parallel
    # weights), which goes through a Python tensor subclass first: ~10x a plain op in eager on CPU.
    # It matters for the optimizer update, which runs op by op per parameter tensor.  0 = op_overhead.
    sharded_op_overhead: float = 0.0
    # Dispatch of one op of the optimizer's update: a bare tensor op, outside autograd and modules
    # (`sapp calibrate`: a chain of tiny multiplications).  0 = op_overhead.
    update_op_overhead: float = 0.0
    # Random numbers per second one device generates (dropout masks): a third roofline limit beside
    # FLOP/s and bytes/s.  GPUs generate them in-kernel (Philox) faster than memory streams the
    # tensor, so it never binds there; a CPU core draws ~1e8/s, ~30x slower than it adds two tensors.
    rng_rate: float = 1e13
    # Training precision plans for this cluster assume unless the search is told otherwise:
    # "bf16-mixed" (GPUs' matrix units) or "fp32" (a CPU trains in fp32; pricing it as bf16 would halve
    # every byte the model counts).
    precision: str = "bf16-mixed"
    # Measured rates that depend on how much one operator touches (`sapp calibrate` fills them; empty =
    # the single figures above).  mem_bw_curve: (bytes moved by one element-wise op, bytes/s) pairs,
    # rising bytes - a small op's tensors sit in cache and stream several times faster than a large
    # one's from DRAM.  rng_curve: (elements of one dropout, random draws/s) pairs, likewise.
    # Between points the rate is interpolated on log(size); outside them the nearest point holds.
    mem_bw_curve: tuple = ()
    rng_curve: tuple = ()
    # Measured element rates of non-GEMM operators: (name, forward elements/s, backward elements/s)
    # triples, name as in the graph without "aten." and overload ("gelu", "softmax", "layer_norm").
    # A core evaluates erf or exp an order of magnitude slower than it streams bytes, and the backward
    # of softmax is cheaper than its forward, so a single FLOP rate misprices these.  An op in the
    # table costs at least elements / rate; empty = roofline only.
    op_rates: tuple = ()
    # Measured eager-training time of a reference transformer block over what the figures above
    # predict for it: the framework's own costs (Python, autograd bookkeeping, allocation, caches
    # between ops) that no single-op benchmark sees.  Multiplies every operator's time.
    compute_scale: float = 1.0
    # Per-collective (kind, alpha s, beta bytes/s) fits inside a node where they differ from the
    # all-reduce's: gloo's all-gather / reduce-scatter are not rings of the all-reduce's cost, and
    # FSDP2 lives on them.  Empty = every collective uses intra_latency / intra_bw.
    collective_fits: tuple = ()
    # Seconds per FSDP unit (ZeRO-2/3 shard group) per training step that the sharded-data-parallel
    # runtime spends besides its collectives on a serial device: FSDP2's Python hooks and the copies in
    # and out of its flat buffers, tensor by tensor (~1.6 ms per unit + 0.4 ms per parameter tensor on
    # a 2-core CPU: ~6.5 ms for a 12-tensor GPT block).  Hidden behind the device on GPUs.
    fsdp_unit_overhead: float = 0.0
    fsdp_tensor_overhead: float = 0.0    # the same, per parameter tensor the unit holds
    notes: str = field(default="", compare=False)
    # Whether training dropout runs torch's fused kernel (native_dropout: CUDA and other accelerators),
    # which keeps a 1-byte bool mask for backward.  A CPU runs the unfused form
    # (input * empty_like(input).bernoulli_(1 - p).div_(1 - p)) and keeps that scaled noise, a tensor
    # of the input's dtype: 4 bytes per element in fp32.
    fused_dropout: bool = True
    # Fraction of peak a fused attention kernel (SDPA / flash attention: the graph's "attention" op)
    # reaches in forward and in backward, counting FLOPs as costmodel.nodes.time_flops does (a causal
    # kernel's half of the scores; backward 2.5x the forward) - the convention of the FlashAttention
    # benchmarks.  Attention kernels interleave two GEMMs with an online softmax and reach less than a
    # large GEMM.  0 = compute_efficiency (the datasheet presets without a published figure).
    attention_efficiency: float = 0.0
    attention_bwd_efficiency: float = 0.0
    # The same for FlashAttention's own kernel, where it differs from the one above: what torch's
    # varlen_attn runs (torchtitan 0.3's "varlen" attention activates FlashAttention-3 on Hopper), priced
    # under the "torchtitan" runtime (costmodel/torchtitan.py).  0 = as attention_efficiency.
    flash_attention_efficiency: float = 0.0
    flash_attention_bwd_efficiency: float = 0.0
    # How much of a dense GEMM's memory traffic (operands and output at the memory efficiency) hides
    # behind its arithmetic (at compute_efficiency): 1 = all of it, the plain roofline's max (a
    # calibrated machine whose efficiencies already fold it in); 0 = none, the sum of the two times.
    gemm_memory_overlap: float = 1.0
    # Dense FP8 tensor-core FLOP/s per device (Hopper: 1979e12, twice its bf16), what an FP8 linear
    # layer's GEMMs run at (costmodel/fp8.py).  0 = no FP8 tensor cores: FP8 training is refused.
    fp8_peak_flops: float = 0.0

    def __post_init__(self):
        # JSON and dataclasses.replace hand curves over as lists: keep them hashable tuples
        for key in _CURVES:
            v = getattr(self, key)
            if isinstance(v, list):
                object.__setattr__(self, key, tuple(tuple(p) if isinstance(p, list) else p for p in v))
        if isinstance(self.op_rates, dict):
            object.__setattr__(self, "op_rates", _named_pairs(self.op_rates))
        if isinstance(self.collective_fits, dict):
            object.__setattr__(self, "collective_fits", _named_pairs(self.collective_fits, "collective_fits"))

    # ---- derived -------------------------------------------------------------------------------
    @property
    def devices(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def usable_memory(self) -> float:
        """Bytes per device a plan may fill: capacity less the headroom."""
        return self.device_memory * (1.0 - self.memory_headroom)

    def validate(self) -> "Cluster":
        for key in _POSITIVE:
            v = getattr(self, key)
            if not _is_number(v) or v <= 0:
                raise ClusterError(f"cluster {self.name!r}: {key} must be a positive finite number, got {v!r}")
        for key in ("nodes", "gpus_per_node"):
            if int(getattr(self, key)) != getattr(self, key):
                raise ClusterError(f"cluster {self.name!r}: {key} must be a whole number, got {getattr(self, key)!r}")
        if self.gpus_per_node > MAX_PER_NODE:
            raise ClusterError(f"cluster {self.name!r}: gpus_per_node={self.gpus_per_node} is more than {MAX_PER_NODE} "
                               f"devices in one node; give the devices per node")
        if self.nodes * self.gpus_per_node > MAX_DEVICES:
            raise ClusterError(f"cluster {self.name!r}: nodes x gpus = {self.nodes} x {self.gpus_per_node} is more than "
                               f"{MAX_DEVICES} devices; sapp plans up to {MAX_DEVICES}")
        for key in _NON_NEGATIVE:
            v = getattr(self, key)
            if not _is_number(v) or v < 0:
                raise ClusterError(f"cluster {self.name!r}: {key} must be >= 0 and finite, got {v!r}")
        for key, (lo, hi) in RANGES.items():
            v = getattr(self, key)
            if not lo <= v <= hi:
                raise ClusterError(f"cluster {self.name!r}: {key}={v:g} is outside [{lo:g}, {hi:g}]; "
                                   f"give the device's real figure")
        for key in _BOOLS:
            if not isinstance(getattr(self, key), bool):
                raise ClusterError(f"cluster {self.name!r}: {key} must be true or false, got {getattr(self, key)!r}")
        if not _is_number(self.memory_headroom) or not 0 <= self.memory_headroom < 0.9:
            raise ClusterError(f"cluster {self.name!r}: memory_headroom must be in [0, 0.9), got {self.memory_headroom!r}")
        for key in _FRACTIONS:
            v = getattr(self, key)
            if not _is_number(v) or not 0 < v <= 1:
                raise ClusterError(f"cluster {self.name!r}: {key} must be in (0, 1], got {v!r}")
        v = self.fp8_peak_flops
        if not _is_number(v) or not (v == 0 or _FLOPS[0] <= v <= _FLOPS[1]):
            raise ClusterError(f"cluster {self.name!r}: fp8_peak_flops must be 0 (no FP8 tensor cores) or in "
                               f"[{_FLOPS[0]:g}, {_FLOPS[1]:g}], got {v!r}")
        for key in _OPTIONAL_FRACTIONS:
            v = getattr(self, key)
            if not _is_number(v) or not 0 <= v <= 1:
                raise ClusterError(f"cluster {self.name!r}: {key} must be in [0, 1] (0 = unset), got {v!r}")
        if not isinstance(self.name, str) or len(self.name) > schema.MAX_STRING:
            raise ClusterError(f"cluster name must be a string of at most {schema.MAX_STRING} characters, "
                               f"got {type(self.name).__name__} {str(self.name)[:40]!r}")
        if self.precision not in PRECISIONS:
            raise ClusterError(f"cluster {self.name!r}: precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        for key in _CURVES:
            _check_curve(self.name, key, getattr(self, key))
        _check_named_pairs(self.name, self.op_rates)
        _check_named_pairs(self.name, self.collective_fits, "collective_fits", allow_zero_first=True)
        for key, ((lo0, hi0), (lo1, hi1)) in CURVE_RANGES.items():
            for item in getattr(self, key):
                a, b = item[-2:]
                if not (lo0 <= a <= hi0 and lo1 <= b <= hi1):
                    raise ClusterError(f"cluster {self.name!r}: {key} entry {list(item)!r} is outside "
                                       f"[{lo0:g}, {hi0:g}] x [{lo1:g}, {hi1:g}]; give measured figures")
        for kind, _, _ in self.collective_fits:
            if kind not in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "p2p"):
                raise ClusterError(f"cluster {self.name!r}: collective_fits names unknown collective {kind!r}")
        return self

    def replace(self, **changes) -> "Cluster":
        return dataclasses.replace(self, **changes).validate()

    # ---- serialisation -------------------------------------------------------------------------
    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for key in _CURVES:
            d[key] = [list(p) for p in d[key]]
        d["op_rates"] = {name: [f, b] for name, f, b in d["op_rates"]}
        d["collective_fits"] = {name: [a, b] for name, a, b in d["collective_fits"]}
        return d

    @classmethod
    def from_dict(cls, d: dict, where: str = "") -> "Cluster":
        """A cluster from its JSON form, checked against sapp/schema/cluster.schema.json first.
        `where` prefixes messages (the file, or "cluster." for a plan's section)."""
        if not isinstance(d, dict):
            raise ClusterError(f"{where}cluster description must be a JSON object, got {type(d).__name__}")
        bad = schema.shape_problem(d)
        if bad:
            raise ClusterError(f"{where}{bad}; not a cluster description")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(map(str, set(d) - known))
        if unknown:
            raise ClusterError(f"unknown cluster field(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        bad = schema.non_finite_path(d)
        if bad:
            raise ClusterError(f"{where}{bad} is not a finite number")
        err = schema.first_error("cluster", schema.plain(d))
        if err:
            raise ClusterError(f"{where}{err}" + ("; a cluster file must give nodes, gpus_per_node, peak_flops, "
                                                  "device_memory, mem_bandwidth, intra_bw and inter_bw"
                                                  if "missing field" in err else ""))
        kwargs = {}
        for k, v in d.items():
            if k in ("name", "notes", "precision"):
                kwargs[k] = str(v)
            elif k in _CURVES:
                kwargs[k] = _to_curve(v, k)
            elif k in ("op_rates", "collective_fits"):
                kwargs[k] = _named_pairs(v, k)
            elif k in ("nodes", "gpus_per_node"):
                kwargs[k] = _to_int(v, k)
            elif k in _BOOLS:
                kwargs[k] = _to_bool(v, k)
            else:
                kwargs[k] = _to_float(v, k)
        return cls(**kwargs).validate()

    def save(self, path) -> None:
        d = self.validate().to_dict()
        err = schema.first_error("cluster", d)
        if err:     # a field this class gained but the schema has not: fix the schema, not the file
            raise ClusterError(f"cluster {self.name!r} does not match cluster.schema.json: {err}")
        text = json.dumps(d, indent=2, sort_keys=True) + "\n"
        from sapp.fileio import write_atomic
        try:        # never through a symlink: a link planted at `path` is replaced, not followed
            write_atomic(path, text)
        except OSError as e:
            raise ClusterError(f"cannot write cluster file {path}: {e.strerror or e}; choose another --out") from None

    @classmethod
    def load(cls, path) -> "Cluster":
        from sapp.fileio import read_text
        text = read_text(path, MAX_FILE_BYTES, what="cluster file", give="give a cluster JSON file",
                         too_big="not a cluster description", not_text="give a JSON file from `sapp calibrate`",
                         error=ClusterError)
        try:
            d = schema.strict_loads(text)
        except json.JSONDecodeError as e:
            raise ClusterError(f"cluster file {path} is not valid JSON ({e.msg} at line {e.lineno})") from None
        except (ValueError, RecursionError) as e:
            raise ClusterError(f"cluster file {path} is not usable JSON ({str(e)[:80]})") from None
        return cls.from_dict(d, where=f"cluster file {path}: ")

    @classmethod
    def parse(cls, spec: str) -> "Cluster":
        """A cluster from a spec: a preset with settings, or a JSON file ``sapp calibrate`` wrote.

        Parameters
        ----------
        spec : str
            ``NAME[:key=value,...]``: ``'a100-80g:nodes=128'``, ``'h100-80g:nodes=4,gpus=8,inter_bw=50GB/s'``,
            ``'cpu:gpus=2'`` (units: GB/s, GFLOP/s, GB, us, ...), or a ``.json`` path.

        Returns
        -------
        Cluster

        Raises
        ------
        ClusterError
            An unknown preset or key, or a value out of its bounds; the message names it.

        Examples
        --------
        >>> import sapp
        >>> sapp.Cluster.parse("h100-80g:nodes=4,gpus=8,inter_bw=50GB/s").inter_bw
        50000000000.0
        >>> sapp.Cluster.parse("cpu:gpus=2").devices
        2
        """
        if not isinstance(spec, str):
            raise ClusterError(f"cluster spec must be a string like 'a100-80g:nodes=16' or a .json path, "
                               f"got {type(spec).__name__} {spec!r:.40}")
        if not spec.strip():
            raise ClusterError("empty cluster spec: write NAME[:nodes=N,gpus=G,key=value...], e.g. a100-80g:nodes=16")
        spec = spec.strip()
        if spec.lower().endswith(".json"):
            return cls.load(spec)
        name, _, rest = spec.partition(":")
        if name not in PRESETS:
            raise ClusterError(f"unknown cluster preset {name!r}; choose one of {', '.join(PRESETS)} or pass a .json file")
        base = PRESETS[name]
        changes, devices, given = {}, None, set()
        for item in filter(None, (p.strip() for p in rest.split(","))):
            key, eq, value = item.partition("=")
            key = _ALIASES.get(key.strip(), key.strip())
            if not eq:
                raise ClusterError(f"cluster spec item {item!r} needs key=value, e.g. nodes=16")
            if key in given:
                raise ClusterError(f"cluster spec {spec!r} sets {key} twice; give it once")
            given.add(key)
            if key == "devices":
                devices = _to_int(value, "devices")
                continue
            if key not in {f.name for f in dataclasses.fields(cls)} or key == "name":
                raise ClusterError(f"unknown cluster key {key!r} in {spec!r}; known: nodes, gpus, devices, "
                                   + ", ".join(_POSITIVE[2:] + _NON_NEGATIVE + _FRACTIONS + ("memory_headroom", "precision") + _BOOLS))
            if key in _CURVES or key in ("op_rates", "collective_fits"):
                raise ClusterError(f"{key} cannot be given in a spec string; put it in a cluster .json file")
            if key == "precision":
                changes[key] = value.strip()
            elif key in _BOOLS:
                changes[key] = _to_bool(value, key)
            else:
                changes[key] = _to_int(value, key) if key in ("nodes", "gpus_per_node") else _to_float(value, key)
        cluster = dataclasses.replace(base, **changes)
        if devices is not None:
            if devices <= 0:
                raise ClusterError(f"devices must be positive, got {devices}")
            gpn = cluster.gpus_per_node
            if "nodes" in changes:
                if cluster.nodes * gpn != devices:
                    raise ClusterError(f"devices={devices} is not nodes x gpus = {cluster.nodes} x {gpn}; drop one of them")
            elif devices < gpn and "gpus_per_node" not in changes:
                cluster = dataclasses.replace(cluster, nodes=1, gpus_per_node=devices)
            elif devices % gpn:
                raise ClusterError(f"devices={devices} is not a multiple of {gpn} devices per node; use a multiple or set gpus=")
            else:
                cluster = dataclasses.replace(cluster, nodes=devices // gpn)
        return cluster.validate()


def curve_rate(curve, size: float, default: float) -> float:
    """Rate at `size` from a (size, rate) curve: linear in log(size) between points, the end point's
    rate beyond them, `default` when the curve is empty."""
    if not curve:
        return default
    if size <= curve[0][0]:
        return curve[0][1]
    if size >= curve[-1][0]:
        return curve[-1][1]
    import math
    i = 1
    while curve[i][0] < size:
        i += 1
    (s0, r0), (s1, r1) = curve[i - 1], curve[i]
    w = (math.log(size) - math.log(s0)) / (math.log(s1) - math.log(s0))
    return r0 + w * (r1 - r0)


_ALIASES = {"gpus": "gpus_per_node", "per_node": "gpus_per_node", "memory": "device_memory", "flops": "peak_flops"}

# Fused attention on Hopper (H100 / H800 / H200: the same SMs): the cuDNN kernel Megatron-Core runs
# through Transformer Engine, bf16, head dim 128, sequence 4k, as FlashAttention-3's paper measures it
# on an H100 SXM5 (Shah et al. 2024, arXiv 2407.08608, Fig. 5 causal forward: 518 TFLOP/s; Fig. 6
# backward: 499 TFLOP/s) over the 989 TFLOP/s peak; FlashAttention-3 itself, in the same figures, 579 / 542
# (the kernel torchtitan 0.3's varlen attention runs there).
# Every GPU preset prices dense GEMMs on the summed roofline (gemm_memory_overlap 0; docs/ARCHITECTURE.md
# "Compute efficiency by kernel").
# Hopper's dense FP8 rate is twice its bf16 (NVIDIA H100 datasheet: 1,979 TFLOP/s FP8 dense SXM)
_HOPPER_ATTENTION = {"attention_efficiency": 518 / 989, "attention_bwd_efficiency": 499 / 989,
                     "flash_attention_efficiency": 579 / 989, "flash_attention_bwd_efficiency": 542 / 989,
                     "gemm_memory_overlap": 0.0, "fp8_peak_flops": 1979e12}

PRESETS = {
    # REFERENCE.md section 3 (dense bf16).  inter_bw = node NIC bandwidth / devices per node.
    "a100-80g": Cluster("a100-80g", 1, 8, 312e12, 80e9, 2.0e12, 300e9, 5e-6, 25e9, 10e-6,
                        1e12, 200e9, 25e9, 3e12, notes="A100 SXM 80GB, NVLink3, 8x200Gb/s IB, PCIe Gen4",
                        gemm_memory_overlap=0.0),
    "h100-80g": Cluster("h100-80g", 1, 8, 989e12, 80e9, 3.35e12, 450e9, 5e-6, 50e9, 10e-6,
                        2e12, 400e9, 50e9, 4e12, notes="H100 SXM 80GB, NVLink4, 8x400Gb/s IB, PCIe Gen5",
                        **_HOPPER_ATTENTION),
    # H800 (the export-control H100 DeepSeek-V3 trained on): H100 SXM compute and memory (989 dense
    # bf16 TFLOP/s, 80 GB HBM3, 3.35 TB/s) with NVLink cut to 400 GB/s bidirectional, i.e. 200 GB/s a
    # direction on the convention of h100-80g's 450 (= 900 / 2); DeepSeek-V3's report (arXiv
    # 2412.19437, section 3.2.2) measures ~160 GB/s achievable over NVLink and 50 GB/s per GPU over
    # IB: 8 x 400 Gb/s InfiniBand NICs a node, one per GPU (inter_bw = 400 Gb/s = 50 GB/s a GPU).
    "h800": Cluster("h800", 1, 8, 989e12, 80e9, 3.35e12, 200e9, 5e-6, 50e9, 10e-6,
                    2e12, 400e9, 50e9, 4e12, notes="H800 SXM 80GB, NVLink 400GB/s, 8x400Gb/s IB, PCIe Gen5",
                    **_HOPPER_ATTENTION),
    "h200": Cluster("h200", 1, 8, 989e12, 141e9, 4.8e12, 450e9, 5e-6, 50e9, 10e-6,
                    2e12, 400e9, 50e9, 4e12, notes="H200 141GB, NVLink4, 8x400Gb/s, PCIe Gen5",
                    **_HOPPER_ATTENTION),
    "v100-32g": Cluster("v100-32g", 1, 8, 125e12, 32e9, 0.9e12, 150e9, 5e-6, 6.25e9, 10e-6,
                        512e9, 100e9, 12e9, 1.5e12, precision="fp16-mixed",   # no bf16 units: fp16 + loss scaling
                        notes="V100 SXM2 32GB (DGX-1), NVLink2, 4x100Gb/s IB, PCIe Gen3", gemm_memory_overlap=0.0),
    # One "device" per process on a CPU box, talking over gloo/loopback.  Rough figures for this 2-core
    # machine; `sapp calibrate` measures real ones.
    "cpu": Cluster("cpu", 1, 2, 50e9, 8e9, 10e9, 2e9, 50e-6, 2e9, 50e-6,
                   16e9, 10e9, 10e9, 50e9, compute_efficiency=0.5, memory_efficiency=0.5,
                   op_overhead=10e-6, async_launch=False, rng_rate=1.2e8, precision="fp32", fused_dropout=False,
                   notes="processes on this CPU machine (gloo); calibrate for real figures"),
}
