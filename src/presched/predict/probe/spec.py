"""`FeatureSpec`: what a hidden-state feature vector is (numpy-free, torch-free).

A probe fitted on layer 15 of SmolLM2 mean-pooled without one sink token reads nothing useful
from layer 20, from another model, or from an entropy-weighted pool: every feature source
(`features.PromptFeaturizer`, the engine hook) states its spec, probe files store the spec they
were fitted on, and `check` refuses any other with a message naming the differing fields.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Pooling = Literal["mean", "egtp", "step", "answer"]
Role = Literal["served", "draft"]


class FeatureSpec(BaseModel):
    """The source of a pooled prompt-state vector."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    model: str = Field(description="the served model whose hidden states these are (its folder name)")
    layer: int = Field(ge=0, description="decoder layer whose output (the residual stream) is pooled")
    hidden: int = Field(ge=1, description="hidden size = vector length")
    pooling: Pooling = Field(description="mean: mean without the sink tokens; egtp: entropy-weighted; step: no pooling, the state at the last token read (probe-refine); answer: the mean of the states at generated tokens 1..g (probe-refine with answer on)")
    sink: int = Field(default=1, ge=0, description="leading prompt positions left out of the pool")
    role: Role = Field(default="served", description="served: the served model's own states; draft: a speculative-decoding draft model's (OUTLETS; `model` is then the draft model)")

    def key(self) -> str:
        """The `Request.metadata` key under which a feature source attaches such a vector."""
        role = "draft:" if self.role == "draft" else ""
        return f"hidden:{role}{self.model}:L{self.layer}:{self.pooling}:s{self.sink}"

    def check(self, other: "FeatureSpec", where: str = "features") -> None:
        """ValueError naming every field in which `other` differs from this spec."""
        diff = [f"{k}: fitted on {getattr(self, k)!r}, got {getattr(other, k)!r}"
                for k in type(self).model_fields if getattr(self, k) != getattr(other, k)]  # fmt: skip
        if diff:
            raise ValueError(f"{where}: this probe reads other hidden states ({'; '.join(diff)}); "
                             "refit it on features of this model and layer")  # fmt: skip

    @classmethod
    def parse(cls, value: Any, where: str = "spec") -> "FeatureSpec":
        try:
            return cls.model_validate(value)
        except Exception as e:  # pydantic's message names the field
            raise ValueError(f"{where}: not a feature spec: {e}") from None
