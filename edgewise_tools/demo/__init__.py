"""`edgewise demo`: the whole hybrid on one machine, with a report.

A local cloud (gateway + workers with the reference cloud model, as processes),
an edge daemon (reference INT8 edge model) on generated camera streams with
exact ground truth, escalation over gRPC or MQTT, a worker killed mid-run, and
an HTML report of what happened. This is application wiring of both tiers, so
it starts them as processes (``cloud.local`` is imported lazily, the daemon runs
as ``edgewise edge run``); nothing here is imported by ``edge`` or ``cloud``.
"""

from __future__ import annotations

from edgewise_tools.demo.running import DemoConfig, run_demo

__all__ = ["DemoConfig", "run_demo"]
