"""Differential privacy of client uploads (docs/guide/privacy.md): clipping, the Gaussian mechanisms
and the privacy accountant. The runtime applies them on the upload path
(:mod:`fedray.runtime.upload_path`); the ``privacy`` config section is
:class:`fedray.config.privacy.PrivacyConfig`."""
