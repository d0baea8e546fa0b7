import json
import subprocess
import sys

from sapp.commands.cli import main


def test_clusters_lists_presets(capsys):
    assert main(["clusters"]) == 0
    out = capsys.readouterr().out
    for name in ("a100-80g", "h100-80g", "h200", "v100-32g", "cpu"):
        assert name in out
    assert main(["clusters", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["h200"]["device_memory"] == 141e9


def test_no_command_prints_help(capsys):
    assert main([]) == 2
    assert "search" in capsys.readouterr().out


def test_console_entry_point_runs():
    r = subprocess.run([sys.executable, "-m", "sapp.commands.cli", "clusters"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "a100-80g" in r.stdout


def test_version(capsys):
    import pytest
    import sapp
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"sapp {sapp.__version__}"


def test_every_option_of_every_command_has_help():
    """Walks every subcommand's parser (commands added later included): each option says what it does."""
    import argparse
    from sapp.commands.cli import COMMANDS, build_parser
    parser = build_parser()
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert len(subs) == 1 and "run" in subs[0].choices and set(subs[0].choices) <= set(COMMANDS)
    missing = [f"sapp {name} {'/'.join(act.option_strings) or act.dest}"
               for name, sub in subs[0].choices.items() for act in sub._actions
               if not isinstance(act, argparse._HelpAction) and not (act.help or "").strip()]
    missing += [f"sapp {'/'.join(a.option_strings)}" for a in parser._actions
                if a.option_strings and not isinstance(a, argparse._HelpAction) and not a.help]
    assert missing == []
