"""The parts a runner puts together: the state (models, optimizers, step), the data's
feed, the compiled step, evaluation and export. The outer loop and the tools take these."""
