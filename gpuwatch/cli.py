"""The `gpuwatch` command line (also `python -m gpuwatch`)."""

from __future__ import annotations

import logging
import os
import sys

import click

from gpuwatch import __version__, exitcodes, serve
from gpuwatch import config as config_mod

SCENARIO_NAMES = ("steady", "leak", "leak-fixed", "leak-early", "leak-start", "fill",
                  "fragmentation", "mixed", "large", "kubernetes")


def _load(config_file: str | None, overrides: dict) -> config_mod.Config:
    try:
        return config_mod.load(config_file, overrides=overrides)
    except config_mod.ConfigError as exc:
        _config_error(exc)


def _config_error(exc: config_mod.ConfigError):
    click.echo(serve.config_error_line(exc), err=True)
    sys.exit(exitcodes.USAGE)


# Commands that live with their subsystems, imported when named: the daemon (`run`) never
# holds the generators, the report or the clients in memory.
LAZY_COMMANDS = {
    "alerts": "gpuwatch.monitoring.cli:alerts",
    "attribution": "gpuwatch.attribution.cli:attribution",
    "dashboards": "gpuwatch.monitoring.cli:dashboards",
    "npd": "gpuwatch.nodehealth.npd:npd",
    "report": "gpuwatch.views.cli:report",
    "status": "gpuwatch.views.cli:status",
    "thresholds": "gpuwatch.thresholds.cli:thresholds",
}


class _Cli(click.Group):
    """Every misuse is one line on stderr naming the flag and the reason, exit status 2, and
    never a traceback (a service manager must see a clear reason, not a restart loop)."""

    def list_commands(self, ctx):
        return sorted({*super().list_commands(ctx), *LAZY_COMMANDS})

    def get_command(self, ctx, cmd_name):
        target = LAZY_COMMANDS.get(cmd_name)
        if target is None:
            return super().get_command(ctx, cmd_name)
        import importlib

        module, _, attr = target.partition(":")
        return getattr(importlib.import_module(module), attr)

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True,
             **extra):
        try:
            rv = super().main(args, prog_name or "gpuwatch", complete_var,
                              standalone_mode=False, **extra)
        except click.UsageError as exc:  # bad flag, value, argument or command
            where = exc.ctx.command_path if exc.ctx else "gpuwatch"
            click.echo(f"{where}: {serve.one_line(exc.format_message())}", err=True)
            sys.exit(exitcodes.USAGE)
        except click.ClickException as exc:  # e.g. a file argument that cannot be opened
            click.echo(f"gpuwatch: {serve.one_line(exc.format_message())}", err=True)
            sys.exit(exc.exit_code)
        except click.Abort:  # Ctrl-C at a prompt or during a command
            click.echo("gpuwatch: interrupted", err=True)
            sys.exit(130)
        except KeyboardInterrupt:
            sys.exit(130)
        except Exception as exc:  # a bug: one line to report, not a traceback to scroll
            click.echo(serve.internal_error(exc), err=True)
            sys.exit(exitcodes.FAILURE)
        sys.exit(rv if isinstance(rv, int) else exitcodes.OK)


def _bad(param: str, reason: str) -> click.BadParameter:
    return click.BadParameter(serve.one_line(reason), param_hint=param)


def _check_listen(ctx, param, value):
    if value is not None:
        try:
            config_mod.parse_listen(value)
        except ValueError as exc:
            raise _bad("--listen", str(exc).removeprefix("listen: ")) from None
    return value


def _check_output_file(ctx, param, value):
    """--record and --events-log fail here, before the daemon serves anything."""
    from gpuwatch.paths import writable_file_problem

    if value is not None:
        problem = writable_file_problem(value)
        if problem:
            raise _bad(param.opts[0], problem)
    return value


@click.group(cls=_Cli, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gpuwatch")
def main() -> None:
    """Observability for GPU hosts that serve LLMs."""


@main.command()
@click.option("--config", "config_file", type=click.Path(dir_okay=False),
              help="TOML configuration file (also GPUWATCH_CONFIG).")
@click.option("--listen", callback=_check_listen,
              help=f"HOST:PORT to serve on (default :{config_mod.DEFAULT_PORT}).")
@click.option("--simulate", type=click.Choice(SCENARIO_NAMES),
              help="Use a simulated GPU host instead of NVML.")
@click.option("--seed", type=int, help="Seed of the simulation.")
@click.option("--host-name", help="This host's name in recordings and OTLP (default: the "
              "system's); each daemon of a simulated fleet gets its own.")
@click.option("--record", type=click.Path(dir_okay=False), callback=_check_output_file,
              help="Write every tick to this recording (.gz compresses).")
@click.option("--dry-run", is_flag=True, default=None,
              help="Remediation records what it would do and does nothing.")
@click.option("--engine", "engine_urls", multiple=True, metavar="URL",
              help="An inference engine's metrics URL (repeatable).")
@click.option("--events-log", type=click.Path(dir_okay=False), callback=_check_output_file,
              help="Append every event as a JSON line to this file.")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]))
@click.option("--require-gpu", is_flag=True, default=None,
              help="Not ready (/readyz 503) while no GPU is sampled (DaemonSets on GPU nodes).")
@click.option("--web-config", type=click.Path(dir_okay=False),
              help="TLS / client certificates / basic auth for every endpoint, in the "
                   "Prometheus exporter-toolkit web-config format.")
