//! The control socket's requests, answered between ticks.

use std::time::Duration;

use tracing::info;

use super::{
    Daemon,
    service::{Context, ModeSwitch, OverrideError, RunMode},
};

/// The longest a mode switch may be set for with a ttl: a week.
const MAX_MODE_TTL_S: u64 = 7 * 24 * 3600;
use crate::{
    api::control::{self, ApiError, Request},
    config::Config,
    control::overridden,
};

impl Daemon {
    /// Answer what the control socket asked, between ticks.
    pub(super) fn serve_requests(&mut self) {
        while let Ok(request) = self.endpoints.requests.try_recv() {
            match request {
                Request::State(reply) => {
                    let _ = reply.send(
                        serde_json::to_string(&self.state())
                            .map_err(|e| ApiError::new(500, e.to_string())),
                    );
                }
                Request::Policy(reply) => {
                    let _ = reply.send(Ok(self.config_text.clone()));
                }
                Request::ApplyPolicy { text, peer, reply } => {
                    let result = match Config::parse(&text) {
                        Ok(cfg) => self.apply_config(cfg, text).map(|()| {
                            info!(by = %peer, services = self.control.services.len(), "policy applied over the control socket");
                            format!(r#"{{"applied":true,"services":{}}}"#, self.control.services.len())
                        }),
                        Err(e) => Err(ApiError::from(e)),
                    };
                    self.endpoints.reload.attempted(result.is_ok());
                    let _ = reply.send(result);
                }
                Request::SetOverride {
                    service,
                    request,
                    peer,
                    reply,
                } => {
                    let _ = reply.send(self.set_override(&service, &request, peer));
                }
                Request::ClearOverride {
                    service,
                    peer,
                    reply,
                } => {
                    let _ = reply.send(self.clear_override(&service, &peer));
                }
                Request::SetMode {
                    service,
                    request,
                    peer,
                    reply,
                } => {
                    let _ = reply.send(self.set_mode(&service, &request, &peer));
                }
                Request::ClearMode {
                    service,
                    peer,
                    reply,
                } => {
                    let _ = reply.send(self.clear_mode(&service, &peer.to_string()));
                }
                Request::Detach { peer, reply } => {
                    info!(by = %peer, "detach requested over the control socket");
                    self.detach_requested = true;
                    let _ = reply.send(Ok(r#"{"detaching":true}"#.to_string()));
                }
            }
        }
    }

    /// The index of the service named `name` (404 if there is none).
    fn service_index(&self, name: &str) -> Result<usize, ApiError> {
        self.control
            .services
            .iter()
            .position(|r| r.cfg.name == name)
            .ok_or_else(|| ApiError::new(404, format!("no service named `{name}`")))
    }

    /// A bounded manual limit (see [`crate::control::overridden`]), in force in the kernel
    /// when the answer goes out.
    fn set_override(
        &mut self,
        service: &str,
        req: &control::OverrideRequest,
        peer: control::Peer,
    ) -> Result<String, ApiError> {
        let i = self.service_index(service)?;
        let request = overridden::Request {
            limit: req.limit,
            ttl: Duration::from_secs(req.ttl_s),
            force: req.force,
        };
        let (ctx, now) = (
            Context {
                ladder: &self.control.ladder,
                hz: self.kernel.hz,
                hold: self.control.hold.duration(self.kernel.hz),
            },
            self.start.elapsed(),
        );
        let by = (peer.to_string(), req.reason.clone());
        let previous = self.control.services[i]
            .set_override(&mut self.kernel.shedder, ctx, &request, now, by)
            .map_err(|e| match e {
                OverrideError::Refused(r) => {
                    let mut e = ApiError::bad(r.to_string());
                    e.field = Some(r.field().into());
                    e
                }
                OverrideError::Kernel(e) => {
                    ApiError::new(500, format!("writing the limits of `{service}`: {e}"))
                }
            })?;
        info!(
            service = %service,
            by = %peer,
            limit = req.limit,
            previous,
            ttl_s = req.ttl_s,
            reason = req.reason.as_deref().unwrap_or(""),
            "override set"
        );
        Ok(format!(
            r#"{{"service":"{service}","limit":{},"ttl_s":{}}}"#,
            req.limit, req.ttl_s
        ))
    }

    fn clear_override(&mut self, service: &str, peer: &control::Peer) -> Result<String, ApiError> {
        let i = self.service_index(service)?;
        let ctx = Context {
            ladder: &self.control.ladder,
            hz: self.kernel.hz,
            hold: self.control.hold.duration(self.kernel.hz),
        };
        match self.control.services[i].clear_override(&mut self.kernel.shedder, ctx) {
            Ok(Some(o)) => {
                info!(service = %service, by = %peer, limit = o.limit, "override cleared");
                Ok(r#"{"cleared":true}"#.to_string())
            }
            Ok(None) => Ok(r#"{"cleared":false}"#.to_string()),
            Err(e) => Err(ApiError::new(
                500,
                format!("writing the limits of `{service}`: {e}"),
            )),
        }
    }

    /// Switch a service's mode at run time (see [`ModeSwitch`]), in force in the kernel
    /// when the answer goes out, and in the audit log.
    fn set_mode(
        &mut self,
        service: &str,
        req: &control::ModeRequest,
        peer: &control::Peer,
    ) -> Result<String, ApiError> {
        let i = self.service_index(service)?;
        let mode = RunMode::parse(&req.mode).ok_or_else(|| {
            let mut e = ApiError::bad(format!("mode `{}`: use enforce, dry-run or off", req.mode));
            e.field = Some("mode".into());
            e
        })?;
        if let Some(ttl) = req.ttl_s
            && !(1..=MAX_MODE_TTL_S).contains(&ttl)
        {
            let mut e = ApiError::bad(format!(
                "ttl_s {ttl}: between 1 s and {MAX_MODE_TTL_S} s (7 days), or none for \
                 until cleared"
            ));
            e.field = Some("ttl_s".into());
            return Err(e);
        }
        let now = self.start.elapsed();
        let switch = ModeSwitch {
            mode,
            until: req
                .ttl_s
                .map_or(Duration::MAX, |t| now + Duration::from_secs(t)),
            by: peer.to_string(),
            reason: req.reason.clone(),
        };
        let ctx = Context {
            ladder: &self.control.ladder,
            hz: self.kernel.hz,
            hold: self.control.hold.duration(self.kernel.hz),
        };
        let previous = self.control.services[i]
            .set_mode(&mut self.kernel.shedder, ctx, switch)
            .map_err(|e| ApiError::new(500, format!("writing the mode of `{service}`: {e}")))?;
        info!(
            service = %service,
            by = %peer,
            mode = mode.as_str(),
            previous = previous.as_str(),
            ttl_s = req.ttl_s,
            reason = req.reason.as_deref().unwrap_or(""),
            "mode switched"
        );
        Ok(serde_json::json!({
            "service": service,
            "mode": mode.as_str(),
            "previous": previous.as_str(),
            "ttl_s": req.ttl_s,
        })
        .to_string())
    }

    /// End a service's mode switch (`by` who, or `expired`): the file's mode again.
    pub(super) fn clear_mode(&mut self, service: &str, by: &str) -> Result<String, ApiError> {
        let i = self.service_index(service)?;
        let ctx = Context {
            ladder: &self.control.ladder,
            hz: self.kernel.hz,
            hold: self.control.hold.duration(self.kernel.hz),
        };
        match self.control.services[i].clear_mode(&mut self.kernel.shedder, ctx) {
            Ok(Some(m)) => {
                info!(
                    service = %service,
                    by = %by,
                    mode = m.mode.as_str(),
                    now = self.control.services[i].mode().as_str(),
                    "mode switch ended"
                );
                Ok(r#"{"cleared":true}"#.to_string())
            }
            Ok(None) => Ok(r#"{"cleared":false}"#.to_string()),
            Err(e) => Err(ApiError::new(
                500,
                format!("writing the mode of `{service}`: {e}"),
            )),
        }
    }
}
