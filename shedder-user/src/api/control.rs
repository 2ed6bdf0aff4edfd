//! The control API: HTTP/1.1 with JSON over a Unix socket (mode 0660, owner root and an
//! optional group), the peer's credentials checked on every connection; no TCP listener.
//!
//! | request | does |
//! |---|---|
//! | `GET /shedding/state` | the daemon's [`State`](crate::api::state::State) |
//! | `GET /shedding/policy` | the configuration in force (TOML) |
//! | `PUT /shedding/policy` | validate a configuration (TOML body) and apply it; a bad one changes nothing |
//! | `PUT /shedding/override/<service>` | `{"limit": n, "ttl_s": s, "force": false, "reason": "..."}`: a bounded manual limit that expires |
//! | `DELETE /shedding/override/<service>` | end an override |
//! | `PUT /shedding/mode/<service>` | `{"mode": "enforce"\|"dry-run"\|"off", "ttl_s": s, "reason": "..."}`: switch the service's mode, through reloads, until cleared or expired (no `ttl_s`: until cleared) |
//! | `DELETE /shedding/mode/<service>` | end the switch: the file's mode again |
//! | `POST /shedding/detach` | stop the daemon and detach everything |
//!
//! Errors answer `{"error": "...", "field": "...", "line": n}` with 400 (bad input, nothing
//! changed), 403, 404 or 500. Every change, and every refusal, is written to the audit log
//! (tracing target `audit`).

use std::{
    ffi::CString,
    io::{self, Read, Write},
    os::{
        fd::AsRawFd,
        unix::{
            fs::PermissionsExt,
            net::{UnixListener, UnixStream},
        },
    },
    path::{Path, PathBuf},
    sync::mpsc,
    time::Duration,
};

use serde::{Deserialize, Serialize};
use tracing::{info, warn};

/// The longest request body accepted.
const MAX_BODY: usize = 1024 * 1024;

/// An API error: HTTP status and the JSON body.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ApiError {
    #[serde(skip)]
    pub status: u16,
    pub error: String,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub field: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub line: Option<usize>,
}

impl ApiError {
    pub fn new(status: u16, error: impl Into<String>) -> Self {
        Self {
            status,
            error: error.into(),
            field: None,
            line: None,
        }
    }

    pub fn bad(error: impl Into<String>) -> Self {
        Self::new(400, error)
    }
}

impl From<crate::config::ConfigError> for ApiError {
    fn from(e: crate::config::ConfigError) -> Self {
        Self {
            status: 400,
            error: e.to_string(),
            field: (!e.field.is_empty()).then(|| e.field.clone()),
            line: e.line,
        }
    }
}

/// A manual limit requested through the API.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OverrideRequest {
    pub limit: u32,
    /// Seconds until it expires (default 600, at most 86,400).
    #[serde(default = "default_ttl")]
    pub ttl_s: u64,
    /// Allow a change of more than 4× from the limit in force.
    #[serde(default)]
    pub force: bool,
    #[serde(default)]
    pub reason: Option<String>,
}

fn default_ttl() -> u64 {
    600
}

/// A service's mode switched through the API (`shedder mode`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModeRequest {
    /// `enforce`, `dry-run` or `off`.
    pub mode: String,
    /// Seconds until it expires (none: until cleared, or until the daemon stops).
    #[serde(default)]
    pub ttl_s: Option<u64>,
    #[serde(default)]
    pub reason: Option<String>,
}

/// Who is asking (from the socket's peer credentials, as they were at connect time).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    pub pid: i32,
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups (SO_PEERGROUPS).
    pub groups: Vec<u32>,
}

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "uid {} (pid {})", self.uid, self.pid)
    }
}

/// What the daemon must do for a request; the answer comes back on `reply`.
pub enum Request {
    State(mpsc::Sender<Result<String, ApiError>>),
    Policy(mpsc::Sender<Result<String, ApiError>>),
    ApplyPolicy {
        text: String,
        peer: Peer,
        reply: mpsc::Sender<Result<String, ApiError>>,
    },
    SetOverride {
        service: String,
        request: OverrideRequest,
        peer: Peer,
        reply: mpsc::Sender<Result<String, ApiError>>,
    },
    ClearOverride {
        service: String,
        peer: Peer,
        reply: mpsc::Sender<Result<String, ApiError>>,
    },
    Detach {
        peer: Peer,
        reply: mpsc::Sender<Result<String, ApiError>>,
    },
    SetMode {
        service: String,
        request: ModeRequest,
        peer: Peer,
        reply: mpsc::Sender<Result<String, ApiError>>,
    },
    ClearMode {
        service: String,
        peer: Peer,
        reply: mpsc::Sender<Result<String, ApiError>>,
    },
}

