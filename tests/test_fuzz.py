"""Property-based: every generated or mutated input (plans, plan texts, cluster specs / dicts / files,
constraints, search arguments, sapp command lines; and bench/fuzz_hostile.py's deep nesting, huge
counts, tiny / huge floats, special paths and hostile schema-valid plans) either succeeds with sane
figures or raises a SappError with a one-line message, within a time bound; valid plans survive
save -> load unchanged.

The generators are bench/fuzz.py's, driven by hypothesis's random source (so failures shrink and
replay).  CI runs the small profile; `SAPP_FUZZ_PROFILE=large pytest tests/test_fuzz.py` runs 50x more,
and `python -m bench.fuzz` pushes >= 10,000 inputs through the same entry points."""
import json
import os
import random
import signal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench import fuzz
from bench import fuzz_hostile as hostile
from sapp.errors import SappError
from sapp.plan import Plan

SLOW = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large]
settings.register_profile("ci", max_examples=12, deadline=None, derandomize=True, database=None,
                          suppress_health_check=SLOW)
settings.register_profile("large", max_examples=600, deadline=None, database=None, suppress_health_check=SLOW)
PROFILE = settings.get_profile(os.environ.get("SAPP_FUZZ_PROFILE", "ci"))
TIME_BOUND_S = 20.0


@pytest.fixture(scope="module")
def fz():
    signal.signal(signal.SIGPROF, fuzz._alarm)
    signal.signal(signal.SIGALRM, fuzz._alarm)      # (the wall-clock bound: a FIFO blocks an open)
    # plots on every valid plan, run's pre-checks on every other one
    return fuzz.Fuzzer(random.Random(0), plot_every=1, precheck_every=2, light=True)


def _ends_cleanly(call):
    """Success or a one-line SappError, inside the bound of CPU seconds (an alarm interrupts a spin;
    CPU time, so that a busy shared box does not fail the test; and a wall-clock bound for an open
    that blocks without using CPU).  A success must make sense (fuzz_hostile.Nonsense otherwise)."""
    signal.signal(signal.SIGALRM, fuzz._alarm)
    signal.setitimer(signal.ITIMER_PROF, TIME_BOUND_S)
    signal.setitimer(signal.ITIMER_REAL, 10 * TIME_BOUND_S)
    try:
        call()
    except SappError as e:
        msg = str(e)
        assert msg.strip() and "\n" not in msg, f"message is not one line: {msg!r}"
    except fuzz.Timeout:
        pytest.fail(f"input ran past {TIME_BOUND_S} CPU s (or blocked)")
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.setitimer(signal.ITIMER_REAL, 0)


@settings(PROFILE)
@given(st.randoms(use_true_random=False), st.integers(0, 2))
def test_mutated_plans_through_every_reader(fz, rng, seed_index):
    doc = fuzz.mutate(rng, fz.seeds[seed_index])
    fz.counts["inputs"] += 1
    _ends_cleanly(lambda: fz.plan_entry(doc))


@settings(PROFILE)
@given(st.randoms(use_true_random=False))
def test_corrupted_plan_texts(fz, rng):
    text = fuzz.corrupt_text(rng, json.dumps(rng.choice(fz.seeds)))
    _ends_cleanly(lambda: Plan.from_json(text))


@settings(PROFILE)
@given(st.randoms(use_true_random=False))
def test_valid_plans_round_trip_through_json(fz, rng):
    # one mutation keeps some plans valid (a changed note, a junk meta field): those must survive
    doc = fuzz.mutate(rng, fz.seeds[0], 1)
    try:
        plan = Plan(doc)
    except SappError:
        return
    again = Plan.from_json(plan.to_json())
    assert again == plan and again.to_json() == plan.to_json()


@settings(PROFILE)
@given(st.randoms(use_true_random=False))
def test_cluster_specs(fz, rng):
    spec = fuzz.gen_cluster_spec(rng)
    _ends_cleanly(lambda: fz.cluster_entry("spec", spec))


@settings(PROFILE)
@given(st.randoms(use_true_random=False), st.booleans())
def test_cluster_dicts_and_files(fz, rng, as_file):
    doc = fuzz.gen_cluster_doc(rng, fz.cluster_base)
    if as_file:
        blob = fuzz.corrupt_text(rng, json.dumps(doc)).encode("utf-8", "surrogatepass")
        _ends_cleanly(lambda: fz.cluster_entry("file", blob))
    else:
        _ends_cleanly(lambda: fz.cluster_entry("dict", doc))


