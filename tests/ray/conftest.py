"""The Ray suite (`make ray-test`, marker `ray`): one local Ray cluster of its own for the whole suite, declaring 2
GPUs this machine does not have (how Ray's placement is tried without them), stopped at the end; no test touches
a cluster it did not start."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("ray", reason="the Ray suite needs the ray extra (make ray-test installs it)")

from resources.ray_cluster import local_ray_cluster, session_processes

CLUSTER_GPUS = 2


@pytest.fixture(scope="session")
def ray_address() -> Iterator[str]:
    with local_ray_cluster(num_cpus=2, num_gpus=CLUSTER_GPUS) as head:
        yield head.address
    assert session_processes(head.session) == [], "the suite's Ray cluster left processes behind"
