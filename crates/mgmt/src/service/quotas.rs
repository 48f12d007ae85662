//! Quotas: rules, the grants metadata homes hold of hard limits, the totals the homes count,
//! and the grace periods of soft limits.

use super::*;

impl Mgmt {
    pub(super) fn set_quota(&self, rule: weft_proto::quota::QuotaRule) -> Reply<MgmtResponse> {
        let limits = rule.limits;
        let crosses = |soft: u64, hard: u64| soft > 0 && hard > 0 && soft > hard;
        if crosses(limits.soft_bytes, limits.hard_bytes)
            || crosses(limits.soft_inodes, limits.hard_inodes)
        {
            return Err(WireError::new(
                ErrorCode::InvalidArgument,
                "a soft quota limit must not be above its hard one",
            ));
        }
        self.store.set_quota(&rule).map_err(internal)?;
        tracing::info!(?rule, "quota set");
        Ok(MgmtResponse::Done)
    }

    pub(super) fn grant_quota(
        &self,
        home: NodeId,
        key: weft_proto::quota::QuotaKey,
        bytes: u64,
        inodes: u64,
    ) -> Reply<MgmtResponse> {
        let (bytes, inodes) = self
            .store
            .grant_quota(key, home, (bytes, inodes))
            .map_err(internal)?;
        Ok(MgmtResponse::QuotaGranted { bytes, inodes })
    }

    /// What each user and group uses in each pool, summed over the metadata homes as they
    /// last reported.
    pub(super) fn quota_totals(&self) -> HashMap<(QuotaKind, u32, StoragePoolId), (u64, u64)> {
        let live = self.live.lock().expect("live state poisoned");
        let mut totals: HashMap<_, (u64, u64)> = HashMap::new();
        for row in live.home_usage.values().flatten() {
            let total = totals.entry((row.kind, row.id, row.pool)).or_default();
            total.0 += row.bytes;
            total.1 += row.inodes;
        }
        totals
    }

    /// Every quota rule with what its user or group uses, its grace periods and whether it
    /// is blocked.
    pub(super) fn quota_states(&self) -> Result<Vec<weft_proto::quota::QuotaState>, MgmtError> {
        let totals = self.quota_totals();
        let now = unix_seconds();
        let grace = self.quota_grace_period.as_secs();
        let mut states = Vec::new();
        for (rule, since) in self.store.quota_rules()? {
            let (bytes, inodes) = totals
                .get(&(rule.kind, rule.id, rule.pool))
                .copied()
                .unwrap_or_default();
            let limits = rule.limits;
            let ends = |over: bool, since: Option<u64>| since.filter(|_| over).map(|s| s + grace);
            let bytes_grace_ends =
                ends(limits.soft_bytes > 0 && bytes > limits.soft_bytes, since[0]);
            let inodes_grace_ends = ends(
                limits.soft_inodes > 0 && inodes > limits.soft_inodes,
                since[1],
            );
            states.push(weft_proto::quota::QuotaState {
                rule,
                bytes,
                inodes,
                bytes_grace_ends,
                inodes_grace_ends,
                bytes_blocked: (limits.hard_bytes > 0 && bytes >= limits.hard_bytes)
                    || bytes_grace_ends.is_some_and(|end| now >= end),
                inodes_blocked: (limits.hard_inodes > 0 && inodes >= limits.hard_inodes)
                    || inodes_grace_ends.is_some_and(|end| now >= end),
            });
        }
        Ok(states)
    }

    /// Starts the grace period of every soft limit newly exceeded, and ends those of limits
    /// no longer exceeded.
    pub(super) fn run_quota_grace(&self) -> Result<(), MgmtError> {
        let totals = self.quota_totals();
        let now = unix_seconds();
        for (rule, since) in self.store.quota_rules()? {
            let (bytes, inodes) = totals
                .get(&(rule.kind, rule.id, rule.pool))
                .copied()
                .unwrap_or_default();
            let limits = rule.limits;
            for (what, soft, used) in [
                (0, limits.soft_bytes, bytes),
                (1, limits.soft_inodes, inodes),
            ] {
                let over = soft > 0 && used > soft;
                if over != since[usize::from(what)].is_some() {
                    self.store.set_grace(&rule, what, over.then_some(now))?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing;
    use super::*;
    use weft_proto::quota::{QuotaKey, QuotaKind, QuotaLimits, QuotaRule};

    // Goal: a quota rule set is listed, and the homes are granted no more of a hard limit
    // together than the limit: a second home asking for all of it gets what the first left.
    #[test]
    fn grants_of_a_hard_limit_stay_within_it() {
        let fixture = testing::mgmt();
        let key = QuotaKey {
            kind: QuotaKind::User,
            id: 1000,
            pool: StoragePoolId::DEFAULT,
        };
        let limits = QuotaLimits {
            hard_bytes: 100,
            ..QuotaLimits::default()
        };
        fixture
            .ask(MgmtRequest::SetQuota {
                rule: QuotaRule {
                    kind: key.kind,
                    id: key.id,
                    pool: key.pool,
                    limits,
                },
            })
            .expect("quota set");
        match fixture.ask(MgmtRequest::GetQuotas) {
            Ok(MgmtResponse::Quotas(states)) => {
                assert!(
                    states.iter().any(|state| state.rule.limits == limits),
                    "{states:?}"
                );
            }
            other => panic!("quotas: {other:?}"),
        }
        let grant = |home: u32, bytes: u64| match fixture.ask(MgmtRequest::GrantQuota {
            home: NodeId(home),
            key,
            bytes,
            inodes: 0,
        }) {
            Ok(MgmtResponse::QuotaGranted { bytes, .. }) => bytes,
            other => panic!("a grant: {other:?}"),
        };
        assert_eq!(grant(1, 70), 70);
        assert_eq!(grant(2, 100), 30, "what home 1 holds is not granted again");
    }
}
