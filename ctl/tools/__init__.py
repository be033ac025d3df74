"""Tools over a runner or an experiment: `parity`, `check`, TFRecords (`records`),
gin experiments and the configs packages ship, sweeps over seeds and bindings
(`sweep`, `sweep_table`)."""
