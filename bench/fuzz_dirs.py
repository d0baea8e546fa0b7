"""The fuzzer's directory and multi-node classes (issue 53 item 8), beside bench/fuzz_surfaces.py's files:

* `ckpt-dir`: a checkpoint directory sapp wrote (one real step, mlp-tiny) with foreign content planted
  in it: unmarked `step-N` folders, forged markers (junk, another step's, re-sealed with a wrong file
  list), files and FIFOs where folders belong, FIFOs where markers and plans/ entries belong, and
  symlinks (a step, a scratch `.tmp-step-N`, a marker, `plans/`, a `plans/step-N-devices-W.json`)
  pointing into a sentinel folder outside it.  Then what sapp does with such a directory: list and
  verify its checkpoints, choose the resume point, check it before a run, save a step (retention
  runs after), and write an elastic re-plan into plans/.
* `plans-link`: a plans/ entry planted as a symlink (to a file or folder of the sentinel), a FIFO or a
  folder, then the elastic re-plan's write of that name.
* `multinode-flags`: `sapp run` with hostile --nnodes / --node-rank / --rdzv-endpoint / --rdzv-timeout /
  --rdzv-backend / --max-restarts values (full-width and other non-ASCII digits, huge and negative
  numbers, ranges, blanks), the launch itself stubbed: refused in one line, or a torchrun command that
  names its rendezvous endpoint when more than one node is asked for (never a wildcard listener).

What must hold, on top of the fuzzer's rule (success or a one-line SappError within 20 CPU-s): nothing
under the sentinel folder changes (its files' bytes, modes and mtimes, its listing), i.e. no write or
delete went outside the directory sapp was given.  Elastic fault timing is not here: one case is a
multi-process job of tens of seconds (tests/test_elastic_faults.py and bench.launcher_kills time those).

Found and fixed on the way (earlier seeds; from bench/RESULTS.md §7): `--rdzv-endpoint 127.0.0.1:-1`
raised OverflowError from `socket.connect` (the port is now checked: 1-65535, ASCII digits).  Accepted as
given: an explicit `--rdzv-endpoint [::]:29500` or `0.0.0.0:...` binds that wildcard (the user named it)."""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import random
import shutil

from . import fuzz_hostile as hostile

FLAG_JUNK = ["2", "1:2", "2:1", "0", "-1", "1", "3", "\uff12", "1:\uff12", "\u0663", "\u00b9", "9" * 30, "1e3", "nan",
             "", " 2", "2 ", "1:2:3", ":", "0:2", "2.0", "0x2", "+2", "1_0", "18446744073709551617"]
ENDPOINTS = ["127.0.0.1:29599", "0.0.0.0:29500", "[::]:29500", ":29500", "localhost:0", "127.0.0.1:99999", "host",
             "127.0.0.1:-1", "127.0.0.1:\uff12\uff19\uff15", "", "a" * 300 + ":1"]


