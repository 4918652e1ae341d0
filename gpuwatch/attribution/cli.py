"""`gpuwatch attribution PID...`: what gpuwatch attributes to each process, one JSON object
per pid, with the same code path as the daemon."""

from __future__ import annotations

import json
import sys

import click
import msgspec

from gpuwatch.attribution.procfs import MAX_PID


def _misuse(flag: str, reason: str):
    """One line naming the flag and the reason, exit status 2."""
    click.echo(f"gpuwatch attribution: {flag}: {reason}", err=True)
    sys.exit(2)


def _pid(text: str, flag: str = "PID") -> int:
    if not text.isdigit() or not 0 < int(text) <= MAX_PID:
        _misuse(flag, f"{text[:40]!r} is not a pid (1..{MAX_PID})")
    return int(text)


def _pid_gpus(values: tuple[str, ...]) -> dict[int, set[str]]:
    out: dict[int, set[str]] = {}
    for value in values:
        pid, sep, uuid = value.partition("=")
        if not sep or not uuid or len(uuid) > 128:
            _misuse("--pid-gpu", f"{value[:60]!r} is not PID=GPU_UUID")
        out.setdefault(_pid(pid, "--pid-gpu"), set()).add(uuid)
    return out


def _nvml_pid_gpus() -> tuple[dict[int, set[str]], dict[str, int]]:
    """The GPUs each process uses, as the daemon sees them, and GPU indices by uuid; empty
    without a driver."""
    from gpuwatch.sources.base import BackendUnavailable
    from gpuwatch.sources.nvml import NvmlBackend

    backend = NvmlBackend(xid_events=False)
    try:
        backend.open()
    except BackendUnavailable:
        return {}, {}
    try:
        out: dict[int, set[str]] = {}
        gpus = backend.sample(0.0)
        for g in gpus:
            for p in g.processes:
                out.setdefault(p.pid, set()).add(g.uuid)
        return out, {g.uuid: g.index for g in gpus}
    except Exception:  # a CLI lookup: no GPU view is still an answer
        return {}, {}
    finally:
        backend.close()


@click.command()
@click.argument("pids", nargs=-1, required=True)
@click.option("--config", "config_file", type=click.Path(dir_okay=False),
              help="TOML configuration file (proc_root, [attribution]).")
@click.option("--proc-root", type=click.Path(file_okay=False),
              help="The /proc tree to read (default: proc_root from the configuration).")
@click.option("--podresources-socket", type=click.Path(dir_okay=False),
              help="The kubelet's pod-resources socket ('' to skip Kubernetes).")
@click.option("--pid-gpu", multiple=True, metavar="PID=UUID",
              help="A GPU the pid uses, where NVML cannot tell (another host's /proc tree).")
def attribution(pids, config_file, proc_root, podresources_socket, pid_gpu) -> None:
    """Print namespace, pod, container, Slurm job or systemd unit of each PID."""
    from gpuwatch import config as config_mod
    from gpuwatch.attribution.resolver import ProcHost, resolve

    wanted = [_pid(p) for p in pids]
    given = _pid_gpus(pid_gpu)
    overrides: dict = {"proc_root": proc_root}
    if podresources_socket is not None:
        overrides["attribution"] = {"podresources_socket": podresources_socket}
    try:
        cfg = config_mod.load(config_file, overrides=overrides)
    except config_mod.ConfigError as exc:
        _misuse("--config", f"configuration error: {exc}")
    a = cfg.attribution
    seen, index = ({}, {}) if given else _nvml_pid_gpus()
    pid_gpus = {pid: given.get(pid) or seen.get(pid, set()) for pid in wanted}
    host = ProcHost.from_config(cfg)
    res = resolve(host, pid_gpus, slurm_environ=a.slurm_environ, gpu_index=index)
    for why in res.problems.values():
        click.echo(f"gpuwatch: {why}", err=True)
    for pid in wanted:
        # every field, null when unknown (the struct has no omit_defaults)
        click.echo(json.dumps(msgspec.to_builtins(res.attributions[pid])))
