def hmac_sha1_b64(
    key: bytes,
    fields: dict[str, str],
    order: tuple[str, ...],
    body: bytes | bytearray | memoryview | None,
) -> bytes | None: ...
def check_signed(
    fields: dict[str, str],
    body: bytes | bytearray | memoryview | None,
    code: int,
    secrets: dict[str, bytes],
    granted: set[tuple[str, int, object]],
    field_codes: dict[int, str],
    orders: dict[tuple[str, ...], tuple[tuple[str, ...], object]],
) -> bool: ...
def sign_fields(
    key: bytes,
    access_key: str,
    token: str | None,
    fields: dict[str, str] | None,
    body: bytes | bytearray | memoryview | None,
    orders: dict[tuple[str, ...], tuple[tuple[str, ...], object]],
) -> dict[str, str] | None: ...
