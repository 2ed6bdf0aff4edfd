//! The systems compared: their keys (as `--systems` names them), their titles, and how
//! each refuses.

use serde::Serialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    None,
    Nft1x,
    Nft15x,
    Haproxy,
    InApp,
    NginxConn,
    NginxReq,
    ShedderDrop,
    ShedderRst,
}

pub const ALL: [Kind; 9] = [
    Kind::None,
    Kind::Nft1x,
    Kind::Nft15x,
    Kind::Haproxy,
    Kind::InApp,
    Kind::NginxConn,
    Kind::NginxReq,
    Kind::ShedderDrop,
    Kind::ShedderRst,
];

impl Kind {
    pub fn key(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Nft1x => "nft-1x",
            Self::Nft15x => "nft-1.5x",
            Self::Haproxy => "haproxy",
            Self::InApp => "in-app",
            Self::NginxConn => "nginx-limit-conn",
            Self::NginxReq => "nginx-limit-req",
            Self::ShedderDrop => "shedder-drop",
            Self::ShedderRst => "shedder-rst",
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            Self::None => "no protection (kernel backlog)",
            Self::Nft1x => "nftables SYN limit at capacity",
            Self::Nft15x => "nftables SYN limit at 1.5× capacity",
            Self::Haproxy => "HAProxy maxconn + timeout queue",
            Self::InApp => "in-app AIMD, 503 after accept",
            Self::NginxConn => "nginx limit_conn, 503 after the handshake",
            Self::NginxReq => "nginx limit_req at capacity, 503 after the handshake",
            Self::ShedderDrop => "shedder, drop",
            Self::ShedderRst => "shedder, rst",
        }
    }

    /// Refusals reach the client as an answer before the TLS handshake (a reset, or
    /// HAProxy's close after its queue timeout), not as silence: h2load can be used
    /// against it.
    pub fn answers_refusals(self) -> bool {
        matches!(self, Self::Haproxy | Self::ShedderRst)
    }

    pub fn is_shedder(self) -> bool {
        matches!(self, Self::ShedderDrop | Self::ShedderRst)
    }
}
