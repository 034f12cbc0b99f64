import os
import sys
import uuid

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import zenoh_cuda_shm as zcs  # noqa: E402
from zcs_testing import free_port, zenoh_config  # noqa: E402


@pytest.fixture
def key():
    """A key no other test (or concurrent run) uses."""
    return f"zcspy{uuid.uuid4().hex[:12]}/t"


@pytest.fixture
def port():
    return free_port()


@pytest.fixture
def host_session(port, key):
    """A host-memory session listening on `port` (peers connect to it)."""
    s = zcs.open({"device": "host"}, zenoh=zenoh_config(listen=port, block_prefix=key.split("/")[0]))
    yield s
    s.close()


def pytest_terminal_summary(terminalreporter):
    from zcs_testing import SKIPPED_LINES
    for line in SKIPPED_LINES:
        terminalreporter.write_line(line)
