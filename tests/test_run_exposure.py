"""What `sapp run` exposes on the network (issue 27, findings 4 and 11): a single-node job's processes
listen on loopback only (read from the kernel's socket tables while the job runs, not from the
launcher's arguments), and a multi-node rendezvous that a node never joins ends within its timeout in
one line naming that node."""
import ipaddress
import os
import subprocess
import sys
import time


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))


def _tree(root: int) -> set:
    """root and its descendants, from /proc/<pid>/stat."""
    parent = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    parent[int(d)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    out, todo = {root}, [root]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p and c not in out]
        out.update(kids)
        todo += kids
    return out


def _addr(hexaddr: str):
    raw = bytes.fromhex(hexaddr)
    if len(raw) == 4:
        return ipaddress.IPv4Address(raw[::-1])
    a = ipaddress.IPv6Address(b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))
    return a.ipv4_mapped or a


def listening(pids: set) -> set:
    """{(address, port)} of the TCP sockets in LISTEN state that these processes hold."""
    inodes = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
        except OSError:
            pass
    out = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                if cols[3] == "0A" and cols[9] in inodes:
                    host, port = cols[1].split(":")
                    out.add((_addr(host), int(port, 16)))
    return out


def test_listener_parser_sees_a_wildcard_store():
    """The check below can fail: torch's own TCPStore (as torchrun makes it) shows as the wildcard."""
    import torch.distributed as dist
    store = dist.TCPStore("127.0.0.1", 0, 1, True)
    mine = {a for a, p in listening({os.getpid()}) if p == store.port}
    assert mine and all(not a.is_loopback for a in mine)


def _watched(cmd, timeout_s=240):
    """(exit code, output, {(address, port)} listened on) of a command's process tree while it runs."""
    job = subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    seen, pids, t0 = set(), set(), time.time()
    try:
        while job.poll() is None and time.time() - t0 < timeout_s:
            tree = _tree(job.pid)
            pids |= tree
            seen |= listening(tree)
            time.sleep(0.05)
    finally:
        if job.poll() is None:
            job.kill()
        out = job.communicate()[0].decode(errors="replace")
    return job.returncode, out, seen, pids


def test_single_node_job_listens_on_loopback_only(tmp_path):
    import sapp.models as models
    from tests.emit_workers.plans import make_plan
    make_plan(name="gpt-tiny", params=models.info("gpt-tiny")["params"], global_batch=8, dp=2).save(tmp_path / "p.json")
    rc, out, seen, pids = _watched([sys.executable, "-m", "sapp.commands.cli", "run", str(tmp_path / "p.json"), "--model",
                                    "gpt-tiny", "--steps", "40"])
    assert rc == 0, out[-3000:]
    assert len(pids) >= 4                   # sapp run, the launcher and two ranks were watched
    assert len({p for _, p in seen}) >= 2, seen     # the rendezvous store and rank 0's store at least
    assert all(a.is_loopback for a, _ in seen), sorted(map(str, seen))


def test_missing_node_times_out_in_one_line(tmp_path):
    """Node 0 of a two-node run alone: the rendezvous ends after --rdzv-timeout naming node 1."""
    import socket
    import sapp.models as models
    from tests.emit_workers.plans import make_plan
    plan = make_plan(name="gpt-tiny", params=models.info("gpt-tiny")["params"], global_batch=8, dp=2)
    plan._d["mesh"] = {"levels": [{"size": 2, "link": "inter"}]}
    plan.save(tmp_path / "p.json")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.time()
    p = subprocess.run([sys.executable, "-m", "sapp.commands.cli", "run", str(tmp_path / "p.json"), "--model", "gpt-tiny",
                        "--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", f"127.0.0.1:{port}",
                        "--rdzv-id", "lonely", "--rdzv-timeout", "5"],
                       cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=200)
    took = time.time() - t0
    lines = [ln for ln in p.stderr.splitlines() if "sapp run: error" in ln]
    assert p.returncode != 0 and len(lines) == 1, p.stderr[-3000:]
    assert f"node 1 of 2 never joined the rendezvous at 127.0.0.1:{port} within 5 s" in lines[0]
    assert "joined: 0 (" in lines[0] and "--node-rank 1" in lines[0]
    assert "Traceback" not in p.stderr
    print(f"ended {took:.1f}s after the start (timeout 5 s)")
