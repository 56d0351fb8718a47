"""Deterministic cluster simulation of the real Raft core and log, with fault injection."""

from .cluster import InvariantViolation, SimConfig, Simulation, run_seed

__all__ = ["InvariantViolation", "SimConfig", "Simulation", "run_seed"]
