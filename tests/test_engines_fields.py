"""Every field of the installed torchtitan's JobConfig is classified by sapp's importer
(sapp/engines/torchtitan_fields.py): priced (read by the parser), refused in one line when set to
anything but torchtitan's default, or irrelevant to the priced step with a reason.  A field torchtitan
adds that the table does not list fails here."""
import dataclasses
import inspect

import pytest

from sapp.engines import EngineError, torchtitan
from sapp.engines.torchtitan_fields import FIELDS

from tests import engine_validate as V


def _job_config():
    pytest.importorskip("tyro")
    try:
        V._torchtitan_package()
        from torchtitan.config.job_config import JobConfig
    except ImportError:
        pytest.skip("torchtitan not installed")
    return JobConfig()


def _fields(job):
    for f in dataclasses.fields(job):
        section = getattr(job, f.name)
        if dataclasses.is_dataclass(section):
            for g in dataclasses.fields(section):
                yield f.name, g.name, getattr(section, g.name)


def test_every_torchtitan_field_is_classified():
    job = _job_config()
    missing = [f"[{s}] {k}" for s, k, _ in _fields(job) if (s, k) not in FIELDS]
    assert not missing, f"torchtitan fields sapp's importer does not classify: {missing}"
    from sapp.engines import fp8          # the float8 converter's fields are read there
    src = inspect.getsource(torchtitan) + inspect.getsource(fp8)
    for s, k, default in _fields(job):
        kind = FIELDS[(s, k)]
        if kind == "priced":
            assert f'"{k}"' in src, f"[{s}] {k} is listed as priced but the parser never reads it"
        elif kind[0] == "refused":
            if kind[1] is not None:
                assert kind[1] == default, f"[{s}] {k}: torchtitan's default is {default!r}, the table {kind[1]!r}"
        else:
            assert kind[0] == "irrelevant" and len(kind[1]) > 10, (s, k)


@pytest.mark.parametrize("sec,key", [k for k, v in FIELDS.items() if isinstance(v, tuple) and v[0] == "refused"])
def test_a_refused_field_is_refused_in_one_line(sec, key):
    default = FIELDS[(sec, key)][1]
    if isinstance(default, list):
        value = ["float8"]
    elif default in ("headtail", "allgather", "standard", "default"):
        value = "other"
    else:
        value = {"": "x", False: True, 1: 2, "AdamW": "SGD", "float32": "bfloat16", None: {"float8": {}}}[default]
    doc = {sec: {key: value}}
    with pytest.raises(EngineError, match=key) as e:
        torchtitan.parse(_toml(doc), {"layers": 2, "names": ["a", "b"], "seq": None}, 8)
    assert "\n" not in str(e.value)


def _toml(doc):
    lines = []
    for sec, body in doc.items():
        lines.append(f"[{sec}]")
        for k, v in body.items():
            if isinstance(v, dict):
                lines.append(f"{k} = {{ float8 = {{}} }}")
            else:
                lines.append(f"{k} = {torchtitan._toml_value(v)}")
    return "\n".join(lines) + "\n"
