//! The lease rules every backend applies under its own atomic primitive: who may take, renew,
//! release or break a workspace's lease, and whether a fence is still good.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use crate::{Fence, Lease, LeaseRequest};

/// What a backend records about a workspace's lease: the holder, and the last fencing token
/// handed out (kept after release so tokens only grow).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseRecord {
    pub last_fence: u64,
    pub held: Option<Lease>,
    /// The workspace's newest version when its lease was last let go by a holder that knew
    /// it for sure: nothing of its own still being written, the convenience copy of that very
    /// version made (see [`crate::objects::BucketStore`]). The next taker then reads the copy
    /// alone, without probing for a version after it. Taking the lease clears it, so it only
    /// ever speaks of the release just before; a lease taken over after it expired has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settled: Option<u64>,
}

pub(crate) fn plus(now: OffsetDateTime, ttl: Duration) -> OffsetDateTime {
    // A TTL past the calendar's end is "a century": long enough, and no overflow.
    time::Duration::try_from(ttl)
        .ok()
        .and_then(|d| now.checked_add(d))
        .unwrap_or_else(|| now + time::Duration::days(36_500))
}

impl LeaseRecord {
    /// Takes the lease for `request` when it is free or expired; else returns the live holder.
    pub fn acquire(
        &mut self,
        request: &LeaseRequest,
        now: OffsetDateTime,
    ) -> Result<Lease, Box<Lease>> {
        if let Some(holder) = &self.held
            && !holder.is_expired_at(now)
        {
            return Err(Box::new(holder.clone()));
        }
        self.last_fence += 1;
        let lease = Lease {
            owner: request.owner.clone(),
            fence: self.last_fence,
            acquired_at: now,
            expires_at: plus(now, request.ttl),
            info: request.info.clone(),
            took_over: self.held.as_ref().map(|expired| crate::TakenOver {
                owner: expired.owner.clone(),
                fence: expired.fence,
                expired_at: expired.expires_at,
            }),
        };
        self.held = Some(lease.clone());
        self.settled = None;
        Ok(lease)
    }

    /// Checks that `fence` is the live lease at `now`; the error says why not.
    pub fn check(&self, fence: &Fence, now: OffsetDateTime) -> Result<&Lease, String> {
        let Some(held) = &self.held else {
            return Err(if fence.token <= self.last_fence {
                "the lease was released or broken".to_owned()
            } else {
                "no lease is held".to_owned()
            });
        };
        if held.fence != fence.token || held.owner != fence.owner {
            return Err(format!(
                "the lease is now held by {} with fence {}",
                held.owner, held.fence
            ));
        }
        if held.is_expired_at(now) {
            return Err(format!(
                "the lease expired at {}",
                crate::display_time(held.expires_at)
            ));
        }
        Ok(held)
    }

    /// Extends the live lease `lease` by `ttl` from `now`.
    pub fn renew(
        &mut self,
        lease: &Lease,
        ttl: Duration,
        now: OffsetDateTime,
    ) -> Result<Lease, String> {
        self.check(&lease.fence(), now)?;
        let held = self.held.as_mut().expect("checked above");
        held.expires_at = plus(now, ttl);
        Ok(held.clone())
    }

    /// Gives back `lease` if it is still the recorded one (live or expired), with what its
    /// holder knows of the newest version (see [`LeaseRecord::settled`]). Returns whether
    /// anything changed.
    pub fn release(&mut self, lease: &Lease, settled: Option<u64>) -> bool {
        match &self.held {
            Some(held) if held.fence == lease.fence && held.owner == lease.owner => {
                self.held = None;
                self.settled = settled;
                true
            }
            _ => false,
        }
    }

    /// Removes the lease held, or only the one with fence `only` when given; returns what
    /// was removed.
    pub fn break_lease(&mut self, only: Option<u64>) -> Option<Lease> {
        match (&self.held, only) {
            (Some(held), Some(fence)) if held.fence != fence => None,
            _ => {
                self.settled = None;
                self.held.take()
            }
        }
    }
}

/// The preconditions of a write for stores that check them under their own lock (`fs`,
/// `memory`): the fence, when given, is the live lease; the current version is as `mode` says.
pub(crate) fn check_put(
    ws: &crate::WorkspaceId,
    record: &LeaseRecord,
    current: Option<&crate::VersionToken>,
    mode: &crate::PutMode,
    fence: Option<&Fence>,
) -> crate::Result<()> {
    use crate::{PutMode, StoreError};
    if let Some(fence) = fence {
        record
            .check(fence, OffsetDateTime::now_utc())
            .map_err(|reason| StoreError::LeaseLost {
                workspace: ws.clone(),
                owner: fence.owner.clone(),
                fence: fence.token,
                reason,
            })?;
    }
    let ok = match mode {
        PutMode::Create => current.is_none(),
        PutMode::Update(expected) => current == Some(expected),
    };
    if !ok {
        let describe = |t: Option<&crate::VersionToken>| {
            t.map_or_else(|| "no state".to_owned(), |t| format!("version {t}"))
        };
        let wanted = match mode {
            PutMode::Create => describe(None),
            PutMode::Update(t) => describe(Some(t)),
        };
        return Err(StoreError::Conflict {
            workspace: ws.clone(),
            detail: format!("expected {wanted}, found {}", describe(current)),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(owner: &str, secs: u64) -> LeaseRequest {
        LeaseRequest {
            owner: owner.into(),
            ttl: Duration::from_secs(secs),
            info: serde_json::Value::Null,
        }
    }

    #[test]
    fn fence_grows_and_expired_leases_are_taken_over() {
        let t0 = OffsetDateTime::UNIX_EPOCH;
        let mut rec = LeaseRecord::default();
        let a = rec.acquire(&req("a", 10), t0).unwrap();
        assert_eq!(a.fence, 1);
        assert_eq!(rec.acquire(&req("b", 10), t0).unwrap_err().owner, "a");
        let later = t0 + time::Duration::seconds(11);
        assert!(
            rec.check(&a.fence(), later)
                .unwrap_err()
                .contains("expired")
        );
        let b = rec.acquire(&req("b", 10), later).unwrap();
        assert_eq!(b.fence, 2);
        assert_eq!(
            b.took_over.as_ref().map(|t| (t.owner.as_str(), t.fence)),
            Some(("a", 1))
        );
        assert!(
            rec.check(&a.fence(), later)
                .unwrap_err()
                .contains("held by b")
        );
        assert!(
            !rec.release(&a, Some(7)),
            "a stale holder must not release the new lease"
        );
        assert_eq!(rec.settled, None, "nor say what is settled");
        assert!(rec.release(&b, Some(7)));
        assert_eq!(rec.settled, Some(7));
        assert!(
            rec.check(&b.fence(), later)
                .unwrap_err()
                .contains("released")
        );
        let c = rec.acquire(&req("c", 1), later).unwrap();
        assert_eq!(c.fence, 3);
        assert!(c.took_over.is_none(), "a released lease is not taken over");
        assert_eq!(
            rec.settled, None,
            "taking the lease clears what its release said"
        );
        let later = later + time::Duration::seconds(2);
        let d = rec.acquire(&req("d", 1), later).unwrap();
        assert!(d.took_over.is_some());
        assert_eq!(
            rec.settled, None,
            "an expired lease taken over says nothing settled"
        );
    }
}
