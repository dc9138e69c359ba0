"""Policies by name: `POLICIES.create("srpt")`."""

from presched.registry import Registry
from presched.schedule.interface import Policy

POLICIES: Registry[Policy] = Registry("policy")