/// Whether `peer` may use the API: root, or a process that holds `group` (primary or
/// supplementary, the same test the kernel makes for the socket file's group permission).
pub fn authorized(peer: &Peer, group: Option<u32>) -> bool {
    if peer.uid == 0 {
        return true;
    }
    group.is_some_and(|gid| peer.gid == gid || peer.groups.contains(&gid))
}

/// The gid of a group name.
pub fn group_id(name: &str) -> io::Result<u32> {
    let c = CString::new(name).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let mut buf = vec![0u8; 16 * 1024];
    // SAFETY: a zeroed group is a valid out-parameter for getgrnam_r.
    let mut grp: libc::group = unsafe { std::mem::zeroed() };
    let mut result: *mut libc::group = std::ptr::null_mut();
    // SAFETY: valid buffers; result is checked before use.
    let rc = unsafe {
        libc::getgrnam_r(
            c.as_ptr(),
            &mut grp,
            buf.as_mut_ptr().cast(),
            buf.len(),
            &mut result,
        )
    };
    if rc != 0 || result.is_null() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("no group named `{name}`"),
        ));
    }
    Ok(grp.gr_gid)
}

fn peer_of(stream: &impl AsRawFd) -> io::Result<Peer> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: cred and len describe a valid ucred buffer.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut cred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(Peer {
        pid: cred.pid,
        uid: cred.uid,
        gid: cred.gid,
        groups: peer_groups(stream)?,
    })
}

/// The peer's supplementary groups. Linux answers ERANGE with the size it needs.
fn peer_groups(stream: &impl AsRawFd) -> io::Result<Vec<u32>> {
    const SO_PEERGROUPS: libc::c_int = 59;
    let mut groups = vec![0 as libc::gid_t; 64];
    loop {
        let mut len = (groups.len() * size_of::<libc::gid_t>()) as libc::socklen_t;
        // SAFETY: `groups` has room for `len` bytes.
        let rc = unsafe {
            libc::getsockopt(
                stream.as_raw_fd(),
                libc::SOL_SOCKET,
                SO_PEERGROUPS,
                groups.as_mut_ptr().cast(),
                &mut len,
            )
        };
        let n = len as usize / size_of::<libc::gid_t>();
        if rc == 0 {
            groups.truncate(n);
            return Ok(groups);
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ERANGE) || n <= groups.len() {
            return Err(e);
        }
        groups.resize(n, 0);
    }
}

