"""A heavy stage that hangs (tests/integration/test_time_limits.py): sampling that saved its first shard starts a
worker process, as vLLM's engine does, and blocks forever, the worker with it. Only where no shard was saved before:
the retry finds the shard, resumes after it, and finishes."""

from __future__ import annotations

import subprocess
import sys
import threading

HUNG_WORKER = "import threading; threading.Event().wait()"


def hang_after_first_shard(write):
    """`SampleShards.write`, hanging after the first shard of a work dir."""

    def write_then_hang(shards, table) -> None:
        first = not list(shards.directory.glob("shard-*.parquet"))
        write(shards, table)
        if first:
            subprocess.Popen([sys.executable, "-c", HUNG_WORKER])
            threading.Event().wait()

    return write_then_hang
