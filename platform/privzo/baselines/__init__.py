"""Baselines DPZero is compared against, run through the same pipeline and run contract.

- ``first_order``: back-propagation. ``dpsgd`` (Opacus: Poisson sampling, per-example clipping,
  Gaussian noise; DP-SGD / DP-LoRA / DP-BiTFiT by the PEFT view) and ``adamw`` (non-private).
- ``dpgd``: ``dpgd-0th``, DPZero's naive zeroth-order baseline with d-dimensional noise.
"""
