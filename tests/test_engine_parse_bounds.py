"""Issue 53, finding 8: a 4 MB torchtitan `.py` holding a 2-million-element tuple cost 12-24 CPU-s and
2.3 GB before the node-count refusal (`ast.parse` ran twice: once to tell it from a TOML file, once to
read it), and error lines echoed whole values (a 10**6-character DeepSpeed value made a 1 MB line).
Now the file's tokens are counted before any tree is built, it is parsed once, and every value an
error echoes is cut with its length said (sapp.errors.shown; SappError caps any message)."""
import ast
import contextlib
import io
import json
import time

from sapp.commands.cli import main
from sapp.errors import SappError

TT = ("from torchtitan.trainer import Trainer\nfrom torchtitan.config import TrainingConfig\n\n"
      "def job() -> Trainer.Config:\n    x = ({})\n    return Trainer.Config(training=TrainingConfig(global_batch_size=8))\n")


def _import(tmp_path, engine, name, text):
    path = tmp_path / name
    path.write_text(text)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(["import", "--from", engine, str(path), "--model", "gpt-tiny", "--cluster", "a100-80g:devices=8",
                   "--no-compare"])
    return rc, err.getvalue()


def test_a_4mb_tuple_is_refused_before_a_tree_is_built():
    from sapp.engines import pyconfig
    from sapp.engines.mapping import EngineError
    text = TT.format("0," * 2_000_000)
    assert len(text) > 4_000_000
    t0 = time.process_time()
    try:
        pyconfig.read(text)
        raise AssertionError("read")
    except EngineError as e:
        assert "more than 50000 tokens" in str(e) and len(str(e)) < 200, str(e)
    took = time.process_time() - t0
    assert took < 2.0, f"{took:.2f} CPU-s"      # the old reader: 12 CPU-s and 2.3 GB here


def test_the_file_is_parsed_once(tmp_path, monkeypatch):
    text = TT.format("1, 2")
    parses = []
    real = ast.parse

    def counted(source, *a, **k):
        if source == text:
            parses.append(1)
        return real(source, *a, **k)
    monkeypatch.setattr(ast, "parse", counted)
    _import(tmp_path, "torchtitan", "job.py", text)
    assert len(parses) == 1, f"parsed {len(parses)} times"


def test_a_megabyte_value_is_echoed_cut_with_its_length(tmp_path):
    rc, err = _import(tmp_path, "deepspeed", "ds.json", json.dumps({"train_batch_size": "a" * 10 ** 6}))
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err[:300]
    assert len(err) < 300 and "(1000000 characters)" in err and "train_batch_size" in err, err[:400]


def test_a_megabyte_name_in_a_torchtitan_file_is_cut(tmp_path):
    name = "v" * 10 ** 6         # an unbound name: one token, so the token count lets it through
    text = TT.replace("x = ({})", f"x = {name}")
    rc, err = _import(tmp_path, "torchtitan", "job.py", text)
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err[:300]
    assert len(err) < 500 and "(1000000 characters)" in err, err[:600]


def test_every_sapp_error_is_capped_and_says_how_long_it_was():
    from sapp.errors import MAX_MESSAGE, shown
    msg = str(SappError("x" * 10 ** 6))
    assert len(msg) <= MAX_MESSAGE and "1000000 characters" in msg
    assert str(SappError("short")) == "short"
    assert shown("abc") == "'abc'" and shown(list(range(10 ** 5))).endswith("characters as written)")
