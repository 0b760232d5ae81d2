"""Topologies, link and node capacities, bandwidth-aware aggregation trees and the physical
plan. Coming in the control-plane issue."""
