"""Settings of process attribution (pods, containers, Slurm jobs)."""

from __future__ import annotations

from typing import Annotated

import msgspec

from gpuwatch.attribution.podresources import DEFAULT_SOCKET


class AttributionConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    enabled: bool = True
    # The kubelet's pod-resources socket; "" turns the Kubernetes join off.
    podresources_socket: str = DEFAULT_SOCKET
    # Pods and jobs change slowly: re-read them on this interval, not every tick (a new
    # process is looked up at its first sample, at most every min_refresh_seconds).
    refresh_seconds: Annotated[float, msgspec.Meta(gt=0)] = 60.0
    min_refresh_seconds: Annotated[float, msgspec.Meta(ge=0)] = 5.0
    timeout_seconds: Annotated[float, msgspec.Meta(gt=0, le=30)] = 2.0
    # SLURM_JOB_ID from /proc/<pid>/environ when the cgroup names no job (root only).
    slurm_environ: bool = True
    # dcgm-exporter's HPC job-mapping directory (files named by GPU index list its jobs).
    hpc_job_mapping_dir: str = ""
