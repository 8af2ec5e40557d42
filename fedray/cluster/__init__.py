"""Running fedray on a Ray cluster: job submission (:mod:`~fedray.cluster.jobs`) and where workers ran
(:mod:`~fedray.cluster.placement`). The cluster configs themselves are in the repository's ``cluster/``;
the multi-node cluster on one machine that tests use is :mod:`fedray.testing.cluster`.

Standard library only here: the runtime reads :data:`SUBMIT_ADDRESS_VARIABLE` before it imports Ray."""

#: Set by ``fedray submit`` in the jobs it submits: the job server's URL, which the commands that a
#: job's messages suggest need (its user reads them on their own machine).
SUBMIT_ADDRESS_VARIABLE = "FEDRAY_SUBMIT_ADDRESS"
