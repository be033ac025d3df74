"""Distribution: strategies by name, what each kind is (`placement`), where this task is
(`cluster`), waiting for a cluster's peers, and local multi-process clusters (`ctl launch`)."""
