//! The methods of terraform's HTTP backend protocol, each checked before the store is
//! touched: GET the state, POST a new one (checked as a successor, fenced by the lease), DELETE,
//! LOCK and UNLOCK (the job's lease stands for terraform's lock).

use axum::body::Bytes;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use state_backends::tfstate::{StateMeta, WriteCheck, check_successor};
use state_backends::{CurrentState, NewState, PutMode, StoreError};

use super::{Handled, Refusal, Shared};

pub(super) async fn get(shared: &Shared) -> Handled {
    shared
        .settle_doubt()
        .await
        .map_err(|e| Refusal::from_store(&e))?;
    match shared.current().await {
        Ok(Some(current)) => Ok((
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            current.data,
        )
            .into_response()),
        Ok(None) => Ok(StatusCode::NO_CONTENT.into_response()),
        Err(e) => Err(Refusal::from_store(&e)),
    }
}

/// Checks that a write names terraform's current lock, when one is held.
async fn check_lock_id(shared: &Shared, id: Option<&str>) -> Result<(), Refusal> {
    let lock = shared.lock.lock().await;
    if let Some(held) = lock.as_ref() {
        let held_id = held.get("ID").and_then(|v| v.as_str()).unwrap_or_default();
        if id != Some(held_id) {
            return Err(Refusal::new(
                StatusCode::CONFLICT,
                format!("the state is locked by terraform lock {held_id}, the write names {id:?}"),
            ));
        }
    }
    Ok(())
}

pub(super) async fn post(shared: &Shared, lock_id: Option<&str>, body: Bytes) -> Handled {
    check_lock_id(shared, lock_id).await?;
    write_state(shared, body).await?;
    Ok(StatusCode::OK.into_response())
}

/// A checked, fenced write: the version it made, `None` when the state was already current.
pub(super) async fn write_state(shared: &Shared, body: Bytes) -> Result<Option<u64>, Refusal> {
    let written = checked_write(shared, body).await;
    match written {
        Ok(Some(current)) => {
            let number = current.version.number;
            shared.know_current(Some(current));
            Ok(Some(number))
        }
        Ok(None) => Ok(None),
        Err(refused) => {
            // Refused, perhaps on a stale view: read afresh next time.
            shared.forget_current();
            Err(refused)
        }
    }
}

/// A version write on its way: unless it is answered, or refused for sure, it is left in doubt
/// ([`Shared::doubt`]) when dropped, as when terraform is killed and its request with it.
struct Sending<'a> {
    shared: &'a Shared,
    body: &'a Bytes,
    after: Option<u64>,
    answered: bool,
}

impl Drop for Sending<'_> {
    fn drop(&mut self) {
        if !self.answered {
            self.shared
                .doubt(state_backends::sha256_hex(self.body), self.after);
        }
    }
}

/// Whether a failed write may still have landed: anything but a refusal the store made before
/// sending it or a condition that it failed.
fn may_have_landed(e: &StoreError) -> bool {
    !matches!(
        e,
        StoreError::Conflict { .. }
            | StoreError::LeaseHeld { .. }
            | StoreError::LeaseLost { .. }
            | StoreError::InvalidState(_)
            | StoreError::OtherLineage { .. }
            | StoreError::InvalidKey(_)
            | StoreError::NotFound { .. }
    )
}

/// The state written, as the current one, or `None` when it was already current.
async fn checked_write(shared: &Shared, body: Bytes) -> Result<Option<CurrentState>, Refusal> {
    let c = &shared.config;
    let meta = StateMeta::parse(&body)
        .map_err(|e| Refusal::new(StatusCode::BAD_REQUEST, format!("state write refused: {e}")))?;
    // An earlier write whose answer was lost may hold this very state: terraform sends a POST
    // again after a 503. Then it is this write's version, already stored.
    let landed = shared
        .settle_doubt()
        .await
        .map_err(|e| Refusal::from_store(&e))?
        .filter(|cur| cur.version.sha256 == state_backends::sha256_hex(&body));
    if landed.is_some() {
        check_lease(shared).await?;
        return Ok(landed);
    }
    let current = shared
        .current()
        .await
        .map_err(|e| Refusal::from_store(&e))?;
    let current_meta = match &current {
        Some(cur) => Some(StateMeta::parse(&cur.data).map_err(|e| {
            Refusal::new(
                StatusCode::CONFLICT,
                format!("the current state is unreadable: {e}"),
            )
        })?),
        None => None,
    };
    let check = check_successor(
        current
            .as_ref()
            .zip(current_meta.as_ref())
            .map(|(cur, m)| (m, &cur.data[..])),
        &meta,
        &body,
    )
    .map_err(|e| Refusal::new(StatusCode::CONFLICT, format!("state write refused: {e}")))?;
    if check == WriteCheck::Unchanged {
        // Nothing to write, but a writer without the lease is still told so.
        check_lease(shared).await?;
        return Ok(None);
    }
    if let Some(logger) = &c.logger {
        // A create's start is stored as it happens, as evidence for the next run if this one
        // dies before its state is saved (`recover`). The state that follows the create must
        // not reach the store before that evidence does: a run killed while the write is on
        // its way would leave an object in the cloud that neither the state nor the log
        // names, and the next run could not tell it from another's.
        logger.caught_up().await;
    }
    let after = current.as_ref().map(|cur| cur.version.number);
    let mode = current.map_or(PutMode::Create, |cur| PutMode::Update(cur.token));
    let state = NewState {
        data: body.clone(),
        serial: meta.serial,
        lineage: meta.lineage,
    };
    // While the write is out the view is read afresh: a request dropped now leaves no view
    // of the state before it.
    shared.forget_current();
    let mut sending = Sending {
        shared,
        body: &body,
        after,
        answered: false,
    };
    let put = c.store.put(&c.ws, state, mode, Some(&shared.fence())).await;
    sending.answered = put.as_ref().err().is_none_or(|e| !may_have_landed(e));
    drop(sending);
    let info = put.map_err(|e| Refusal::from_store(&e))?;
    {
        let mut activity = shared.activity.lock().unwrap_or_else(|e| e.into_inner());
        activity.versions.push(info.number);
        activity.state_bytes = Some(info.size);
    }
    if let Some(logger) = &c.logger {
        logger
            .runner(
                "",
                &format!(
                    "state version {} saved (serial {})",
                    info.number, info.serial
                ),
            )
            .await;
    }
    Ok(Some(CurrentState {
        token: info.token(),
        data: body,
        version: info,
    }))
}

