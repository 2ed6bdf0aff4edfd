//! HTTPS for the TLS backend: one full TLS handshake and one `GET` per connection, the way
//! a client with no session to resume meets a server that keeps none; and the same `GET`
//! in plain HTTP, for an HTTP proxy.

use std::{fmt, io, path::Path, sync::Arc};

use rustls::{
    ClientConfig, RootCertStore,
    client::Resumption,
    pki_types::{CertificateDer, ServerName, pem::PemObject},
};
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt},
    net::TcpStream,
};
use tokio_rustls::TlsConnector;

use super::protocol::RESPONSE;

/// The path every request asks for.
pub const HTTPS_PATH: &str = "/shedder";

/// What the server answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Reply {
    /// 200 with the expected body.
    Served,
    /// 503: the server shed the request after the handshake.
    Busy,
}

/// An HTTPS client set-up: the server's certificate as the one trusted root, the name it
/// is asked for, and no session resumption.
#[derive(Clone)]
pub struct Https {
    connector: TlsConnector,
    server_name: ServerName<'static>,
    request: Arc<[u8]>,
}

impl fmt::Debug for Https {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Https")
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

/// The most a response may take (headers and body).
const MAX_RESPONSE: usize = 4096;

impl Https {
    /// Trust the certificate in `cert_pem` (a self-signed one, see
    /// [`TlsFiles`](crate::peers::TlsFiles)) and ask for `server_name`. Panics naming the
    /// file if it holds no certificate rustls accepts.
    pub fn trusting(cert_pem: &Path, server_name: &str) -> Self {
        let mut roots = RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(cert_pem)
            .unwrap_or_else(|e| panic!("{}: {e}", cert_pem.display()))
        {
            let cert = cert.unwrap_or_else(|e| panic!("{}: {e}", cert_pem.display()));
            roots
                .add(cert)
                .unwrap_or_else(|e| panic!("{}: {e}", cert_pem.display()));
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("rustls's default protocol versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        // Every connection pays for a full handshake, as against a server without a session
        // cache or tickets; a client that resumed would not measure that server.
        config.resumption = Resumption::disabled();
        let request = format!(
            "GET {HTTPS_PATH} HTTP/1.1\r\nHost: {server_name}\r\nConnection: close\r\n\r\n"
        );
        Self {
            connector: TlsConnector::from(Arc::new(config)),
            server_name: ServerName::try_from(server_name.to_string())
                .unwrap_or_else(|e| panic!("server name {server_name:?}: {e}")),
            request: request.into_bytes().into(),
        }
    }

    /// Handshake over `tcp`, send the request and read the whole response. Errors keep
    /// their kind: a reset or an early close during the handshake reads as one after it.
    pub(super) async fn exchange(&self, tcp: TcpStream) -> io::Result<Reply> {
        let mut tls = self
            .connector
            .connect(self.server_name.clone(), tcp)
            .await?;
        exchange(&mut tls, &self.request).await
    }
}

/// The request of a plain HTTP client: one `GET /`, `Connection: close`.
const HTTP_REQUEST: &[u8] = b"GET / HTTP/1.1\r\nHost: shedder\r\nConnection: close\r\n\r\n";

/// One plain HTTP/1.1 `GET /` over `tcp` and its whole response (see [`Protocol::Http`]).
///
/// [`Protocol::Http`]: super::Protocol::Http
pub(super) async fn http_exchange(mut tcp: TcpStream) -> io::Result<Reply> {
    exchange(&mut tcp, HTTP_REQUEST).await
}

/// Send `request` and read the whole response.
async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    request: &[u8],
) -> io::Result<Reply> {
    s.write_all(request).await?;
    let mut buf = Vec::with_capacity(512);
    loop {
        if let Some(reply) = parse(&buf)? {
            return Ok(reply);
        }
        if buf.len() >= MAX_RESPONSE {
            return Err(io::Error::other("response longer than 4 KiB"));
        }
        let mut chunk = [0u8; 1024];
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// The reply once `buf` holds the whole response (headers and `Content-Length` bytes of
/// body), None while more is to come.
fn parse(buf: &[u8]) -> io::Result<Option<Reply>> {
    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        return Ok(None);
    };
    let head = std::str::from_utf8(&buf[..end])
        .map_err(|_| io::Error::other("response headers are not UTF-8"))?;
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .ok_or_else(|| io::Error::other("no status line"))?;
    let length: usize = lines
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.trim().parse().ok())
        .ok_or_else(|| io::Error::other("no Content-Length"))?;
    let body = &buf[end + 4..];
    if body.len() < length {
        return Ok(None);
    }
    match status {
        "200" if &body[..length] == RESPONSE => Ok(Some(Reply::Served)),
        "200" => Err(io::Error::other("unexpected response body")),
        "503" => Ok(Some(Reply::Busy)),
        other => Err(io::Error::other(format!("HTTP status {other}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_response_is_complete_with_its_content_length() {
        let ok = [
            format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n",
                RESPONSE.len()
            )
            .as_bytes(),
            RESPONSE,
        ]
        .concat();
        let ok = &ok[..];
        assert_eq!(parse(ok).unwrap(), Some(Reply::Served));
        assert_eq!(parse(&ok[..ok.len() - 1]).unwrap(), None);
        assert_eq!(parse(&ok[..20]).unwrap(), None);
        let busy = b"HTTP/1.1 503 Service Temporarily Unavailable\r\ncontent-length: 4\r\n\r\nbusy";
        assert_eq!(parse(busy).unwrap(), Some(Reply::Busy));
        assert!(parse(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n").is_err());
        assert!(parse(b"HTTP/1.1 200 OK\r\n\r\n").is_err());
        assert!(parse(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc").is_err());
    }
}
