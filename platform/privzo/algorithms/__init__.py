"""Training algorithms, beneath the run pipeline: a registry and one loop that drives them all.

- ``registry``: each algorithm's family, privacy, mechanisms, layouts, views, trajectory, checks
  and stepper factory (see its docstring);
- ``loop``: ``TrainingLoop``, the windows, privacy booking, hooks and metrics of every run;
- ``stepper``: the interface a stepper implements (start, step, finish);
- ``zeroth_order``: DPZero / DP-ZO / MeZO's stepper; the baselines' steppers (first-order with
  Opacus, DPGD-0th) live in ``privzo.baselines``, at this same layer.

This package's ``__init__`` imports nothing, so a baseline may import ``algorithms.stepper``
while the registry imports the baselines.
"""
