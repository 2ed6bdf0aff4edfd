//! Debian's nginx in a namespace: the overload benchmark's TLS backend (a full handshake on
//! every connection), with [`NginxLimit`] nginx's own limiters, which answer 503, and with
//! [`NginxConfig::upstream`] a reverse proxy.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use super::{PeerProcess, nsenter, process_cpu_time};
use crate::{
    load::{HTTPS_PATH, RESPONSE},
    netns::Netns,
};

/// A certificate chain and its private key, PEM.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl TlsFiles {
    /// A self-signed RSA certificate of `bits` for `name` (its subject alternative name),
    /// made with Debian's `openssl` into `dir`. RSA-4096 takes a few seconds.
    pub fn self_signed(dir: &Path, name: &str, bits: u32) -> Self {
        let files = Self {
            cert: dir.join("cert.pem"),
            key: dir.join("key.pem"),
        };
        let out = Command::new("openssl")
            .args(["req", "-x509", "-newkey"])
            .arg(format!("rsa:{bits}"))
            .args(["-nodes", "-days", "2", "-subj"])
            .arg(format!("/CN={name}"))
            .arg("-addext")
            .arg(format!("subjectAltName=DNS:{name}"))
            // An end-entity certificate (openssl's default for -x509 is a CA, which rustls
            // refuses as a server's certificate).
            .args(["-addext", "basicConstraints=critical,CA:FALSE"])
            .arg("-keyout")
            .arg(&files.key)
            .arg("-out")
            .arg(&files.cert)
            .output()
            .expect("spawn openssl (is the openssl package installed?)");
        assert!(
            out.status.success(),
            "openssl req failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        files
    }
}

/// nginx's own admission limits, as its users set them: both act once a request has been
/// read, that is after the TCP and TLS handshakes, and answer 503. Their key is the
/// server's name, so that they bound the whole service (an empty key would count nothing).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum NginxLimit {
    None,
    /// `limit_conn`: at most this many connections with a request in progress.
    Conn(u32),
    /// `limit_req`: this many requests a second, with a burst of `burst` served at once
    /// (`nodelay`) and the rest refused.
    Req {
        rate: u32,
        burst: u32,
    },
}

/// How to run [`Nginx`].
#[derive(Clone, Debug)]
pub struct NginxConfig {
    /// Listen on all addresses at this port.
    pub port: u16,
    /// TLS with these files, with no session cache and no tickets: every connection makes a
    /// full handshake. None: plain HTTP.
    pub tls: Option<TlsFiles>,
    /// The one worker process's CPU (`worker_cpu_affinity`); None: unpinned.
    pub worker_cpu: Option<usize>,
    pub limit: NginxLimit,
    /// A reverse proxy: every path but [`HTTPS_PATH`] goes to this HTTP/1.1 server, over
    /// kept-alive upstream connections.
    pub upstream: Option<std::net::SocketAddr>,
}

impl NginxConfig {
    /// Plain HTTP on `port`, one unpinned worker, no limiter; a reverse proxy to `upstream`
    /// if given.
    pub fn http(port: u16, upstream: Option<std::net::SocketAddr>) -> Self {
        Self {
            port,
            tls: None,
            worker_cpu: None,
            limit: NginxLimit::None,
            upstream,
        }
    }

