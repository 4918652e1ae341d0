"""Whose workload is a GPU process: Kubernetes namespace/pod/container (cgroup + the
kubelet's pod-resources API), Slurm job (cgroup, or SLURM_JOB_ID), or systemd unit.

Sources do the I/O (procfs, podresources); join and cgroup are pure; the daemon applies a
cached result to every sample (source); `gpuwatch attribution` prints it (cli).
"""
