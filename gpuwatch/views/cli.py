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
@click.option("--audit", "audit_file", type=click.Path(exists=True, dir_okay=False),
              help="The daemon's audit log: show the actions it took while recording.")
def report(recording, output, config_file, thresholds_file, no_actions, audit_file) -> None:
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
        page = build(recording, cfg, actions=not no_actions, audit=audit_file)
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


def client_options(command):
    """How a command reaches a running daemon behind its web configuration (`status`,
    `npd`): basic auth, the CA of its certificate, and its configuration for the URL."""
    for option in reversed((
        click.option("--user", help="Basic-auth user of the daemon's web configuration."),
        click.option("--password-file", type=click.Path(dir_okay=False),
                     help="File holding that user's password (else asked for on a "
                          "terminal)."),
        click.option("--cacert", type=click.Path(dir_okay=False),
                     help="CA certificate that signed the daemon's TLS certificate."),
        click.option("--config", "config_file", type=click.Path(dir_okay=False),
                     envvar="GPUWATCH_CONFIG",
                     help="The daemon's TOML configuration: URL from its listen address and "
                          "TLS (also GPUWATCH_CONFIG)."))):
        command = option(command)
    return command


@click.command()
@click.argument("url", required=False)
@click.option("--watch", type=click.FloatRange(min=0.5), metavar="N",
              help="Refresh every N seconds until interrupted.")
@click.option("--plain", is_flag=True, help="Plain text even on a terminal.")
@client_options
def status(url, watch, plain, user, password_file, cacert, config_file) -> None:
    """One-screen summary of a running daemon (default: the configured listen address on
    this host, else http://127.0.0.1:PORT)."""
    import time

    from gpuwatch.safetext import printable
    from gpuwatch.views import terminal

    url = url or _local_url(config_file)
    try:
        terminal.check_url(url)
    except ValueError as exc:
        _fail(str(exc))
    auth = (user, _password(password_file)) if user else None
    if password_file and not user:
        _fail("--password-file: needs --user")
    if cacert:
        try:
            open(cacert, "rb").close()
        except OSError as exc:
            _fail(f"--cacert {cacert}: {exc.strerror or exc}")
    tty = sys.stdout.isatty()
    console = None if plain or not tty else _rich_console()
    frames = 0

    def show() -> bool:
        nonlocal frames
        try:
            summary = terminal.summarize(
                terminal.fetch_state(url, auth=auth, cafile=cacert), url)
        except terminal.StatusError as exc:  # it may quote the server's words
            click.echo(f"gpuwatch: {printable(str(exc))}", err=True)
            return False
        if console is not None:
            if watch:
                console.clear()
            terminal.render_rich(summary, console)
        else:
            text = terminal.render_plain(summary)
            # without rich, a terminal is still redrawn in place (plain ANSI), not scrolled
            if watch and tty:
                text = terminal.redraw(text, first=frames == 0)
            sys.stdout.write(text)
            sys.stdout.flush()
        frames += 1
        return True

    if not watch:
        sys.exit(0 if show() else 1)
    try:
        while True:
            show()
            time.sleep(watch)
    except KeyboardInterrupt:
        sys.exit(0)


def _password(path: str | None) -> str:
    if path is None:
        if not sys.stdin.isatty():
            _fail("--user: give --password-file (no terminal to ask on)")
        return click.prompt("password", hide_input=True, err=True)
    try:
        with open(path, encoding="utf-8") as f:
            return f.readline().rstrip("\r\n")
    except (OSError, UnicodeDecodeError) as exc:
        _fail(f"--password-file {path}: {getattr(exc, 'strerror', None) or exc}")
    return ""  # not reached


def _rich_console():
    """rich's console when rich is installed (the `status` extra); else plain text."""
    try:
        from rich.console import Console
    except ImportError:
        return None
    return Console(highlight=False)


def _local_url(config_file: str | None) -> str:
    """Where the daemon this configuration describes answers on this host."""
    from gpuwatch import config as config_mod

    try:
        cfg = config_mod.load(config_file)
        host, port = config_mod.parse_listen(cfg.listen)
    except (config_mod.ConfigError, ValueError) as exc:
        _fail(f"--config: {exc}")
    tls = False
    if cfg.web_config:
        from gpuwatch import webconfig

        try:
            tls = webconfig.load(cfg.web_config).tls is not None
        except webconfig.WebConfigError as exc:
            _fail(f"web_config: {exc}")
    # all interfaces: ask over loopback, in the family the daemon listens on
    host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    if ":" in host:
        host = f"[{host}]"
    return f"{'https' if tls else 'http'}://{host}:{port}"
