"""Schemathesis hooks of ``test_schemathesis.py`` (loaded through ``SCHEMATHESIS_HOOKS``).

Tar bodies (``application/x-tar``: image import, archive upload) are sent as the bytes
generated for them, like ``application/octet-stream``.
"""

import schemathesis

schemathesis.serializer.alias("application/x-tar", "application/octet-stream")
