"""Deterministic cluster simulation of the real Raft core and log, with fault injection
(pluggable injectors: `laminar.sim.faults`)."""

from .cluster import InvariantViolation, SimConfig, Simulation, run_seed
from .faults import FaultInjector

__all__ = ["FaultInjector", "InvariantViolation", "SimConfig", "Simulation", "run_seed"]
