def hmac_sha1_b64(
    key: bytes,
    fields: dict[str, str],
    order: tuple[str, ...],
    body: bytes | bytearray | memoryview | None,
) -> bytes | None: ...
