"""SIMULATOR, CPU profiles only: the host's load as the simulated engines and trainer meet it.

The control plane's CPU demand is its idle floor, its rate while engines step, and an exponential
average (time constant `window_s`) of the CPU its work costs (`cpu_work`: per completion, per
version); with the trainer's share while it computes and other users' background it is the
floating demand that `HostCpuContention` turns into a stretch of an engine's step or of the
trainer's compute (docs/simulator.md, "Host-CPU contention"). The driver reports the work and the
trainer's state; the engines read `engine_stretch` when they plan their next segment.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from asyncdapo.tools.simulate.clock import VirtualClock
from asyncdapo.tools.simulate.profile import HostCpuContention


class HostLoad:
    def __init__(self, host: HostCpuContention, clock: VirtualClock, busy_engines: Callable[[], int]) -> None:
        self.host = host
        self.clock = clock
        self.busy_engines = busy_engines  # engines stepping now
        self.training = False  # the trainer computes (not the weight fan-out)
        self._rate = 0.0  # control plane's CPU demand (cores), exponential average
        self._t = 0.0

    def control_cores(self, busy: int | None = None) -> float:
        """The control plane's CPU demand now (cores): its idle floor, its rate while engines step
        (`busy`: engines stepping, read when not given), and its impulses decayed over window_s."""
        h = self.host
        if busy is None:
            busy = self.busy_engines() if h.control_rollout_cores else 0
        return h.control_idle_cores + (h.control_rollout_cores if busy else 0.0) + self._impulses()

    def _impulses(self) -> float:
        """The control plane's work impulses, decayed to now."""
        now = self.clock.now
        if now > self._t:
            self._rate *= math.exp(-(now - self._t) / self.host.window_s)
            self._t = now
        return self._rate

    def cpu_work(self, cpu_s: float) -> None:
        """`cpu_s` of control-plane CPU spent about now."""
        if cpu_s > 0:
            self._rate = self._impulses() + cpu_s / self.host.window_s

    def floating_cores(self, busy: int | None = None) -> float:
        """The floating work's CPU demand (cores): what the trainer's share is decided on."""
        h = self.host
        return self.control_cores(busy) + h.background_cores + (h.trainer_cores if self.training else 0.0)

    def engine_stretch(self) -> float:
        """The engines meet the CPU the floating work gets, not its demand: the trainer counts with
        what its stretch leaves it (`trainer_used_cores`), as in the calibration's CPU samples."""
        h, busy = self.host, self.busy_engines()
        used = self.control_cores(busy) + h.background_cores
        if self.training:
            used += h.trainer_used_cores(self.floating_cores(busy), busy)
        return h.stretch(used, max(1, busy))

    def trainer_stretch(self) -> float:
        busy = self.busy_engines()
        return self.host.trainer_stretch(self.floating_cores(busy), busy)
