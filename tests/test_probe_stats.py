"""What the probe makes of torch's allocator data (plain data in, plain data out)."""

from __future__ import annotations

from types import SimpleNamespace

from gpuwatch.probe_agent.stats import AllocatorReader, summarize_segments

MIB = 1024 * 1024


def seg(device, *blocks):
    return {"device": device, "total_size": sum(b[0] for b in blocks),
            "blocks": [{"size": size, "state": state} for size, state in blocks]}


def test_free_blocks_are_summarized_per_device():
    out = summarize_segments([
        seg(0, (4 * MIB, "active_allocated"), (2 * MIB, "inactive"), (6 * MIB, "inactive")),
        seg(0, (20 * MIB, "inactive")),
        seg(1, (8 * MIB, "active_awaiting_free"), (1 * MIB, "inactive"), (0, "inactive")),
        seg(1, (2 * MIB, "active_allocated")),
    ])
    assert out[0] == {"free_blocks": 3, "total_free_bytes": 28 * MIB,
                      "largest_free_block_bytes": 20 * MIB,
                      "smallest_free_block_bytes": 2 * MIB, "segments": 2}
    assert out[1] == {"free_blocks": 1, "total_free_bytes": MIB,
                      "largest_free_block_bytes": MIB, "smallest_free_block_bytes": MIB,
                      "segments": 2}


class OldCuda:
    """A torch.cuda whose memory_snapshot() takes no include_traces (older torch)."""

    def __init__(self):
        self.snapshot_calls = 0
        self.stats = {
            0: {},  # never used
            1: {"reserved_bytes.all.current": 30 * MIB, "allocated_bytes.all.current": 10 * MIB,
                "inactive_split_bytes.all.current": 6 * MIB, "num_alloc_retries": 2,
                "num_ooms": 1, "reserved_bytes.all.peak": 30 * MIB},
        }

    def device_count(self):
        return 2

    def memory_stats(self, i):
        return self.stats[i]

    def memory_snapshot(self):
        self.snapshot_calls += 1
        return [seg(1, (10 * MIB, "active_allocated"), (6 * MIB, "inactive")),
                seg(1, (14 * MIB, "inactive"))]

    def get_device_properties(self, i):
        return SimpleNamespace(uuid=f"abcd-{i}")


def test_reader_reports_used_devices_only_and_copes_with_older_torch():
    cuda = OldCuda()
    reader = AllocatorReader(SimpleNamespace(cuda=cuda))
    [sample] = reader.read()
    assert sample == {
        "device": 1, "allocated_bytes": 10 * MIB, "reserved_bytes": 30 * MIB,
        "inactive_split_bytes": 6 * MIB, "num_alloc_retries": 2, "num_ooms": 1,
        "free_blocks": 2, "total_free_bytes": 20 * MIB, "largest_free_block_bytes": 14 * MIB,
        "smallest_free_block_bytes": 6 * MIB, "segments": 2, "gpu_uuid": "GPU-abcd-1",
    }
    reader.read()
    assert cuda.snapshot_calls == 2  # the fallback was remembered, not retried each time
    assert reader.used_devices() == [1]
    # a device used before but empty now: zeros from a real snapshot, no smallest block
    cuda.stats[1] = {"reserved_bytes.all.current": 0, "reserved_bytes.all.allocated": 30 * MIB,
                     "allocated_bytes.all.current": 0}
    cuda.memory_snapshot = lambda: []
    [empty] = reader.read()
    assert (empty["reserved_bytes"], empty["free_blocks"], empty["total_free_bytes"]) == (0, 0, 0)
    assert "smallest_free_block_bytes" not in empty