    /// The configuration file: one worker, no logging, a small file served at
    /// [`HTTPS_PATH`]. The file is served in nginx's content phase, after the limiters' (a
    /// `return` would answer before them, and no limit would ever refuse).
    fn render(&self, dir: &Path) -> String {
        let dir = dir.display();
        let affinity = self
            .worker_cpu
            .map(|cpu| format!("worker_cpu_affinity 1{};\n", "0".repeat(cpu)))
            .unwrap_or_default();
        let (zones, limits) = match self.limit {
            NginxLimit::None => (String::new(), String::new()),
            NginxLimit::Conn(n) => (
                "    limit_conn_zone $server_name zone=conns:1m;\n".to_string(),
                format!("            limit_conn conns {n};\n            limit_conn_status 503;\n"),
            ),
            NginxLimit::Req { rate, burst } => (
                format!("    limit_req_zone $server_name zone=reqs:1m rate={rate}r/s;\n"),
                format!(
                    "            limit_req zone=reqs burst={burst} nodelay;\n            limit_req_status 503;\n"
                ),
            ),
        };
        let (ssl, tls) = match &self.tls {
            Some(t) => (
                " ssl",
                format!(
                    "        ssl_certificate {};\n        ssl_certificate_key {};\n        \
                     ssl_protocols TLSv1.2 TLSv1.3;\n        ssl_session_cache off;\n        \
                     ssl_session_tickets off;\n",
                    t.cert.display(),
                    t.key.display()
                ),
            ),
            None => ("", String::new()),
        };
        let (upstream, proxy) = match self.upstream {
            Some(addr) => (
                format!("    upstream backend {{\n        server {addr};\n        keepalive 64;\n    }}\n"),
                "        location / {\n            proxy_pass http://backend;\n            \
                 proxy_http_version 1.1;\n            proxy_set_header Connection \"\";\n            \
                 proxy_read_timeout 30s;\n        }\n"
                    .to_string(),
            ),
            None => (String::new(), String::new()),
        };
        format!(
            "daemon off;\n\
             master_process on;\n\
             worker_processes 1;\n\
             {affinity}\
             pid {dir}/nginx.pid;\n\
             error_log {dir}/error.log warn;\n\
             events {{\n    worker_connections 16384;\n}}\n\
             http {{\n\
             \x20   access_log off;\n\
             \x20   client_body_temp_path {dir}/body;\n\
             \x20   proxy_temp_path {dir}/proxy;\n\
             \x20   fastcgi_temp_path {dir}/fastcgi;\n\
             \x20   uwsgi_temp_path {dir}/uwsgi;\n\
             \x20   scgi_temp_path {dir}/scgi;\n\
             \x20   keepalive_requests 1000000;\n\
             {zones}\
             {upstream}\
             \x20   server {{\n\
             \x20       listen {port}{ssl};\n\
             \x20       server_name shedder;\n\
             {tls}\
             \x20       location = {HTTPS_PATH} {{\n\
             {limits}\
             \x20           default_type text/plain;\n\
             \x20           alias {dir}/body;\n\
             \x20       }}\n\
             {proxy}\
             \x20   }}\n\
             }}\n",
            port = self.port,
        )
    }
}

/// An nginx master process (`daemon off`) and its one worker in a namespace. Dropping it
/// stops them and removes its directory.
pub struct Nginx(PeerProcess);

impl Nginx {
    /// Write the configuration to a new directory, check it with `nginx -t`, start nginx
    /// inside `ns` and wait until its port accepts connections and its worker runs (panics
    /// with nginx's error log if it does not within 5 s).
    pub fn start(ns: &Netns, cfg: &NginxConfig) -> Self {
        let mut p = PeerProcess::new("nginx", "nginx.conf", |dir| cfg.render(dir));
        std::fs::write(p.path("body"), RESPONSE).expect("write nginx's body file");
        // -e: the error log before the configuration names one (Debian's default path may
        // not be writable); -p: the prefix relative paths resolve against.
        let args = |c: &mut Command| {
            c.arg("-p")
                .arg(&p.dir)
                .arg("-e")
                .arg(p.path(ERROR_LOG))
                .arg("-c")
                .arg(p.path("nginx.conf"));
        };
        let mut check = Command::new("nginx");
        args(&mut check);
        check.arg("-t");
        p.check(check);
        let mut c = nsenter(&ns.name, "nginx");
        args(&mut c);
        c.stdout(Stdio::null()).stderr(Stdio::null());
        p.spawn(c, ns, cfg.port, ERROR_LOG);
        let nginx = Self(p);
        nginx.wait_for_worker();
        nginx
    }

    /// The master listens before it forks its worker, so an accepting port does not yet
    /// mean a worker: wait for it (panics after 5 s), or a CPU reading would miss it.
    fn wait_for_worker(&self) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.pids().len() < 2 {
            assert!(
                Instant::now() < deadline,
                "nginx's master {} forked no worker within 5 s",
                self.0.pid()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The master's and the workers' process ids.
    pub fn pids(&self) -> Vec<u32> {
        let master = self.0.pid();
        let children = std::fs::read_to_string(format!("/proc/{master}/task/{master}/children"))
            .unwrap_or_default();
        std::iter::once(master)
            .chain(children.split_whitespace().filter_map(|p| p.parse().ok()))
            .collect()
    }

    /// CPU time the master and its workers have used so far.
    pub fn cpu_time(&self) -> Duration {
        self.pids()
            .into_iter()
            .filter_map(|p| process_cpu_time(p).ok())
            .sum()
    }

    /// The configuration file's text.
    pub fn config_text(&self) -> &str {
        &self.0.config
    }
}

/// nginx's error log, in its directory.
const ERROR_LOG: &str = "error.log";
