"""Requests and the streams that make them: loaders, arrival processes, composition, the default."""

from presched.workload.request import InvalidRequestError, Request

__all__ = ["Request", "InvalidRequestError"]
