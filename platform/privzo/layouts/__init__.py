"""Process layouts of a run, beneath the run pipeline (``privzo.run``), which dispatches to them.

``context`` is what every layout trains on and how the whole-model layouts (single, replica)
build it; ``record`` is the run's records, written the same way by every layout. The Ray Train
layouts (replica, zero3) still live in ``privzo.distributed``, at this same layer.
"""
