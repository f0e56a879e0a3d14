//! The job's fence as its writes carry it: vouched for ([`Fence::confirmed_until`]) while the
//! runner's watchdog has not found the lease lost, so that a write needs no read of the lease
//! first. One value, shared by the runner's own writes and the state server's.

use std::time::Duration;

use state_backends::Fence;
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;

/// A job's fence and the token fired when its lease is lost or cannot be confirmed.
///
/// Until `lost` fires, the lease is the runner's own for at least `ahead` more by this
/// machine's clock (the watchdog fires `lost` earlier than that before the lease could expire),
/// so each [`Vouched::fence`] is vouched for that far ahead. Without `ahead`
/// ([`Vouched::unvouched`]) every write reads the lease first.
#[derive(Clone, Debug)]
pub struct Vouched {
    fence: Fence,
    lost: CancellationToken,
    ahead: Option<Duration>,
}

impl Vouched {
    /// Vouched for `ahead` while `lost` has not fired: only a runner whose watchdog fires `lost`
    /// at least that long before the lease could expire may say so.
    pub fn new(fence: Fence, lost: CancellationToken, ahead: Duration) -> Self {
        Self {
            fence,
            lost,
            ahead: Some(ahead),
        }
    }

    /// Never vouched for: every write reads the lease (a caller with no watchdog).
    pub fn unvouched(fence: Fence, lost: CancellationToken) -> Self {
        Self {
            fence,
            lost,
            ahead: None,
        }
    }

    /// The fence for a write now: vouched for unless the lease is lost.
    pub fn fence(&self) -> Fence {
        match self.ahead {
            Some(ahead) if !self.lost.is_cancelled() => self
                .fence
                .clone()
                .confirmed_until(OffsetDateTime::now_utc() + ahead),
            _ => self.fence.clone(),
        }
    }

    /// Fired when the lease is lost or cannot be confirmed: every write is refused from then on.
    pub fn lost(&self) -> &CancellationToken {
        &self.lost
    }

    pub fn is_lost(&self) -> bool {
        self.lost.is_cancelled()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fence() -> Fence {
        Fence {
            owner: "job-1".into(),
            token: 7,
            confirmed_until: None,
        }
    }

    #[test]
    fn vouched_until_the_lease_is_lost_and_never_when_unvouched() {
        let lost = CancellationToken::new();
        let v = Vouched::new(fence(), lost.clone(), Duration::from_secs(5));
        let until = v.fence().confirmed_until.expect("vouched while not lost");
        assert!(until > OffsetDateTime::now_utc() + Duration::from_secs(4));
        assert!(until <= OffsetDateTime::now_utc() + Duration::from_secs(5));
        lost.cancel();
        assert!(v.is_lost());
        assert_eq!(v.fence().confirmed_until, None, "never once lost");
        let plain = Vouched::unvouched(fence(), CancellationToken::new());
        assert_eq!(plain.fence().confirmed_until, None);
    }
}
