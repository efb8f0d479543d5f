"""A DAS store rebuild staged off the critical path: started when a step's rollouts are final, installed
at the lockstep update that carries the new policy version.

In a sync RL step the rollouts are final when generation ends, and the policy then trains for a
while; the engine process is idle. :class:`StagedRebuild` runs ``RolloutStore.rebuild`` on a
background thread during that time. The update that installs the version only waits for whatever
is left of it (the critical-path cost) and advances the drafter's version.

Exactness. From the moment a rebuild is staged until it is installed, the store holds neither the
old version's content nor (yet) the new one's as far as the lockstep is concerned: the proposer
neither reads nor writes it (``fenced``) and drafts from each request's own tokens only, so no
draft ever comes from a store whose version was not pushed. Installing checks the version: an
update for another version is refused with an error naming both, the drafter's version does not
advance, and the engine's staleness check then refuses to generate.

More rollouts for the version already staged (a step whose generation ends more than once before
its update, e.g. NeMo-RL's dynamic sampling) are appended: a second rebuild for the same version
runs after the first (``after``), and the update installs both or neither.

The arctic-inference calls hold the GIL (its nanobind bindings do not release it), so the thread
overlaps the trainer and idle time, not Python work in the same process: in an async pipeline it
shares the engine process's GIL with generation.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable


class StagedRebuild:
    """One background rebuild of the store for `version` (see module docstring)."""

    def __init__(self, version: int, work: Callable[[], int], after: StagedRebuild | None = None):
        self.version = int(version)
        if after is not None and after.version != self.version:
            raise ValueError(f"a rebuild for version {self.version} cannot follow one for version {after.version}")
        self.added: int | None = None
        self.error: BaseException | None = None
        self.busy_s = 0.0  # wall seconds the rebuild (and the ones it follows) took on their threads
        self.thread_cpu_s = 0.0  # CPU seconds of the rebuild threads
        self._work = work
        self._after = after
        self._thread = threading.Thread(target=self._run, name=f"das-rebuild-v{self.version}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        before = self._after
        if before is not None:  # the store is written by one thread at a time, in staging order
            before.wait()
            self.busy_s, self.thread_cpu_s, self.error = before.busy_s, before.thread_cpu_s, before.error
            if self.error is not None:
                return
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            self.added = int(self._work()) + ((before.added or 0) if before is not None else 0)
        except BaseException as e:  # noqa: BLE001 - handed to the update that installs this version
            self.error = e
        finally:
            self.busy_s += time.perf_counter() - t0
            self.thread_cpu_s += time.thread_time() - c0

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the rebuild finished (or `timeout` seconds passed); returns whether it finished."""
        self._thread.join(timeout)
        return self.done