def snapshot(root: str) -> dict:
    """{relative path: (mode, size, mtime_ns, sha256 of a file's bytes)} of everything under `root`."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for n in dirs + files:
            p = os.path.join(dirpath, n)
            st = os.lstat(p)
            digest = None
            if os.path.isfile(p) and not os.path.islink(p):
                with open(p, "rb") as f:
                    digest = hashlib.sha256(f.read()).hexdigest()
            out[os.path.relpath(p, root)] = (st.st_mode, st.st_size, st.st_mtime_ns, digest)
    return out


class DirSurfaces:
    def __init__(self, rng: random.Random, tmp: str, seed_step: str, cpu_plan: dict):
        """`seed_step`: a real checkpoint folder (fuzz_surfaces' mlp-tiny step 1); `cpu_plan`: a plan
        `sapp run` accepts on this machine (the flags' cases)."""
        import torch
        import sapp.models as models
        from sapp.emit import emit
        from sapp.emit.runtime.train_state import model_names
        from tests.emit_workers.plans import make_plan
        self.rng, self.tmp, self.seed_step = rng, tmp, seed_step
        self.sentinel = os.path.join(tmp, "sentinel")
        os.makedirs(os.path.join(self.sentinel, "step-00000009"), exist_ok=True)
        for rel, text in (("keep.txt", "not sapp's"), ("step-00000009/sapp-checkpoint.json", "{}"),
                          ("plan.json", "{\"x\": 1}")):
            with open(os.path.join(self.sentinel, rel), "w") as f:
                f.write(text)
        self.before = snapshot(self.sentinel)
        torch.manual_seed(0)
        self.model = models.get("mlp-tiny", device="cpu")
        self.names = model_names(self.model)
        self.prog = emit(self.model, make_plan(params=sum(p.numel() for p in self.model.parameters()),
                                               global_batch=4), rank=0, world=1)
        self.plan_path = os.path.join(tmp, "dirs-cpu-plan.json")
        with open(self.plan_path, "w") as f:
            json.dump(cpu_plan, f)
        self.work = os.path.join(tmp, "dirs-work")
        self.launched = 0              # multinode-flags cases that reached the (stubbed) launch

    # -- one input --
    def one(self):
        r = self.rng.random()
        if r < 0.5:
            return "ckpt-dir", lambda a=(self._plants(), self.rng.random()): self.ckpt_entry(*a)
        if r < 0.7:
            return "plans-link", lambda k=self.rng.choice(["file-link", "dir-link", "fifo", "folder", "dangling"]): \
                self.plans_entry(k)
        return "multinode-flags", lambda a=self._flags(): self.flags_entry(a)

    def _plants(self) -> list:
        kinds = ["unmarked", "forged-junk", "forged-resealed", "forged-other-step", "file-step", "fifo-step",
                 "fifo-marker", "link-step", "link-tmp", "link-marker", "plans-file", "plans-link", "fifo-plan",
                 "link-plan", "junk-names"]
        return [(self.rng.choice(kinds), self.rng.choice([1, 2, 3, 4, 6, 10 ** 7, 99999999])) for _ in
                range(self.rng.randint(1, 4))]

    def _flags(self) -> list:
        rng, argv = self.rng, []
        for flag, pool in (("--nnodes", FLAG_JUNK), ("--node-rank", FLAG_JUNK), ("--rdzv-endpoint", ENDPOINTS),
                           ("--rdzv-timeout", ["3", "0", "-5", "1e9", "\uff13", "nan", "inf", "9" * 40]),
                           ("--rdzv-backend", ["c10d", "static", "etcd", ""]),
                           ("--max-restarts", ["0", "3", "-1", "1001", "\uff13", "9" * 30])):
            if rng.random() < (0.9 if flag == "--nnodes" else 0.5):
                argv += [flag, rng.choice(pool)]
        return argv

    # -- entry points --
    def _fresh(self) -> str:
        shutil.rmtree(self.work, ignore_errors=True)
        d = os.path.join(self.work, "ck")
        os.makedirs(os.path.join(d, "plans"))
        shutil.copytree(self.seed_step, os.path.join(d, "step-00000001"))
        return d

    def _plant(self, d, kind, n):
        from sapp.emit.runtime import checkpoint as ck
        step, s = os.path.join(d, f"step-{n:08d}"), self.sentinel
        if os.path.lexists(step) and kind not in ("plans-file", "plans-link", "fifo-plan", "link-plan"):
            return
        if kind == "unmarked":
            os.makedirs(step)
            with open(os.path.join(step, "__0_0.distcp"), "wb") as f:
                f.write(os.urandom(64))
        elif kind.startswith("forged"):
            shutil.copytree(self.seed_step, step)
            mp = os.path.join(step, ck.MARKER)
            meta = json.load(open(mp))
            if kind == "forged-junk":
                meta = {"junk": self.rng.random()}
            elif kind == "forged-other-step":
                meta["step"] = n + 1
            else:
                meta["files"] = {"../../sentinel/keep.txt": [10, 0], **meta.get("files", {})}
            meta["checksum"] = ck.checksum(meta) if kind != "forged-junk" else "0"
            with open(mp, "w") as f:
                json.dump(meta, f)
        elif kind == "file-step":
            with open(step, "w") as f:
                f.write("x")
        elif kind == "fifo-step":
            os.mkfifo(step)
        elif kind == "fifo-marker":
            os.makedirs(step)
            os.mkfifo(os.path.join(step, ck.MARKER))
        elif kind == "link-step":
            os.symlink(os.path.join(s, "step-00000009"), step)
        elif kind == "link-tmp" and not os.path.lexists(os.path.join(d, f".tmp-step-{4:08d}")):
            os.symlink(s, os.path.join(d, f".tmp-step-{4:08d}"))      # the scratch name of the save below
        elif kind == "link-marker":
            os.makedirs(step)
            os.symlink(os.path.join(s, "step-00000009", ck.MARKER), os.path.join(step, ck.MARKER))
        elif kind == "plans-file" or kind == "plans-link":
            plans = os.path.join(d, "plans")
            if os.path.islink(plans) or os.path.isfile(plans):
                os.remove(plans)
            shutil.rmtree(plans, ignore_errors=True)
            if kind == "plans-file":
                open(os.path.join(d, "plans"), "w").close()
            else:
                os.symlink(s, os.path.join(d, "plans"))
        elif kind in ("fifo-plan", "link-plan") and os.path.isdir(os.path.join(d, "plans")) \
                and not os.path.islink(os.path.join(d, "plans")):
            p = os.path.join(d, "plans", f"step-{1:08d}-devices-2.json")
            if not os.path.lexists(p):
                os.mkfifo(p) if kind == "fifo-plan" else os.symlink(os.path.join(s, "plan.json"), p)
        elif kind == "junk-names":
            for name in ("step-1", "step-000000001", "step-0000000x", ".tmp-step-00000003"):
                os.makedirs(os.path.join(d, name), exist_ok=True)

    def _untouched(self):
        now = snapshot(self.sentinel)
        if now != self.before:
            changed = sorted(k for k in set(now) | set(self.before) if now.get(k) != self.before.get(k))
            raise hostile.Nonsense(f"a write or delete outside the directory given: sentinel {changed[:3]} changed")

    def ckpt_entry(self, plants, which):
        from sapp.emit.runtime import checkpoint as ck
        from sapp.emit.runtime.checkpoint_find import committed, resume_point, verify
        d = self._fresh()
        for kind, n in plants:
            self._plant(d, kind, n)
        try:
            for _, path in committed(d):
                got, why = verify(path)
                if got is None and not (isinstance(why, str) and why.strip() and "\n" not in why):
                    raise hostile.Nonsense(f"verify() gave no reason in one line: {why!r}")
            resume_point(d, log=lambda _m: None)
            ck.check_directory(d, 0, resuming=True, writes=lambda s: s <= 4)
            if which < 0.5:
                ckp = ck.Checkpointer(d, keep=1, names=self.names, log=lambda _m: None)
                ckp.save(self.prog, 4, {"global_batch": 4, "data": "synthetic", "shuffle": False, "seed": 0})
                if verify(os.path.join(d, "step-00000004"))[0] is None:
                    raise hostile.Nonsense("a save sapp reported did not verify")
            self._replan_write(d)
        finally:
            self._untouched()

    def _replan_write(self, d):
        """What the elastic re-plan writes (sapp/emit/runtime/elastic.py): plans/step-N-devices-W.json."""
        from sapp.fileio import write_atomic
        path = os.path.join(d, "plans", f"step-{1:08d}-devices-2.json")
        try:
            write_atomic(path, "{\"replan\": 1}", under=d, make=True)
        except OSError as e:       # refused (a link or a file in the way): what elastic turns into one line
            if not str(e).strip() or "\n" in str(e):
                raise hostile.Nonsense(f"write_atomic's refusal is not one line: {e!r}") from None
            return
        if not os.path.isfile(path) or os.path.islink(path) or open(path).read() != "{\"replan\": 1}":
            raise hostile.Nonsense("the re-plan's write did not land as a plain file in plans/")

    def plans_entry(self, kind):
        d = self._fresh()
        p = os.path.join(d, "plans", f"step-{1:08d}-devices-2.json")
        if kind == "file-link":
            os.symlink(os.path.join(self.sentinel, "plan.json"), p)
        elif kind == "dir-link":
            os.symlink(self.sentinel, p)
        elif kind == "dangling":
            os.symlink(os.path.join(self.sentinel, "absent.json"), p)
        elif kind == "fifo":
            os.mkfifo(p)
        else:
            os.makedirs(p)
        try:
            self._replan_write(d)
        finally:
            self._untouched()
            if kind == "dangling" and os.path.lexists(os.path.join(self.sentinel, "absent.json")):
                os.remove(os.path.join(self.sentinel, "absent.json"))
                raise hostile.Nonsense("a dangling link in plans/ was written through")

    def flags_entry(self, flags):
        import sapp.commands.run as run_cmd
        from sapp.commands.cli import main
        launched, usage = [], False
        real = run_cmd._launch
        run_cmd._launch = lambda cmd, env, args: launched.append(cmd) or 0
        out, err = io.StringIO(), io.StringIO()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    rc = main(["run", self.plan_path, "--model", "gpt-tiny", "--steps", "1", *flags])
                except SystemExit as e:      # argparse: its usage and one error line, exit 2
                    rc, usage = e.code, True
        finally:
            run_cmd._launch = real
        text = err.getvalue()
        if "Traceback" in text:
            raise AssertionError(f"traceback printed: {text[-300:]}")
        if usage:
            return "clean_exit" if rc in (0, 2) else None
        if rc == 2:
            lines = [ln for ln in text.splitlines() if ln.strip()]
            if len(lines) != 1 or len(lines[0]) > 2200:
                raise AssertionError(f"error output is not one bounded line: {text[-300:]!r}")
            from sapp.errors import SappError
            raise SappError(lines[0])            # refused in one line: the fuzzer's clean outcome
        for cmd in launched:
            nn = next((a.split("=", 1)[1] for a in cmd if str(a).startswith("--nnodes=")), None)
            if nn is None and "--nnodes" in cmd:
                nn = cmd[cmd.index("--nnodes") + 1]
            if nn not in (None, "1", "1:1") and not any(str(a).startswith("--rdzv-endpoint") or str(a).startswith(
                    "--rdzv_endpoint") for a in cmd):
                raise hostile.Nonsense(f"multi-node launch without a rendezvous endpoint: {cmd[:12]}")
        self.launched += bool(launched)
        return None
