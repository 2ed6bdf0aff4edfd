//! The control socket's requests, answered between ticks.

use std::time::Duration;

use tracing::info;

use super::{
    Daemon,
    service::{Context, OverrideError},
};
use crate::{
    api::control::{self, ApiError, Request},
    config::Config,
    control::overridden,
};

impl Daemon {
    /// Answer what the control socket asked, between ticks.
    pub(super) fn serve_requests(&mut self) {
        while let Ok(request) = self.requests.try_recv() {
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
                            info!(by = %peer, services = self.services.len(), "policy applied over the control socket");
                            format!(r#"{{"applied":true,"services":{}}}"#, self.services.len())
                        }),
                        Err(e) => Err(ApiError::from(e)),
                    };
                    self.reload.attempted(result.is_ok());
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
        self.services
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
                ladder: &self.ladder,
                hz: self.hz,
                hold: self.hold.duration(self.hz),
            },
            self.start.elapsed(),
        );
        let by = (peer.to_string(), req.reason.clone());
        let previous = self.services[i]
            .set_override(&mut self.shedder, ctx, &request, now, by)
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
            ladder: &self.ladder,
            hz: self.hz,
            hold: self.hold.duration(self.hz),
        };
        match self.services[i].clear_override(&mut self.shedder, ctx) {
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
}
