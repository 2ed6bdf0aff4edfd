//! The bytes of the request/response protocol (see the [module documentation](super)).
//!
//! A response is longer than its request, as in every real protocol shedder protects. With
//! equal byte counts in both directions, the final ACK a client's TIME_WAIT sends again
//! when a forged SYN-ACK reaches it passes Linux's SYN-cookie check as a new handshake:
//! both sequence numbers moved on by the same amount since the cookie was issued, and the
//! check subtracts one from the other. During a spoofed flood (the listener answering with
//! cookies) every such ACK opened a connection that no client used and that held a backend
//! worker until the request timeout, a quarter of the backend's capacity for two seconds,
//! with or without shedder: an artefact of a symmetric toy protocol, not of the traffic the
//! experiments stand for.

/// What a client sends: exactly these 16 bytes.
pub const REQUEST: &[u8; 16] = b"shedder request\n";
/// What a backend answers: exactly these 64 bytes (longer than [`REQUEST`], see above).
pub const RESPONSE: &[u8; 64] =
    b"shedder respond: the request was served in full, in one reply..\n";
/// What a backend shedding in the application
/// ([`BackendConfig::in_app`](super::BackendConfig::in_app)) answers instead of
/// [`RESPONSE`] to a request it will not serve, like an HTTP 503: as many bytes as
/// [`RESPONSE`].
pub const BUSY: &[u8; 64] = b"shedder busy 503: refused by the application, try again later..\n";

// A response as long as its request would let the quirk above back in.
const _: () = assert!(REQUEST.len() != RESPONSE.len() && BUSY.len() == RESPONSE.len());