@settings(PROFILE)
@given(st.randoms(use_true_random=False),
       st.one_of(st.none(), st.integers(-2**70, 2**70), st.floats(), st.text(max_size=5), st.booleans()))
def test_search_arguments(fz, rng, global_batch):
    spec = rng.choice(["a100-80g:nodes=1", "cpu", fuzz.gen_cluster_spec(rng)])
    cons = fuzz.gen_constraints(rng)
    _ends_cleanly(lambda: fz.search_entry(spec, global_batch, cons, rng.choice([None, "fp32", "fp8"])))


@settings(PROFILE)
@given(st.randoms(use_true_random=False))
def test_command_lines(fz, rng):
    argv = fuzz.gen_argv(rng, fz.files)
    _ends_cleanly(lambda: fz.cli_entry(argv))


@settings(PROFILE)
@given(st.randoms(use_true_random=False), st.integers(0, 2))
def test_hostile_plans(fz, rng, seed_index):
    """Deep nesting, megabyte names, tiny / huge cluster floats, huge micro-batch counts, names the
    model lacks: refused in one line, or (floats, counts) scored with sane figures, in seconds."""
    doc, expect = hostile.hostile_plan(rng, fz.seeds[seed_index])
    _ends_cleanly(lambda: fz.plan_entry(doc, expect=expect))


@settings(PROFILE)
@given(st.randoms(use_true_random=False))
def test_hostile_clusters_searches_and_deep_texts(fz, rng):
    kind, value = hostile.hostile_cluster(rng, fz.cluster_base)
    _ends_cleanly(lambda: fz.cluster_entry(kind, value))
    cons = hostile.hostile_constraints(rng)
    _ends_cleanly(lambda: fz.search_entry(rng.choice(["cpu", "a100-80g:nodes=1,gpus=2"]), rng.choice([1, 1 << 22]),
                                          cons, None))
    _ends_cleanly(lambda: fz.deep_entry(rng.choice(["plan", "cluster"]), hostile.deep_text(rng)))


@settings(PROFILE)
@given(st.randoms(use_true_random=False))
def test_special_paths(fz, rng):
    what, call = hostile.special_path_call(rng, fz.special, fz.files)
    _ends_cleanly((lambda: fz.cli_entry(call[1])) if isinstance(call, list) else call)


@settings(PROFILE)
@given(st.randoms(use_true_random=False))
def test_checkpoint_dirs_plans_links_and_multinode_flags(fz, rng):
    """bench/fuzz_dirs.py's classes: foreign content in a checkpoint directory, links in plans/, hostile
    multi-node flags; a write or delete under the sentinel folder the links point at fails the input."""
    fz.dirs.rng = rng
    try:
        for _ in range(3):
            kind, call = fz.dirs.one()
            _ends_cleanly(call)
    finally:
        fz.dirs.rng = fz.rng        # hypothesis's random is not usable after the test


def test_generators_reach_success_and_errors(fz):
    """The fuzzer is only worth its count if inputs get past validation too: some plans must evaluate
    and some searches succeed, not every input die at the first check."""
    outcomes = {}
    fz.rng = random.Random(1)
    for _ in range(40):
        kind, _ = fz.one()          # advance the stream so kinds vary
        out = fz.step()
        outcomes.setdefault(out, 0)
        outcomes[out] += 1
    assert outcomes.get("ok", 0) >= 2 and outcomes.get("sapp_error", 0) >= 10, outcomes
    assert not fz.failures, fz.failures


@pytest.mark.parametrize("endpoint", ["127.0.0.1:-1", "127.0.0.1:99999", "127.0.0.1:\uff12\uff19\uff15", ":29500"])
def test_fuzz_found_rendezvous_ports_are_refused_in_one_line(fz, endpoint):
    """bench.fuzz_dirs found `--rdzv-endpoint 127.0.0.1:-1` raising OverflowError from socket.connect."""
    with pytest.raises(SappError) as e:
        fz.dirs.flags_entry(["--nnodes", "1", "--rdzv-endpoint", endpoint])
    assert "--rdzv-endpoint" in str(e.value) and "\n" not in str(e.value)
