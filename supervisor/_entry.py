"""The ``supervisor`` command's first code: it holds the process's signals before anything heavy is imported.

Between the interpreter's start and the moment a command knows what a signal means to it, SIGTERM, SIGINT and SIGHUP
would do their defaults: SIGHUP (``serve``'s token reload) and SIGTERM would end the process without a line, SIGINT
with a ``KeyboardInterrupt`` traceback. The imports alone take most of a second. Held here from the first line, each
is noted and handed on with ``HeldSignals``: ``serve``'s signal watcher takes them (``take``) and acts on each as if
it came then; any other command gives them back (``release``), acted on as if they came once it could hear them.

Only the interpreter's own start (some tens of milliseconds, before any of our code runs) is left to the defaults.
This module imports nothing but ``signal``: ``import supervisor`` itself loads nothing (its names load on first use).
The top layer: it imports the command line, which never imports it.
"""

from __future__ import annotations

import signal
from types import FrameType

HELD = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class HeldSignals:
    """SIGTERM, SIGINT and SIGHUP, noted instead of acted on from ``hold()`` until a command takes or releases them
    (the process's main thread only, as every signal handler)."""

    def __init__(self) -> None:
        self._noted: list[int] = []
        self._holding = False

    def hold(self) -> HeldSignals:
        self._holding = True
        for signum in HELD:
            signal.signal(signum, self._note)
        return self

    def _note(self, signum: int, frame: FrameType | None) -> None:
        if self._holding:
            self._noted.append(signum)

    def take(self) -> list[int]:
        """The signals noted so far, oldest first, now the caller's. They keep being noted until a handler of the
        caller's replaces ours (``trio.open_signal_receiver``): a caller installs its own first, then takes these."""
        taken, self._noted = self._noted, []
        return taken

    def release(self) -> None:
        """Give SIGTERM, SIGINT and SIGHUP back their defaults, and deliver what was noted meanwhile, as if it came
        now: for a command that does not keep them (every one but ``serve``)."""
        if not self._holding:
            return
        self._holding = False
        noted, self._noted = self._noted, []
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        for signum in noted:
            signal.raise_signal(signum)


def main() -> int:
    """The ``supervisor`` console script (and ``python -m supervisor``)."""
    held = HeldSignals().hold()
    from .cli import main as cli_main

    return cli_main(held=held)
