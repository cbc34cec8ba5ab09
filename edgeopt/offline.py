"""Keep the libraries edgeopt drives off the network.

OpenVINO's converter and NNCF send usage telemetry (``openvino_telemetry``) unless the user has declined it in a
file in their home folder or the process runs in CI. edgeopt runs in build pipelines and on machines without a
network, where each event forks a process to post it; on this project's hosts such a fork deadlocked (an import
lock held by another thread) and the parent waited for it at exit, so the run never ended. edgeopt declines the
telemetry for its own process instead, as CI does, and leaves the user's consent file alone.
"""

from __future__ import annotations


def decline_telemetry() -> None:
    """Make every ``openvino_telemetry`` consent check in this process answer "declined" (no-op without it)."""
    try:
        from openvino_telemetry.utils.opt_in_checker import ConsentCheckResult, OptInChecker
    except ImportError:
        return

    def declined(self, enable_opt_in_dialog=False, disable_in_ci=False):
        return ConsentCheckResult.DECLINED

    OptInChecker.check = declined
