"""Per-request records and the aggregates every driver reports (vLLM bench serve names)."""

from presched.metrics.records import RecordTable
from presched.metrics.summary import GoodputSLO, jain_index, summarize, weighted_percentile

__all__ = ["RecordTable", "GoodputSLO", "summarize", "jain_index", "weighted_percentile"]
