"""torch's DistributedDataParallel around a model parallelize returned: refused, naming why.

Such a model already spreads over its ranks (a sharded model's mesh, a pipeline's stages and
their replicas) and all-reduces its own gradients. DDP around it would broadcast rank 0's
parameter blocks, or rank 0's stage, over the other ranks' (a silent corruption where the
shapes agree) and reduce the gradients a second time. The first thing DDP's constructor
reads from the module it wraps is `_ddp_params_and_buffers_to_ignore` (via hasattr, which
lets any error but AttributeError through), before it checks or broadcasts anything: that
read raises instead."""

from __future__ import annotations


class RefusesDDP:
    """Mixin of the models parallelize returns: `_ddp_refusal()` says what the model is and
    over how many ranks it runs (with one rank, DDP does nothing and is let be)."""

    def _ddp_refusal(self) -> tuple[str, str, int]:
        """(what the model is, how it spreads over its ranks, how many ranks)."""
        raise NotImplementedError

    @property
    def _ddp_params_and_buffers_to_ignore(self) -> list[str]:
        what, how, ranks = self._ddp_refusal()
        if ranks <= 1:
            return []
        raise RuntimeError(
            f"torch_plugin: DistributedDataParallel cannot wrap this {what}: it already {how} "
            f"over its {ranks} ranks and all-reduces its own gradients. DDP "
            "would broadcast rank 0's parameters over the other ranks' (which hold other "
            "blocks or another stage) and reduce the gradients a second time. Use the model "
            "parallelize returned as it is (drop the DistributedDataParallel wrapper)."
        )
