"""Scheduling policies behind one interface, chosen by name from `POLICIES`."""

from presched.schedule import fcfs, oracle, sjf, srpt, gittins, rank, aging, hrrn, mlfq, vtc, kv_admission, fallback, slo  # noqa: F401  (registers the built-in policies)
from presched.schedule.interface import Policy, SeqView
from presched.schedule.queue import WaitingQueue
from presched.schedule.registry import POLICIES

__all__ = ["Policy", "SeqView", "WaitingQueue", "POLICIES"]
