"""Server-side aggregation rules other than the weighted mean (robust rules) and the simulated
attackers they are evaluated against; the runtime applies them on the upload path
(:mod:`fedray.runtime.upload_path`); the ``robust`` config section is
:class:`fedray.config.privacy.RobustConfig`."""
