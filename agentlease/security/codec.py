"""A Temporal payload codec with rotating AES-GCM keys (``AGENTLEASE_CODEC_KEYS``): sealed under the first key,
its id in the metadata, opened by whichever key that id names. ``docs/security-data.md`` ("Transport and payload
encryption")."""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
from collections.abc import Sequence

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from google.protobuf.message import DecodeError
from temporalio.api.common.v1 import Payload
from temporalio.converter import PayloadCodec

from agentlease.errors import AgentLeaseError, ConfigurationError

ENCODING = b"binary/encrypted"
"""The ``encoding`` metadata of an encrypted payload."""
KEY_ID = "encryption-key-id"
"""The metadata entry naming the key that sealed a payload."""
_NONCE_BYTES = 12
_TAG_BYTES = 16
_KEY_ID_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,64}")
UNDECODABLE = "__agentlease_undecodable__"
"""The one key of what a lenient codec (a worker's) decodes a payload that does not open to:
``{"__agentlease_undecodable__": "<why>"}`` (see :meth:`EncryptionCodec.lenient`)."""


def undecodable(value: object) -> str | None:
    """Why ``value`` could not be decoded, when it is a lenient codec's marker; ``None`` otherwise."""
    if isinstance(value, dict) and len(value) == 1 and isinstance(value.get(UNDECODABLE), str):
        return str(value[UNDECODABLE])
    return None


def _marker(why: str) -> Payload:
    data = json.dumps({UNDECODABLE: why[:500]}).encode()
    return Payload(metadata={"encoding": b"json/plain"}, data=data)


class UnknownCodecKeyError(AgentLeaseError):
    """A payload was sealed with a key (``key_id``) that is not configured, or does not open with it."""

    def __init__(self, key_id: str, known: Sequence[str], *, configured: bool = False) -> None:
        listed = ", ".join(known) or "none"
        if configured:
            why = f"but the key of that id in AGENTLEASE_CODEC_KEYS ({listed}) does not open it"
        else:
            why = f"which is not among AGENTLEASE_CODEC_KEYS ({listed})"
        super().__init__(f"payload encrypted with key id {key_id!r}, {why}")
        self.key_id = key_id


class MalformedPayloadError(AgentLeaseError):
    """A payload marked encrypted that is not one: shorter than a nonce and a tag, or no Temporal payload inside."""


class CodecKeysMissingError(AgentLeaseError):
    """A payload is encrypted and this process has no payload codec: it cannot be read here."""


class KeysMissingCodec(PayloadCodec):
    """The codec of a process without ``AGENTLEASE_CODEC_KEYS``: payloads pass, and an encrypted one is refused
    in one line naming the setting (not the SDK's ``KeyError`` and traceback)."""

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return list(payloads)

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        for payload in payloads:
            if payload.metadata.get("encoding") == ENCODING:
                key_id = payload.metadata.get(KEY_ID, b"").decode("utf-8", "replace")
                raise CodecKeysMissingError(
                    f"its payloads are encrypted (key id {key_id!r}) and AGENTLEASE_CODEC_KEYS is not set here: "
                    "set the keys the workers use"
                )
        return list(payloads)


def parse_keys(text: str) -> list[tuple[str, bytes]]:
    """``ID:BASE64KEY,...`` as ``(id, key)`` pairs, the encrypting key first.

    Raises:
        ConfigurationError: a malformed entry, a key not 16, 24 or 32 bytes of base64, or an id repeated.
    """
    keys: list[tuple[str, bytes]] = []
    for entry in (part.strip() for part in text.split(",")):
        if not entry:
            continue
        key_id, sep, encoded = entry.partition(":")
        if not sep or not _KEY_ID_PATTERN.fullmatch(key_id):
            raise ConfigurationError(
                "bad AGENTLEASE_CODEC_KEYS entry: expected ID:BASE64KEY, the id of letters, digits, '.', '_', '-'"
            )
        try:
            key = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise ConfigurationError(f"bad AGENTLEASE_CODEC_KEYS: key {key_id!r} is not base64") from None
        if len(key) not in (16, 24, 32):
            raise ConfigurationError(
                f"bad AGENTLEASE_CODEC_KEYS: key {key_id!r} has {len(key)} bytes; AES-GCM takes 16, 24 or 32"
            )
        if any(key_id == known for known, _ in keys):
            raise ConfigurationError(f"bad AGENTLEASE_CODEC_KEYS: key id {key_id!r} is listed twice")
        keys.append((key_id, key))
    if not keys:
        raise ConfigurationError("AGENTLEASE_CODEC_KEYS is set but names no key")
    return keys