pub(super) async fn delete(shared: &Shared) -> Handled {
    let c = &shared.config;
    let Some(current) = shared
        .current()
        .await
        .map_err(|e| Refusal::from_store(&e))?
    else {
        return Ok(StatusCode::OK.into_response());
    };
    // Read afresh after, and while it is out: a request dropped now leaves no stale view.
    shared.forget_current();
    let deleted = c
        .store
        .delete_current(&c.ws, &current.token, Some(&shared.fence()))
        .await;
    shared.forget_current();
    deleted.map_err(|e| Refusal::from_store(&e))?;
    Ok(StatusCode::OK.into_response())
}

/// Whether the job's lease is still the live one; terraform must not lock without it.
async fn check_lease(shared: &Shared) -> Result<(), Refusal> {
    let c = &shared.config;
    let fence = shared.fence();
    if fence.is_confirmed_at(time::OffsetDateTime::now_utc()) && c.store.answering() {
        return Ok(());
    }
    let lease = c
        .store
        .lease(&c.ws)
        .await
        .map_err(|e| Refusal::from_store(&e))?;
    match lease {
        Some(l)
            if l.owner == fence.owner
                && l.fence == fence.token
                && !l.is_expired_at(time::OffsetDateTime::now_utc()) =>
        {
            Ok(())
        }
        other => {
            let holder = other.map_or_else(
                || "nobody".to_owned(),
                |l| format!("{} (fence {})", l.owner, l.fence),
            );
            let mut refusal = Refusal::new(
                StatusCode::LOCKED,
                format!(
                    "the job's lease on {} is lost; it is now held by {holder}",
                    c.ws
                ),
            );
            refusal.body = Some(serde_json::json!({
                "ID": "lease-lost",
                "Operation": "lease",
                "Info": refusal.message,
                "Who": holder,
            }));
            Err(refusal)
        }
    }
}

pub(super) async fn lock(shared: &Shared, body: Bytes) -> Handled {
    let info: serde_json::Value = serde_json::from_slice(&body).map_err(|e| {
        Refusal::new(
            StatusCode::BAD_REQUEST,
            format!("lock info is not JSON: {e}"),
        )
    })?;
    let Some(id) = info.get("ID").and_then(|v| v.as_str()).map(str::to_owned) else {
        return Err(Refusal::new(StatusCode::BAD_REQUEST, "lock info has no ID"));
    };
    check_lease(shared).await?;
    let mut lock = shared.lock.lock().await;
    if let Some(held) = lock.as_ref()
        && held.get("ID").and_then(|v| v.as_str()) != Some(id.as_str())
    {
        let mut refusal = Refusal::new(StatusCode::LOCKED, "the state is already locked");
        refusal.body = Some(held.clone());
        return Err(refusal);
    }
    *lock = Some(info);
    Ok(StatusCode::OK.into_response())
}

pub(super) async fn unlock(shared: &Shared, body: Bytes) -> Handled {
    let id = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v.get("ID").and_then(|v| v.as_str()).map(str::to_owned));
    let mut lock = shared.lock.lock().await;
    match (lock.as_ref(), id) {
        (None, _) => Ok(StatusCode::OK.into_response()),
        (Some(held), Some(id)) if held.get("ID").and_then(|v| v.as_str()) == Some(id.as_str()) => {
            *lock = None;
            Ok(StatusCode::OK.into_response())
        }
        (Some(held), _) => {
            let mut refusal = Refusal::new(StatusCode::CONFLICT, "unlock names another lock");
            refusal.body = Some(held.clone());
            Err(refusal)
        }
    }
}
