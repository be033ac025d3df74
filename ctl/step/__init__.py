"""The step contract: `StepContext` (what a step calls: average, minimize, noise)
and the reduction of a step's results over replicas."""
