"""Tests: unit, property-based (hypothesis) and, as the system grows, integration tests."""
