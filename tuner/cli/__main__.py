"""`python -m tuner.cli`: the `tune` command."""

from tuner.cli.app import app

app()
