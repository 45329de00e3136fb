"""Incident scenarios: the families (a fleet and a fault acting through the simulated mechanism), and the bank
that runs them and writes each one's traces with its ground truth kept apart.
"""
