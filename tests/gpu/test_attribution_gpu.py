"""Attribution on a real GPU: a CUDA process that NVML reports, with SLURM_JOB_ID in its
environment but in no Slurm cgroup, is not labelled with that job (anyone can set the
variable, and pages are routed by the label); `gpuwatch attribution` finds its GPU through
NVML and shows the variable as self-reported (skipped without a GPU)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests.gpu.test_nvml_gpu import ALLOCATOR
from tests.helpers import REPO, child_env, wait_until

pytestmark = pytest.mark.gpu


def test_a_self_reported_slurm_job_is_shown_but_never_a_label(daemon):
    pytest.importorskip("torch")
    if os.geteuid() != 0:
        pytest.skip("reading another process's environment needs root")
    env = {**os.environ, "SLURM_JOB_ID": "4242", "HF_TOKEN": "hf_must_not_leak"}
    child = subprocess.Popen([sys.executable, "-c", ALLOCATOR, "90"], stdout=subprocess.PIPE,
                             text=True, env=env)
    try:
        assert child.stdout.readline().startswith("allocated")
        d = daemon(env={"GPUWATCH_NVML_FAST_INTERVAL_SECONDS": "1"})
        pattern = re.compile(r'^gpuwatch_process_gpu_memory_used_bytes\{([^}]*pid="'
                             + str(child.pid) + r'"[^}]*)\}', re.M)

        def labels():
            m = pattern.search(d.metrics())
            return m and m.group(1)

        found = wait_until(labels, 30, what="the CUDA process in /metrics")
        assert 'slurm_job_id=""' in found
        assert 'namespace=""' in found and 'pod=""' in found
        state = d.state()
        assert state["sources"]["attribution"]["up"] is True
        assert "hf_must_not_leak" not in d.metrics() + json.dumps(state)
        # the CLI: NVML says which GPU the pid uses, the environment names the job
        res = subprocess.run([sys.executable, "-m", "gpuwatch", "attribution", str(child.pid)],
                             capture_output=True, text=True, env=child_env(), cwd=REPO,
                             timeout=60)
        assert res.returncode == 0, res.stderr
        doc = json.loads(res.stdout)
        assert doc["slurm_job_id"] is None and doc["slurm_job_id_self_reported"] == "4242"
        assert "environ-self-reported" in doc["source"]
        assert "hf_must_not_leak" not in res.stdout + res.stderr
    finally:
        child.kill()
        child.wait()
