"""The zeroth-order engine: directions, sweeps, the step, estimators and trajectories."""
