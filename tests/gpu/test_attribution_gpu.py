"""Attribution on a real GPU: a CUDA process that NVML reports, started as a Slurm step
would be (SLURM_JOB_ID in its environment), is labelled with its job on every process
series, and `gpuwatch attribution` finds its GPU through NVML (skipped without a GPU)."""

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


def test_nvml_process_is_labelled_with_its_slurm_job(daemon):
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
        assert 'slurm_job_id="4242"' in found
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
        assert doc["slurm_job_id"] == "4242" and "environ" in doc["source"]
    finally:
        child.kill()
        child.wait()
