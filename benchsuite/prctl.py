"""Linux process controls that keep a suite from leaving orphans (no-ops on other systems).

torchrun starts each rank in its own session, so signals to the launcher's process group
never reach them: instead every process asks the kernel to signal it when its parent dies,
and the launcher adopts (and reaps) any rank whose torchrun died first.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from typing import Callable

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


def _prctl() -> Callable | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def die_with_parent(sig: signal.Signals) -> None:
    """This process gets `sig` when its parent exits (a rank takes SIGKILL when torchrun dies)."""
    prctl = _prctl()
    if prctl is not None:
        prctl(PR_SET_PDEATHSIG, int(sig))


def become_subreaper() -> None:
    """Orphaned descendants are re-parented to this process, which can then reap them."""
    prctl = _prctl()
    if prctl is not None:
        prctl(PR_SET_CHILD_SUBREAPER, 1)


def die_with_this_process(sig: signal.Signals) -> Callable[[], None] | None:
    """A preexec_fn for a child: `sig` when this process dies, even by SIGKILL. prctl is looked up
    here, before the fork, so the child only makes the call."""
    prctl = _prctl()
    if prctl is None:
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, int(sig))
        if os.getppid() != parent:  # the parent died between fork and prctl
            os.kill(os.getpid(), signal.SIGKILL)

    return preexec
