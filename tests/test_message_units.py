"""Units by magnitude where a user reads a time, and messages cut at a word boundary (issue 55 item 7)."""
from sapp.commands.calibrate import table_row
from sapp.errors import clip


def test_clip_cuts_at_a_word_with_an_ellipsis():
    text = "the capture found a gap at /work/main/sapp/capture/convert.py:274 while tracing the model " * 3
    out = clip(text, 80)
    assert len(out) <= 80 and out.endswith("\u2026")
    assert text.startswith(out[:-1]) and text[len(out) - 1] == " "      # the cut falls between words
    assert clip("short", 80) == "short"
    path = "/" + "x" * 300
    assert clip(path, 50) == path[:49] + "\u2026"                          # one long word keeps its head


def test_calibrate_from_run_table_prints_units():
    row = table_row("/tmp/run.jsonl", 0.000285, 0.0003, 1.5)
    assert "285.0 us" in row and "300.0 us" in row and "1.500 s" in row and "+526" in row
