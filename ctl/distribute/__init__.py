"""Distribution: strategies by name and what each kind is (`Placement`), waiting for a
cluster's peers, and local multi-process clusters (`ctl launch`, no TensorFlow)."""
