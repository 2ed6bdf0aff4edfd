//! The bytes of the request/response protocol (see the [module documentation](super)).

/// What a client sends: exactly these 16 bytes.
pub const REQUEST: &[u8; 16] = b"shedder request\n";
/// What a backend answers: exactly these 16 bytes.
pub const RESPONSE: &[u8; 16] = b"shedder respond\n";
/// What a backend shedding in the application
/// ([`BackendConfig::in_app`](super::BackendConfig::in_app)) answers instead of
/// [`RESPONSE`] to a request it will not serve, like an HTTP 503: exactly these 16 bytes.
pub const BUSY: &[u8; 16] = b"shedder busy 503";
