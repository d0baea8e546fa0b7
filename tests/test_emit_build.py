"""The emitter's shared state is a few typed groups, and its training program a dataclass (issue 56).

`Build` (sapp/emit/build.py) holds the model, the plan and groups with one meaning each; the groups
that no step changes are frozen, so a step that tried to write the plan's numbers fails loudly.
`Program` (sapp/emit/runtime/program.py) names every attribute the runtime, the manifest and the
tests read, so none is set out of band."""
import dataclasses
import os
import re

import pytest

from sapp.emit import build
from sapp.emit.cp.program import CPProgram
from sapp.emit.runtime.program import Program

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_build_has_at_most_ten_fields_of_typed_groups():
    names = [f.name for f in dataclasses.fields(build.Build)]
    assert len(names) <= 10, names
    assert names[:2] == ["model", "plan"]
    for f in dataclasses.fields(build.Build)[2:]:
        assert dataclasses.is_dataclass(getattr(build, f.type)), f.name


@pytest.mark.parametrize("group", ["Rank", "Layout", "Training", "RecomputePlan", "Placement", "Audit"])
def test_what_no_step_changes_is_frozen(group):
    cls = getattr(build, group)
    assert cls.__dataclass_params__.frozen
    obj = cls(**{f.name: None for f in dataclasses.fields(cls)})
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(obj, dataclasses.fields(cls)[0].name, 1)


def test_program_is_a_dataclass_compared_by_identity():
    assert dataclasses.is_dataclass(Program) and dataclasses.is_dataclass(CPProgram)
    assert {"cp", "dp_only", "cp_rank"} <= {f.name for f in dataclasses.fields(CPProgram)}
    assert Program.__hash__ is object.__hash__ and Program.__eq__ is object.__eq__


def _read_attributes() -> set:
    """Every attribute name read or written after `prog.` or `program.` in sapp/ and tests/."""
    pat = re.compile(r"\b(?:prog|program)\.([A-Za-z_]\w*)")
    found = set()
    for top in ("sapp", "tests"):
        for folder, _, files in os.walk(os.path.join(ROOT, top)):
            for f in files:
                if f.endswith(".py"):
                    with open(os.path.join(folder, f), encoding="utf-8") as fh:
                        found |= set(pat.findall(fh.read()))
    return found


def test_every_attribute_used_of_a_program_is_declared():
    declared = {f.name for f in dataclasses.fields(CPProgram)} | {n for n in dir(CPProgram) if not n.startswith("__")}
    # modules and files named prog/program that are not a Program
    other = {"py", "status", "ticking", "update"}
    missing = sorted(_read_attributes() - declared - other)
    assert not missing, f"Program attributes used but not declared as fields: {missing}"
