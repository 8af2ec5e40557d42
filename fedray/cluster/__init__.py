"""Running fedray on a Ray cluster: job submission (:mod:`~fedray.cluster.jobs`) and where workers ran
(:mod:`~fedray.cluster.placement`). The cluster configs themselves are in the repository's ``cluster/``;
the multi-node cluster on one machine that tests use is :mod:`fedray.testing.cluster`."""
