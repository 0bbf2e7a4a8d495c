"""The top-level ``--help``: its examples are commands and options that exist."""

from __future__ import annotations

import shlex

import click

from ckptbench.cli import main


def _examples() -> list[list[str]]:
    return [shlex.split(line.strip().replace("...", ""))[1:] for line in (main.help or "").splitlines()
            if line.strip().startswith("ckptbench ")]


def test_the_main_help_leads_with_preflight_and_its_examples_parse():
    examples = _examples()
    assert examples and examples[0][0] == "preflight"
    ctx = click.Context(main)
    for argv in examples:
        command = main.get_command(ctx, argv[0])
        assert command is not None, argv
        known = {o for p in command.params for o in p.opts}
        assert {a for a in argv[1:] if a.startswith("--")} <= known, argv
