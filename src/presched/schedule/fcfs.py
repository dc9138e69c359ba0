"""FCFS: first come, first served — vLLM v1's default policy.

Order: arrival time. KV-pressure victim: the running request that arrived last (ties: the most
recently admitted). Never preempts to admit. Inputs: arrival times only. Config: none.
"""

from __future__ import annotations

from presched.schedule.interface import Policy
from presched.schedule.registry import POLICIES


@POLICIES.register("fcfs")
class FCFS(Policy):
    name = "fcfs"