/// Bind the control socket: refuses to steal the socket of a daemon that is running, removes
/// a stale one, creates the directory, and sets mode 0660 with owner root and `group`.
pub fn bind(path: &Path, group: Option<u32>) -> io::Result<UnixListener> {
    if path.exists() {
        if UnixStream::connect(path).is_ok() {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!(
                    "{} answers: another shedder daemon is running",
                    path.display()
                ),
            ));
        }
        std::fs::remove_file(path)?;
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))?;
    if let Some(gid) = group {
        let c = CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        // SAFETY: valid NUL-terminated path.
        if unsafe { libc::chown(c.as_ptr(), 0, gid) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(listener)
}

/// Serve the API on `listener` until the process exits, each connection on a task of its
/// own (see [`crate::api::http`]): each request is forwarded to the daemon loop over `requests`
/// and answered with what it replies.
/// Connections the control socket serves at once; more wait in its backlog. The CLI opens
/// one per command, so 32 is ample for operators and scripts, and bounds what a runaway
/// client in the control group can hold (tasks, buffers, descriptors).
pub const CONNECTIONS: usize = 32;

pub fn serve(listener: UnixListener, group: Option<u32>, requests: mpsc::Sender<Request>) {
    let make = move || {
        listener.set_nonblocking(true)?;
        tokio::net::UnixListener::from_std(listener)
    };
    crate::api::http::accept_loop("the control socket", CONNECTIONS, make, move |conn| {
        let peer = peer_of(&conn).map_err(|e| e.to_string());
        let requests = requests.clone();
        crate::api::http::serve_connection(conn, move |req| {
            let (peer, requests) = (peer.clone(), requests.clone());
            async move {
                let (status, body, content_type) = match handle(req, peer, group, requests).await {
                    Ok((body, content_type)) => (200, body, content_type),
                    Err(e) => (
                        e.status,
                        serde_json::to_string(&e).unwrap_or_default(),
                        "application/json",
                    ),
                };
                crate::api::http::answer(status, content_type, body)
            }
        });
    });
}

async fn handle(
    req: hyper::Request<hyper::body::Incoming>,
    peer: Result<Peer, String>,
    group: Option<u32>,
    requests: mpsc::Sender<Request>,
) -> Result<(String, &'static str), ApiError> {
    let peer = peer.map_err(|e| ApiError::new(500, format!("peer credentials: {e}")))?;
    let method = req.method().as_str().to_string();
    let path = req.uri().path().to_string();
    // Read the (size-bounded) request before refusing, so the client is not cut off
    // mid-write and gets the answer.
    let body = crate::api::http::body(req, MAX_BODY).await;
    if !authorized(&peer, group) {
        warn!(target: "audit", %peer, "control request refused: not root and not in the control group");
        return Err(ApiError::new(
            403,
            format!("{peer} may not use the control API (root or the control group only)"),
        ));
    }
    let body = body.map_err(|e| match e {
        crate::api::http::BodyError::TooLarge(_) => ApiError::new(413, e.to_string()),
        _ => ApiError::bad(e.to_string()),
    })?;
    // The daemon answers between ticks: wait for it off the runtime's thread.
    tokio::task::spawn_blocking(move || dispatch(&method, &path, body.to_vec(), &peer, &requests))
        .await
        .map_err(|e| ApiError::new(500, format!("the request's handler failed: {e}")))?
}

/// Hand a request to the daemon loop and wait for its answer.
fn dispatch(
    method: &str,
    path: &str,
    body: Vec<u8>,
    peer: &Peer,
    requests: &mpsc::Sender<Request>,
) -> Result<(String, &'static str), ApiError> {
    let (tx, rx) = mpsc::channel();
    let json = "application/json";
    let (request, content_type) = match (method, path) {
        ("GET", "/shedding/state") => (Request::State(tx), json),
        ("GET", "/shedding/policy") => (Request::Policy(tx), "application/toml"),
        ("PUT", "/shedding/policy") => {
            let text = String::from_utf8(body)
                .map_err(|_| ApiError::bad("the policy is not UTF-8 text"))?;
            (
                Request::ApplyPolicy {
                    text,
                    peer: peer.clone(),
                    reply: tx,
                },
                json,
            )
        }
        ("PUT", p) if p.starts_with("/shedding/override/") => {
            let request: OverrideRequest = serde_json::from_slice(&body)
                .map_err(|e| ApiError::bad(format!("override body: {e}")))?;
            (
                Request::SetOverride {
                    service: p["/shedding/override/".len()..].to_string(),
                    request,
                    peer: peer.clone(),
                    reply: tx,
                },
                json,
            )
        }
        ("DELETE", p) if p.starts_with("/shedding/override/") => (
            Request::ClearOverride {
                service: p["/shedding/override/".len()..].to_string(),
                peer: peer.clone(),
                reply: tx,
            },
            json,
        ),
        ("PUT", p) if p.starts_with("/shedding/mode/") => {
            let request: ModeRequest = serde_json::from_slice(&body)
                .map_err(|e| ApiError::bad(format!("mode body: {e}")))?;
            (
                Request::SetMode {
                    service: p["/shedding/mode/".len()..].to_string(),
                    request,
                    peer: peer.clone(),
                    reply: tx,
                },
                json,
            )
        }
        ("DELETE", p) if p.starts_with("/shedding/mode/") => (
            Request::ClearMode {
                service: p["/shedding/mode/".len()..].to_string(),
                peer: peer.clone(),
                reply: tx,
            },
            json,
        ),
        ("POST", "/shedding/detach") => (
            Request::Detach {
                peer: peer.clone(),
                reply: tx,
            },
            json,
        ),
        (_, p) if p.starts_with("/shedding/") => {
            return Err(ApiError::new(405, format!("{method} {p} is not supported")));
        }
        (_, p) => return Err(ApiError::new(404, format!("no such endpoint: {p}"))),
    };
    requests
        .send(request)
        .map_err(|_| ApiError::new(500, "the daemon is stopping"))?;
    let answer = rx
        .recv_timeout(Duration::from_secs(10))
        .map_err(|_| ApiError::new(500, "the daemon did not answer"))?;
    if method != "GET" {
        match &answer {
            Ok(_) => info!(target: "audit", %peer, %method, %path, "control change applied"),
            Err(e) => {
                info!(target: "audit", %peer, %method, %path, error = %e.error, "control change refused")
            }
        }
    }
    answer.map(|body| (body, content_type))
}

/// A client of the control API.
pub struct Client {
    pub socket: PathBuf,
}

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Nothing listens there.
    #[error("{0}")]
    NotRunning(String),
    /// The socket refused us (file permissions or the peer check).
    #[error("{0}")]
    Denied(String),
    /// The daemon answered with an error.
    #[error("{}", .0.error)]
    Api(ApiError),
    #[error("{0}")]
    Io(String),
}

