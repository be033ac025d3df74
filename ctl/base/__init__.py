"""Foundations every layer uses: argument checks, constants, the user's line in an
error, and every private TensorFlow, Keras or gin read (`_tf_internal`)."""

# Loaded with the package, as `ctl.arguments` (the checks packages built on ctl use).
from ctl.base import arguments as arguments
