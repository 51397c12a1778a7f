"""Scale-out: Ray Train workers holding replicas, or DeepSpeed ZeRO-3 ranks holding partitions.

A zeroth-order step needs only forward passes, and data-parallel workers exchange only a few
scalars per step (the clipped sum, the count and the noise: one small fp64 all-reduce); every
worker then applies the same (seed, g), so the replicas never diverge.

The ``replica`` and ``zero3`` layouts (``privzo.layouts``, which names and describes every
layout) run on this package: the layout's checks, the launcher and the worker, the all-reduce,
each worker's share of a batch, checkpoints across launches, ZeRO-3 loading and a cluster's
storage.
"""