impl Client {
    pub fn new(socket: impl Into<PathBuf>) -> Self {
        Self {
            socket: socket.into(),
        }
    }

    /// One request; the body of a 200 answer.
    pub fn call(&self, method: &str, path: &str, body: &[u8]) -> Result<String, ClientError> {
        let mut conn = UnixStream::connect(&self.socket).map_err(|e| match e.kind() {
            io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused => {
                ClientError::NotRunning(format!(
                    "no shedder daemon answers on {} ({e}); start it with `shedder run`",
                    self.socket.display()
                ))
            }
            io::ErrorKind::PermissionDenied => ClientError::Denied(format!(
                "permission denied on {}: the control socket is for root and the control group",
                self.socket.display()
            )),
            _ => ClientError::Io(format!("connecting to {}: {e}", self.socket.display())),
        })?;
        let _ = conn.set_read_timeout(Some(Duration::from_secs(15)));
        let sent = write!(
            conn,
            "{method} {path} HTTP/1.1\r\nHost: shedder\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        )
        .and_then(|()| conn.write_all(body));
        // The daemon may answer (a refusal) before reading everything: read the answer
        // whatever happened to the write.
        let sent = sent.map_err(|e| ClientError::Io(format!("sending the request: {e}")));
        let mut raw = Vec::new();
        if let Err(e) = conn.read_to_end(&mut raw) {
            sent?;
            return Err(ClientError::Io(format!("reading the answer: {e}")));
        }
        if raw.is_empty() {
            sent?;
        }
        let mut headers = [httparse::EMPTY_HEADER; 16];
        let mut resp = httparse::Response::new(&mut headers);
        let head = match resp.parse(&raw) {
            Ok(httparse::Status::Complete(n)) => n,
            _ => return Err(ClientError::Io("malformed answer from the daemon".into())),
        };
        let status = resp.code.unwrap_or(500);
        let body = String::from_utf8_lossy(&raw[head..]).into_owned();
        if status == 200 {
            return Ok(body);
        }
        let mut e: ApiError =
            serde_json::from_str(&body).unwrap_or_else(|_| ApiError::new(status, body));
        e.status = status;
        if status == 403 {
            return Err(ClientError::Denied(e.error));
        }
        Err(ClientError::Api(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_always_and_group_members_only_when_a_group_is_configured() {
        let peer = |uid, gid, groups: &[u32]| Peer {
            pid: 2,
            uid,
            gid,
            groups: groups.to_vec(),
        };
        let root = peer(0, 0, &[]);
        let user = peer(65534, 65534, &[]);
        assert!(authorized(&root, None));
        assert!(!authorized(&user, None), "no group: root only");
        assert!(
            authorized(&user, Some(65534)),
            "the peer's own gid is the group"
        );
        assert!(!authorized(&user, Some(4242)), "not a member");
        let member = peer(4000, 4000, &[10, 4242]);
        assert!(
            authorized(&member, Some(4242)),
            "a supplementary group counts"
        );
        assert!(!authorized(&member, Some(4243)));
    }

    #[test]
    fn override_defaults() {
        let r: OverrideRequest = serde_json::from_str(r#"{"limit": 40}"#).unwrap();
        assert_eq!(
            (r.limit, r.ttl_s, r.force, r.reason),
            (40, 600, false, None)
        );
    }

    #[test]
    fn config_errors_carry_field_and_line() {
        let e = crate::config::Config::parse("[daemon]\ntick_ms = 1\n").unwrap_err();
        let api = ApiError::from(e);
        assert_eq!(api.status, 400);
        assert_eq!(api.field.as_deref(), Some("daemon.tick_ms"));
        assert_eq!(api.line, Some(2));
    }
}