def run(config_file, listen, simulate, seed, host_name, record, dry_run, engine_urls, events_log,
        log_level, require_gpu, web_config) -> None:
    """Run the daemon."""
    overrides: dict = {"listen": listen, "simulate": simulate, "seed": seed,
                       "host_name": host_name, "record": record,
                       "events_log": events_log, "log_level": log_level,
                       "require_gpu": require_gpu, "web_config": web_config}
    if dry_run:
        overrides["remediation"] = {"dry_run": True}
    if engine_urls:
        overrides["engines"] = _engines_from_flags(config_file, engine_urls)
    quiet = logging.getLogger("gpuwatch.config")
    quiet.disabled = True  # its warnings are the served process's to say, once
    try:  # here first: a misuse fails in this process, before the exec
        serve.checked(config_file, overrides)
    except serve.StartError as exc:
        click.echo(str(exc), err=True)
        sys.exit(exitcodes.USAGE)
    finally:
        quiet.disabled = False
    serve.start(config_file, overrides)


def _validated_files(cfg: config_mod.Config):
    """Every file the configuration names, read and checked (the web config is returned):
    one line and exit 2 on a problem, as for the configuration itself."""
    from gpuwatch.startup import SetupError, validate_files

    try:
        return validate_files(cfg)
    except SetupError as exc:
        _config_error(config_mod.ConfigError(str(exc)))


def _engines_from_flags(config_file: str | None, urls: tuple[str, ...]) -> list[dict]:
    """--engine URLs come after the configured [[engines]] (flags add, never replace)."""
    from gpuwatch.engines.urls import engine_from_url

    base = _load(config_file, {})
    configured = [config_mod.msgspec.to_builtins(e) for e in base.engines]
    for u in urls:
        if not u.strip() or any(c.isspace() for c in u):
            raise _bad("--engine", f"{u!r} is not a URL: give the engine's metrics URL, "
                       "such as http://127.0.0.1:8000/metrics")
    try:
        flagged = [engine_from_url(u) for u in urls]
    except ValueError as exc:
        raise _bad("--engine", str(exc).split(": ", 1)[-1]) from None
    return configured + [config_mod.msgspec.to_builtins(e) for e in flagged]


@main.command()
@click.argument("recording", type=click.Path(exists=True, dir_okay=False))
@click.option("--config", "config_file", type=click.Path(dir_okay=False))
@click.option("--thresholds", "thresholds_file", type=click.Path(exists=True, dir_okay=False),
              help="A threshold table override file.")
@click.option("--json", "as_json", is_flag=True, help="One JSON event per line.")
@click.option("--no-actions", is_flag=True,
              help="Signal events only, without the remediation policy's planned actions.")
@click.option("--strict", is_flag=True,
              help="Exit 1 when the recording is truncated (it is replayed up to the cut).")
def replay(recording, config_file, thresholds_file, as_json, no_actions, strict) -> None:
    """Run the analyzers and policy over a recording and print the events."""
    from gpuwatch.recording import ReadReport
    from gpuwatch.replay import replay_events, truncation_warning

    overrides = {"thresholds": {"file": thresholds_file}} if thresholds_file else {}
    cfg = _load(config_file, overrides)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    report = ReadReport()
    try:
        replay_events(recording, cfg, as_json=as_json, out=sys.stdout,
                      actions=not no_actions, report=report)
    except ValueError as exc:
        click.echo(f"gpuwatch replay: {exc}", err=True)
        sys.exit(exitcodes.USAGE)
    warning = truncation_warning(recording, report)
    if warning:
        click.echo(f"gpuwatch replay: warning: {warning}", err=True)
        if strict:
            sys.exit(exitcodes.FAILURE)


@main.command()
@click.option("--config", "config_file", type=click.Path(dir_okay=False),
              help="TOML configuration file (also GPUWATCH_CONFIG).")
@click.option("--listen", callback=_check_listen, help="HOST:PORT the daemon would serve on.")
@click.option("--rules-dir", type=click.Path(file_okay=False),
              help="Where Prometheus loads gpuwatch's rules: checked against this version.")
@click.option("--dashboards-dir", type=click.Path(file_okay=False),
              help="Where gpuwatch's dashboards are provisioned: checked against this version.")
def check(config_file, listen, rules_dir, dashboards_dir) -> None:
    """Check the setup: one line per check (ok / warn / fail and the fix)."""
    from gpuwatch.doctor import run_checks

    cfg = _load(config_file, {"listen": listen})
    _validated_files(cfg)
    source = config_file or os.environ.get("GPUWATCH_CONFIG") or "defaults (no file)"
    failed = False
    for finding in run_checks(cfg, source, rules_dir, dashboards_dir):
        click.echo(finding.line())
        failed |= finding.status == "fail"
    sys.exit(exitcodes.FAILURE if failed else exitcodes.OK)


@main.command("config")
@click.option("--config", "config_file", type=click.Path(dir_okay=False),
              help="TOML configuration file (also GPUWATCH_CONFIG).")
@click.option("--listen", callback=_check_listen, help="HOST:PORT, as given to run.")
@click.option("--dry-run", is_flag=True, default=None, help="As given to run.")
def config_command(config_file, listen, dry_run) -> None:
    """Print the effective configuration as TOML: secrets masked, each value's origin."""
    from gpuwatch.effective import render

    flags: dict = {"listen": listen}
    if dry_run:
        flags["remediation"] = {"dry_run": True}
    try:
        click.echo(render(config_file, flags), nl=False)
    except config_mod.ConfigError as exc:
        _config_error(exc)
