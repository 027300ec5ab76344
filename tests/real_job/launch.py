"""Start a real job with torch's launcher under a hard timeout; the tests' one way to do it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_real_job(worker: str, out: str, world: int, timeout_s: float) -> str:
    """Run ``tests/real_job/<worker>`` on ``world`` gloo processes, failing the test on a hang.

    ``torch.distributed.run --standalone`` picks free ports itself. The job runs in its own
    process group, killed whole (the launcher and every worker it started) past the timeout.

    Args:
        worker: the worker script's file name in tests/real_job/.
        out: the folder passed to the worker for its outputs.
        world: the number of processes.
        timeout_s: seconds before the whole job is killed and the test fails.

    Returns:
        ``out``, once the job exited with status 0 (else the test fails with its log's tail).
    """
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={world}", os.path.join(ROOT, "tests", "real_job", worker), out]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        log, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher and every worker it started
        log, _ = proc.communicate()
        pytest.fail(f"the real job hung: killed after {timeout_s} s\n{log[-4000:]}")
    assert proc.returncode == 0, log[-6000:]
    return out
