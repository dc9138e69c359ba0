"""Routers: which instance gets a request. Chosen by name from `ROUTERS`."""

from presched.schedule.routers import least_work, p2c, prefix, round_robin, short_long  # noqa: F401 (registers)
from presched.schedule.routers.interface import ROUTERS, InstanceView, Router

__all__ = ["ROUTERS", "Router", "InstanceView"]
