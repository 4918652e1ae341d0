"""The `gpuwatch` command line (also `python -m gpuwatch`)."""

from __future__ import annotations

import asyncio
import logging
import sys

import click

from gpuwatch import __version__
from gpuwatch import config as config_mod
from gpuwatch.attribution.cli import attribution as attribution_command
from gpuwatch.monitoring.cli import alerts as alerts_command
from gpuwatch.monitoring.cli import dashboards as dashboards_command
from gpuwatch.thresholds.cli import thresholds as thresholds_command
from gpuwatch.views.cli import report as report_command
from gpuwatch.views.cli import status as status_command

SCENARIO_NAMES = ("steady", "leak", "fragmentation", "mixed", "large", "kubernetes")


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    from gpuwatch.redact import install_log_filter

    install_log_filter()  # no handler writes a configured secret or URL credentials


def _load(config_file: str | None, overrides: dict) -> config_mod.Config:
    try:
        return config_mod.load(config_file, overrides=overrides)
    except config_mod.ConfigError as exc:
        from gpuwatch.redact import scrub_text

        click.echo(f"gpuwatch: configuration error: {scrub_text(str(exc))}", err=True)
        sys.exit(2)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gpuwatch")
def main() -> None:
    """Observability for GPU hosts that serve LLMs."""


# Generators and table inspection live with their subsystems; importing them costs only click.
main.add_command(dashboards_command)
main.add_command(alerts_command)
main.add_command(thresholds_command)
main.add_command(attribution_command)
main.add_command(report_command)
main.add_command(status_command)


@main.command()
@click.option("--config", "config_file", type=click.Path(dir_okay=False),
              help="TOML configuration file (also GPUWATCH_CONFIG).")
@click.option("--listen", help=f"HOST:PORT to serve on (default :{config_mod.DEFAULT_PORT}).")
@click.option("--simulate", type=click.Choice(SCENARIO_NAMES),
              help="Use a simulated GPU host instead of NVML.")
@click.option("--seed", type=int, help="Seed of the simulation.")
@click.option("--record", type=click.Path(dir_okay=False),
              help="Write every tick to this recording (.gz compresses).")
@click.option("--dry-run", is_flag=True, default=None,
              help="Remediation records what it would do and does nothing.")
@click.option("--engine", "engine_urls", multiple=True, metavar="URL",
              help="An inference engine's metrics URL (repeatable).")
@click.option("--events-log", type=click.Path(dir_okay=False),
              help="Append every event as a JSON line to this file.")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]))
@click.option("--web-config", type=click.Path(dir_okay=False),
              help="TLS / client certificates / basic auth for every endpoint, in the "
                   "Prometheus exporter-toolkit web-config format.")
def run(config_file, listen, simulate, seed, record, dry_run, engine_urls, events_log,
        log_level, web_config) -> None:
    """Run the daemon."""
    overrides: dict = {"listen": listen, "simulate": simulate, "seed": seed, "record": record,
                       "events_log": events_log, "log_level": log_level,
                       "web_config": web_config}
    if dry_run:
        overrides["remediation"] = {"dry_run": True}
    if engine_urls:
        overrides["engines"] = _engines_from_flags(config_file, engine_urls)
    cfg = _load(config_file, overrides)
    web = _load_web_config(cfg.web_config)
    _setup_logging(cfg.log_level)
    from gpuwatch.daemon import Daemon

    daemon = Daemon(cfg, config_path=config_file, overrides=overrides, web=web)
    sys.exit(asyncio.run(daemon.run()))


def _load_web_config(path: str):
    if not path:
        return None
    from gpuwatch import webconfig

    try:
        return webconfig.load(path)
    except webconfig.WebConfigError as exc:
        click.echo(f"gpuwatch: --web-config: {exc}", err=True)
        sys.exit(2)


def _engines_from_flags(config_file: str | None, urls: tuple[str, ...]) -> list[dict]:
    """--engine URLs come after the configured [[engines]] (flags add, never replace)."""
    from gpuwatch.engines.urls import engine_from_url

    base = _load(config_file, {})
    configured = [config_mod.msgspec.to_builtins(e) for e in base.engines]
    return configured + [config_mod.msgspec.to_builtins(engine_from_url(u)) for u in urls]


@main.command()
@click.argument("recording", type=click.Path(exists=True, dir_okay=False))
@click.option("--config", "config_file", type=click.Path(dir_okay=False))
@click.option("--thresholds", "thresholds_file", type=click.Path(exists=True, dir_okay=False),
              help="A threshold table override file.")
@click.option("--json", "as_json", is_flag=True, help="One JSON event per line.")
@click.option("--no-actions", is_flag=True,
              help="Signal events only, without the remediation policy's planned actions.")
def replay(recording, config_file, thresholds_file, as_json, no_actions) -> None:
    """Run the analyzers and policy over a recording and print the events."""
    from gpuwatch.replay import replay_events

    overrides = {"thresholds": {"file": thresholds_file}} if thresholds_file else {}
    cfg = _load(config_file, overrides)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    try:
        replay_events(recording, cfg, as_json=as_json, out=sys.stdout,
                      actions=not no_actions)
    except ValueError as exc:
        click.echo(f"gpuwatch: {exc}", err=True)
        sys.exit(2)
