#!/usr/bin/env python3
"""Real NVIDIA Triton Inference Server (tritonserver binary bundled in the PyPI
wheel nvidia-pytriton==0.7.0) serving two trivial CPU Python models, with the
Prometheus metrics endpoint enabled.  Everything binds to 127.0.0.1.

    pip install nvidia-pytriton==0.7.0
    python server.py            # HTTP :8000, gRPC :8001, metrics :8002

Models:
  * "scale"  - y = 2*x (float32 [-1, 4]), dynamic batching (max_batch_size 8),
               sleeps 5 ms per batch so queue / compute times are non-zero.
  * "echo_text" - BYTES in -> BYTES out (upper-cased), no batching.
               Input "fail" raises -> counted in
               nv_inference_request_failure{reason="BACKEND"}.
"""
import logging
import os
import pathlib
import signal
import time

import numpy as np
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig, TritonSecurityConfig

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
LOG = logging.getLogger("triton-demo")

HTTP_PORT = int(os.environ.get("TRITON_HTTP_PORT", "8000"))
GRPC_PORT = int(os.environ.get("TRITON_GRPC_PORT", "8001"))
METRICS_PORT = int(os.environ.get("TRITON_METRICS_PORT", "8002"))
WORKSPACE = pathlib.Path(os.environ.get("TRITON_WORKSPACE", "/tmp/gw-engines/triton/workspace"))


@batch
def scale_fn(x):
    time.sleep(0.005)
    return {"y": (x * 2.0).astype(np.float32)}


def echo_text_fn(requests):
    out = []
    for req in requests:
        t = req["text"]
        if t.size and t.flat[0] in (b"fail", "fail"):
            raise ValueError("text == 'fail' -> deliberate failure for metrics testing")
        out.append({"upper": np.char.upper(t.astype(str)).astype(np.bytes_)})
    return out


def main():
    cfg = TritonConfig(
        http_address="127.0.0.1", http_port=HTTP_PORT,
        grpc_address="127.0.0.1", grpc_port=GRPC_PORT,
        metrics_address="127.0.0.1", metrics_port=METRICS_PORT,
        allow_metrics=True, allow_cpu_metrics=True, allow_gpu_metrics=False,
        metrics_interval_ms=1000,
        # summary (quantile) latency series in addition to the *_us counters
        metrics_config=["summary_latencies=true"],
        log_verbose=0,
        # bound shutdown: a model occasionally fails to unload and Triton waits 30 s by default
        exit_timeout_secs=5,
    )
    # the model-repository API (load, unload) needs this token in the triton-access-token
    # header; the tests that unload models know it
    security = TritonSecurityConfig(access_token=os.environ.get("TRITON_ACCESS_TOKEN") or None)
    with Triton(config=cfg, workspace=WORKSPACE, security_config=security) as triton:
        triton.bind(
            model_name="scale",
            infer_func=scale_fn,
            inputs=[Tensor(name="x", dtype=np.float32, shape=(4,))],
            outputs=[Tensor(name="y", dtype=np.float32, shape=(4,))],
            config=ModelConfig(max_batch_size=8,
                               batcher=DynamicBatcher(max_queue_delay_microseconds=2000)),
            strict=True,
        )
        triton.bind(
            model_name="echo_text",
            infer_func=echo_text_fn,
            inputs=[Tensor(name="text", dtype=bytes, shape=(1,))],
            outputs=[Tensor(name="upper", dtype=bytes, shape=(1,))],
            config=ModelConfig(batching=False),
        )
        LOG.info("serving: http=%s grpc=%s metrics=%s", HTTP_PORT, GRPC_PORT, METRICS_PORT)
        triton.serve()  # blocks until SIGINT/SIGTERM


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    main()
