"""`gpuwatch report` and `gpuwatch status` (their heavy parts are imported when they run)."""

from __future__ import annotations

import sys

import click


def _fail(message: str) -> None:
    click.echo(f"gpuwatch: {message}", err=True)
    sys.exit(2)


@click.command()
@click.argument("recording", type=click.Path(exists=True, dir_okay=False))
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              help="The HTML file to write.")
@click.option("--config", "config_file", type=click.Path(dir_okay=False))
@click.option("--thresholds", "thresholds_file", type=click.Path(exists=True, dir_okay=False),
              help="A threshold table override file.")
@click.option("--no-actions", is_flag=True, help="Without the remediation policy's plans.")
def report(recording, output, config_file, thresholds_file, no_actions) -> None:
    """Write a self-contained HTML report with plots of a recording."""
    import logging
    import os
    import time

    from gpuwatch import config as config_mod
    from gpuwatch.views.report import build

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    overrides = {"thresholds": {"file": thresholds_file}} if thresholds_file else {}
    try:
        cfg = config_mod.load(config_file, overrides=overrides)
    except config_mod.ConfigError as exc:
        _fail(f"configuration error: {exc}")
    started = time.monotonic()
    try:
        page = build(recording, cfg, actions=not no_actions)
    except ValueError as exc:
        _fail(str(exc))
    tmp = f"{output}.tmp{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(page)
        os.replace(tmp, output)  # a reader never sees half a report
    except OSError as exc:
        _fail(f"-o {output}: {exc.strerror or exc}")
    click.echo(f"wrote {output} ({len(page) / 1024:.0f} KiB) in "
               f"{time.monotonic() - started:.1f} s", err=True)
