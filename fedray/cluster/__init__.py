"""Running fedray on a Ray cluster: job submission (:mod:`~fedray.cluster.jobs`), where workers ran
(:mod:`~fedray.cluster.placement`) and a multi-node cluster on one machine for tests
(:mod:`~fedray.cluster.local`). The cluster configs themselves are in the repository's ``cluster/``."""
