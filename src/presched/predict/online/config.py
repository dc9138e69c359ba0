"""`OnlineConfig`: how an `OnlineLearner` learns from the requests it served (`learn:` in a
gateway config; `presched serve --learn` turns it on with these defaults)."""

from __future__ import annotations

from typing import Optional

from pydantic import Field

from presched.config import Config


class OnlineConfig(Config):
    enabled: bool = Field(False, description="Learn from completed requests (recalibration, drift alarm, refits).")
    window: int = Field(500, ge=10, description="Completions per group kept for conformal recalibration of the quantiles.")
    min_group: int = Field(50, ge=1, description="A group (model, or model and tenant) with fewer completions uses the pooled offsets of all groups.")
    recalibrate_every: int = Field(25, ge=1, description="Recompute a group's offsets after this many new completions of it.")
    per_tenant: bool = Field(False, description="Calibrate per (model, tenant) instead of per model.")
    max_groups: int = Field(1000, ge=1, description="Calibration groups kept (each holds `window` scores per quantile level: ~50 KB at window 500, ~50 MB for 1000 groups); beyond it the group completed least recently is forgotten and its requests use the pooled offsets.")
    alarm_k: float = Field(0.25, gt=0, description="Drift alarm: CUSUM allowance k on the standardised PIT (standard deviations; half the smallest shift worth catching).")
    alarm_h: float = Field(18.0, gt=0, description="Drift alarm: CUSUM threshold h (1 false alarm in 100,000 simulated calibrated completions at k=0.25, h=18).")
    alarm_window: int = Field(200, ge=10, description="Drift alarm: completions in the rolling coverage window.")
    alarm_level: float = Field(0.9, gt=0, lt=1, description="Drift alarm: the quantile level whose rolling coverage is watched.")
    alarm_band: float = Field(0.1, gt=0, lt=1, description="Drift alarm: raise it when |coverage - level| exceeds this over a full window.")
    refit_every: int = Field(2000, ge=0, description="Longest interval between refits of the base model, in labelled completions (they come after min_refit, then twice as many each time, up to this; 0 = never refit).")
    refit_on_alarm: bool = Field(True, description="After a drift alarm, start the refit schedule over from the change (first refit min_refit completions after it, on what followed it).")
    min_refit: int = Field(250, ge=20, description="Fewest buffered completions a refit trains on, and the first refit interval.")
    holdout: int = Field(200, ge=10, description="The most recent completions a refit keeps out of training (at most a quarter of them), to restart the recalibration on.")
    buffer: int = Field(4000, ge=100, description="Most recent labelled completions kept for refits (bounded memory).")
    anchor_data: Optional[str] = Field(None, description="The original training data (generic schema, JSONL/CSV) whose rows are mixed into refits; none: refits train on recent traffic only.")
    anchor_rows: int = Field(2000, ge=0, description="Rows of the original training data mixed into each refit (0 = recent traffic only).")
    tenant_rate: float = Field(20.0, gt=0, description="Per tenant: labelled completions learned from per second (token bucket); the rest are counted and dropped.")
    tenant_burst: int = Field(200, ge=1, description="Per tenant: token-bucket burst of learned completions.")
    max_tenants: int = Field(10_000, ge=1, description="Tenants whose rate buckets are kept (least recently seen forgotten).")
    max_pending: int = Field(20_000, ge=100, description="Predictions remembered until their request completes (oldest forgotten).")
    state_dir: Optional[str] = Field(None, description="Folder for the learner's state (saved atomically; a restart resumes from it).")
    save_every: int = Field(500, ge=1, description="Save the state after this many learned completions (and after each refit).")
    seed: int = Field(0, description="Seed of the anchor-row sample.")
