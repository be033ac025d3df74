"""The outer loop: `fit` (calls, checks, saves, actions), its actions and checkpoints,
stopping on signals, the work directory, every step's history, the progress display."""