def new_key_entry(key_id: str) -> str:
    """A fresh ``ID:BASE64KEY`` entry (a random 32-byte key); ConfigurationError for a bad id."""
    if not _KEY_ID_PATTERN.fullmatch(key_id):
        raise ConfigurationError(f"bad key id {key_id!r}: use 1 to 64 letters, digits, '.', '_', '-'")
    return f"{key_id}:{base64.b64encode(AESGCM.generate_key(bit_length=256)).decode()}"


class EncryptionCodec(PayloadCodec):
    """AES-GCM payload codec with rotating ``keys``, ``(id, key)`` pairs: the first encrypts, every one decrypts.
    ConfigurationError when no key is given."""

    def __init__(self, keys: Sequence[tuple[str, bytes]], *, lenient: bool = False) -> None:
        if not keys:
            raise ConfigurationError("the encryption codec needs at least one key")
        self._pairs = list(keys)
        self._encrypting = keys[0][0]
        self._keys = {key_id: AESGCM(key) for key_id, key in keys}
        self.is_lenient = lenient
        """Decode a payload that does not open to a marker instead of raising (a worker's codec)."""

    def lenient(self) -> EncryptionCodec:
        """The same keys, decoding a payload that does not open to ``{UNDECODABLE: why}`` instead of raising: a
        worker's, so one hostile input fails only itself, not every workflow task of the run."""
        return EncryptionCodec(self._pairs, lenient=True)

    @classmethod
    def from_text(cls, text: str) -> EncryptionCodec:
        """The codec of an ``AGENTLEASE_CODEC_KEYS`` value (see :func:`parse_keys`)."""
        return cls(parse_keys(text))

    @property
    def key_ids(self) -> list[str]:
        """The configured key ids, the encrypting one first."""
        return list(self._keys)

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [self.seal(payload) for payload in payloads]

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        if not self.is_lenient:
            return [self.open(payload) for payload in payloads]
        decoded = []
        for payload in payloads:
            try:
                decoded.append(self.open(payload))
            except (UnknownCodecKeyError, MalformedPayloadError) as exc:
                decoded.append(_marker(str(exc)))
        return decoded

    def seal(self, payload: Payload) -> Payload:
        """``payload`` encrypted with the first key."""
        key_id = self._encrypting
        nonce = os.urandom(_NONCE_BYTES)
        sealed = self._keys[key_id].encrypt(nonce, payload.SerializeToString(), key_id.encode())
        return Payload(metadata={"encoding": ENCODING, KEY_ID: key_id.encode()}, data=nonce + sealed)

    def open(self, payload: Payload) -> Payload:
        """``payload`` decrypted (returned as it is when not encrypted).

        Raises:
            UnknownCodecKeyError, MalformedPayloadError: see each.
        """
        if payload.metadata.get("encoding") != ENCODING:
            return payload
        key_id = payload.metadata.get(KEY_ID, b"").decode("utf-8", "replace")
        aead = self._keys.get(key_id)
        if aead is None:
            raise UnknownCodecKeyError(key_id, self.key_ids)
        if len(payload.data) < _NONCE_BYTES + _TAG_BYTES:
            raise MalformedPayloadError(
                f"payload encrypted with key id {key_id!r} is {len(payload.data)} bytes, shorter than a nonce "
                "and a tag: not a sealed payload"
            )
        try:
            plain = aead.decrypt(payload.data[:_NONCE_BYTES], payload.data[_NONCE_BYTES:], key_id.encode())
        except InvalidTag:
            raise UnknownCodecKeyError(key_id, self.key_ids, configured=True) from None
        decoded = Payload()
        try:
            decoded.ParseFromString(plain)
        except DecodeError:
            raise MalformedPayloadError(f"payload encrypted with key id {key_id!r} holds no Temporal payload") from None
        return decoded


__all__ = [
    "ENCODING",
    "KEY_ID",
    "UNDECODABLE",
    "CodecKeysMissingError",
    "EncryptionCodec",
    "KeysMissingCodec",
    "MalformedPayloadError",
    "UnknownCodecKeyError",
    "new_key_entry",
    "parse_keys",
    "undecodable",
]
