"""The daemon's own process image. `gpuwatch run` checks its flags and its configuration, then
replaces itself (exec: the same pid, environment and standard streams) with
`python -m gpuwatch.serve`, which loads that configuration again and serves. The command line
(click, and the code of every other command) then never sits in the daemon's memory for its
whole life: about 1.1 MiB of resident memory, a daemon's on every GPU host.

What `run` parsed travels in one environment variable, removed again before anything else
runs, so the daemon's children (exec hooks) never see it.
"""

from __future__ import annotations

import logging
import os
import sys

import msgspec

from gpuwatch import config as config_mod
from gpuwatch import exitcodes
from gpuwatch.lean_asyncio import asyncio  # before anything else imports asyncio

SPEC = "_GPUWATCH_RUN"  # not GPUWATCH_*: it is no setting
# What the exec runs (`python -m MODULE`): a test harness that patches the process (a fake
# NVML) names itself and calls main(); one that cannot be run again serves IN_PROCESS.
MODULE = "gpuwatch.serve"
IN_PROCESS = False


def start(config_file: str | None, overrides: dict) -> None:
    """Serve, in a fresh interpreter that replaces this process; returns only where that
    cannot be (then: in this process)."""
    executable = sys.executable
    # from a zip archive (or with no interpreter to run) `-m` would not find this package
    if IN_PROCESS or not executable or not os.path.isfile(__file__):
        sys.exit(serve(config_file, overrides))
    spec = {"config_file": config_file, "overrides": overrides}
    env = {**os.environ, SPEC: msgspec.json.encode(spec).decode()}
    argv = [executable, *_interpreter_flags(), "-m", MODULE]
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(executable, argv, env)
    except OSError as exc:  # the interpreter cannot be run again: serve here
        print(f"gpuwatch: serving in the command line's process ({exc.strerror})",
              file=sys.stderr)
        sys.exit(serve(config_file, overrides))


def _interpreter_flags() -> list[str]:
    """-X, -W, -I and the like as this interpreter was started with (as multiprocessing
    passes them on)."""
    import subprocess

    try:
        return subprocess._args_from_interpreter_flags()
    except AttributeError:  # pragma: no cover - a Python without it
        return []


class StartError(Exception):
    """One line for stderr; exit status 2 (a misuse: a restart does not help)."""


def checked(config_file: str | None, overrides: dict):
    """The configuration, its web config and the probe directory's warning (or None), each
    file it names read and checked. Raises StartError. `run` calls it before the exec, to fail
    in the command line's own words; the served process again, since files may change."""
    try:
        cfg = config_mod.load(config_file, overrides=overrides)
    except config_mod.ConfigError as exc:
        raise StartError(config_error_line(exc)) from None
    from gpuwatch.startup import SetupError, validate_files

    try:
        web = validate_files(cfg)
    except SetupError as exc:
        raise StartError(config_error_line(exc)) from None
    warning = None
    if cfg.probe.enabled and not cfg.simulate:
        from gpuwatch.probe_channel.config import resolve_dir
        from gpuwatch.startup import probe_dir_verdict

        probe = probe_dir_verdict(resolve_dir(cfg.probe.dir))
        if probe.status == "fail":
            raise StartError(f"gpuwatch: probe directory: {probe.detail} ({probe.fix})")
        if probe.status == "warn":
            warning = f"probe directory: {probe.detail}"
    return cfg, web, warning


def serve(config_file: str | None, overrides: dict) -> int:
    """Check, then serve until stopped; the daemon's exit status."""
    try:
        cfg, web, warning = checked(config_file, overrides)
    except StartError as exc:
        print(exc, file=sys.stderr)
        return exitcodes.USAGE
    setup_logging(cfg.log_level)
    if warning:
        logging.getLogger("gpuwatch").warning("%s", warning)
    from gpuwatch.daemon import Daemon
    from gpuwatch.lifecycle import fewer_malloc_arenas

    fewer_malloc_arenas()
    daemon = Daemon(cfg, config_path=config_file, overrides=overrides, web=web)
    return asyncio.run(daemon.run())


def config_error_line(exc: Exception) -> str:
    from gpuwatch.redact import scrub_text

    return f"gpuwatch: configuration error: {scrub_text(str(exc))}"


def setup_logging(level: str) -> None:
    from gpuwatch.logfmt import LogFormatter

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(LogFormatter())
    logging.basicConfig(level=getattr(logging, level.upper()), handlers=[handler])
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    from gpuwatch.redact import install_log_filter

    install_log_filter()  # no handler writes a configured secret or URL credentials


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def internal_error(exc: BaseException) -> str:
    """A bug, as one line to report rather than a traceback to scroll."""
    return f"gpuwatch: internal error: {type(exc).__name__}: {one_line(str(exc))[:500]}"


def main() -> None:
    spec = os.environ.pop(SPEC, None)
    if spec is None:
        print("gpuwatch.serve: started by `gpuwatch run`, not by hand", file=sys.stderr)
        sys.exit(exitcodes.USAGE)
    try:
        args = msgspec.json.decode(spec)  # msgspec, not json: the daemon has it
        sys.exit(serve(args["config_file"], args["overrides"]))
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as exc:
        print(internal_error(exc), file=sys.stderr)
        sys.exit(exitcodes.FAILURE)


if __name__ == "__main__":
    main()
