//! Client sessions and the rules of client identities: sessions register and heartbeat, the
//! rename lock is held by one session at a time, and each identity's restrictions are set.

use super::*;

impl Mgmt {
    pub(super) fn set_client_rule(
        &self,
        rule: weft_proto::access::ClientRule,
    ) -> Reply<MgmtResponse> {
        if !weft_proto::access::valid_client_name(&rule.name) {
            return Err(WireError::new(
                ErrorCode::InvalidArgument,
                format!("{:?} cannot name a client", rule.name),
            ));
        }
        self.store.set_client_rule(&rule).map_err(internal)?;
        tracing::info!(?rule, "client rule set");
        Ok(MgmtResponse::Done)
    }

    pub(super) fn remove_client_rule(&self, name: String) -> Reply<MgmtResponse> {
        if !self.store.remove_client_rule(&name).map_err(internal)? {
            return Err(WireError::new(
                ErrorCode::NotFound,
                format!("client {name} has no rule"),
            ));
        }
        tracing::info!(client = %name, "client rule removed");
        Ok(MgmtResponse::Done)
    }

    pub(super) fn register_client(
        &self,
        client_name: Option<&str>,
        alias: String,
    ) -> Reply<MgmtResponse> {
        if let Some(name) = client_name {
            let held = self
                .store
                .session_owners()
                .map_err(internal)?
                .iter()
                .filter(|(_, owner)| owner == name)
                .count();
            if held >= self.sessions_per_client {
                return Err(WireError::new(
                    ErrorCode::PermissionDenied,
                    format!("client {name} holds {held} live sessions, the most one client key may (management's sessions_per_client): sessions end when their clients stop"),
                ));
            }
        }
        let client = self
            .store
            .register_client(&alias, client_name)
            .map_err(internal)?;
        self.live
            .lock()
            .expect("live state poisoned")
            .client_last_heard
            .insert(client, Instant::now());
        tracing::info!(client = %client, %alias, "client session registered");
        Ok(MgmtResponse::ClientRegistered {
            client,
            session_timeout_ms: u64::try_from(self.session_timeout.as_millis()).unwrap_or(u64::MAX),
        })
    }

    pub(super) fn client_heartbeat(
        &self,
        client_name: Option<&str>,
        client: ClientId,
        unserved: Vec<(String, u64)>,
    ) -> Reply<MgmtResponse> {
        // A client keeps alive only its own sessions (one that expired is told so
        // below, and registers again).
        if let Some(name) = client_name {
            let owners = self.store.session_owners().map_err(internal)?;
            let owned = owners
                .iter()
                .any(|(id, owner)| *id == client && owner == name);
            if !owned && self.store.client_exists(client).map_err(internal)? {
                return Err(weft_proto::access::foreign_session(name, client));
            }
        }
        if self.store.client_exists(client).map_err(internal)? {
            let mut live = self.live.lock().expect("live state poisoned");
            if !self.session_live(&live, client) {
                tracing::warn!(client = %client, "a client came back after its session expired: told so");
                return Err(WireError::new(
                    ErrorCode::UnknownSession,
                    format!(
                        "client session {client} expired: it was silent for more than {} ms, \
                         and the servers released its locks and opens",
                        self.session_timeout.as_millis()
                    ),
                ));
            }
            live.client_last_heard.insert(client, Instant::now());
            if !unserved.is_empty() {
                live.client_unserved.insert(client, unserved);
            }
            Ok(MgmtResponse::Done)
        } else {
            Err(WireError::new(
                ErrorCode::UnknownSession,
                format!("client session {client} is unknown"),
            ))
        }
    }

    pub(super) fn acquire_rename_lock(&self, holder: NodeId, token: u64) -> Reply<MgmtResponse> {
        if Instant::now() < self.rename_lock_from {
            return Err(WireError::new(
                ErrorCode::WouldBlock,
                "management started again (or its leader changed): the rename lock is \
                 granted again once the lease granted before could have run out",
            ));
        }
        let mut lock = self.rename_lock.lock().expect("rename lock poisoned");
        match *lock {
            Some((held, by, until)) if held != token && Instant::now() < until => {
                Err(WireError::new(
                    ErrorCode::WouldBlock,
                    format!("metadata node {by} holds the rename lock"),
                ))
            }
            _ => {
                *lock = Some((token, holder, Instant::now() + self.rename_lock_lease));
                Ok(MgmtResponse::Done)
            }
        }
    }

    /// Whether `client`'s session is live: heard within the session timeout (after a restart,
    /// every session counts as heard at management's start). An expired session stays
    /// expired: servers have released its locks and opens, and its client must learn that.
    pub(super) fn session_live(&self, live: &LiveState, client: ClientId) -> bool {
        let heard = live
            .client_last_heard
            .get(&client)
            .copied()
            .unwrap_or(self.started)
            .max(self.started);
        heard.elapsed() < self.session_timeout
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing;
    use super::*;

    fn rule(name: &str) -> weft_proto::access::ClientRule {
        weft_proto::access::ClientRule {
            name: name.into(),
            read_only: true,
            ..weft_proto::access::ClientRule::default()
        }
    }

    // Goal: a client identity's rule is set only under a name a key can carry, and removing
    // one that is not there says so; sessions are numbered apart, and a session of a client
    // key is its identity's.
    #[test]
    fn rules_and_sessions_are_kept_apart() {
        let fixture = testing::mgmt();
        assert_eq!(
            fixture.refused(MgmtRequest::SetClientRule {
                rule: rule("no/slash")
            }),
            ErrorCode::InvalidArgument
        );
        fixture
            .ask(MgmtRequest::SetClientRule { rule: rule("lab") })
            .expect("rule set");
        fixture
            .ask(MgmtRequest::RemoveClientRule { name: "lab".into() })
            .expect("rule removed");
        assert_eq!(
            fixture.refused(MgmtRequest::RemoveClientRule { name: "lab".into() }),
            ErrorCode::NotFound
        );
        let session = |reply: Reply<MgmtResponse>| match reply {
            Ok(MgmtResponse::ClientRegistered { client, .. }) => client,
            other => panic!("a session: {other:?}"),
        };
        let first = session(fixture.ask(MgmtRequest::RegisterClient {
            alias: "host-a".into(),
        }));
        let second = session(fixture.ask_as(
            "lab",
            MgmtRequest::RegisterClient {
                alias: "host-b".into(),
            },
        ));
        assert_ne!(first, second, "each session its own id");
        let owners = fixture.mgmt.store.session_owners().expect("owners read");
        assert_eq!(
            owners,
            vec![(second, "lab".to_string())],
            "a member's session has no owner"
        );
    }
}
