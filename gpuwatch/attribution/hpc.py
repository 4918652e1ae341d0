"""dcgm-exporter's HPC job-mapping directory: one file per GPU, named by its index, listing
the jobs (one per line) that run on it; the batch system's prolog/epilog writes them. A GPU
whose file names exactly one job gives that job to its processes."""

from __future__ import annotations

import os
import re

MAX_FILES = 256
MAX_FILE_BYTES = 4096
_JOB = re.compile(r"^[\w.+-]{1,64}$")


def read_job_mapping(directory: str) -> dict[int, list[str]]:
    """GPU index -> job ids; an absent directory or unreadable file is simply no mapping."""
    out: dict[int, list[str]] = {}
    try:
        names = sorted(os.listdir(directory))[:MAX_FILES * 4]
    except OSError:
        return out
    for name in names:
        if not name.isdigit() or len(out) >= MAX_FILES:
            continue
        path = os.path.join(directory, name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            if not os.path.isfile(path):
                continue
            data = os.read(fd, MAX_FILE_BYTES)
        except OSError:
            continue
        finally:
            os.close(fd)
        jobs = [line.strip() for line in data.decode("utf-8", "replace").splitlines()]
        out[int(name)] = [j for j in jobs if _JOB.match(j)]
    return out
