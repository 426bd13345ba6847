"""The webhook's signing key, read from the configured secret (docs/api.md § Webhooks).

Standard Webhooks serializes a symmetric secret as ``whsec_`` followed by the base64 of a random key of 24 to 64
bytes; its verifier libraries (``standardwebhooks.Webhook("whsec_...")``) decode it so. A secret in that form is used
so here too. Any other secret -- what ``PODCAST_JOB_WEBHOOK_SECRET`` held before the standard headers -- keeps
working: its key is its own UTF-8 bytes (a receiver gives the library ``Webhook(secret.encode())``).
"""

from __future__ import annotations

import base64
import binascii
from typing import Final

WEBHOOK_SECRET_PREFIX: Final = "whsec_"
WEBHOOK_KEY_MIN_BYTES: Final = 24
WEBHOOK_KEY_MAX_BYTES: Final = 64


def webhook_signing_key(secret: str) -> bytes:
    """The HMAC-SHA256 key of ``secret``. Raises ``ValueError`` for a ``whsec_`` secret that is not the base64 of
    24 to 64 bytes (padding optional, as the libraries accept it)."""
    if not secret.startswith(WEBHOOK_SECRET_PREFIX):
        return secret.encode()
    encoded = secret.removeprefix(WEBHOOK_SECRET_PREFIX)
    try:
        key = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
    except binascii.Error as exc:
        raise ValueError(f"a {WEBHOOK_SECRET_PREFIX} secret is base64 after its prefix: {exc}") from None
    if not WEBHOOK_KEY_MIN_BYTES <= len(key) <= WEBHOOK_KEY_MAX_BYTES:
        raise ValueError(
            f"a {WEBHOOK_SECRET_PREFIX} secret encodes a key of {WEBHOOK_KEY_MIN_BYTES} to {WEBHOOK_KEY_MAX_BYTES} "
            f"bytes (Standard Webhooks), this one {len(key)}"
        )
    return key
