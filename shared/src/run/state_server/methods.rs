//! The methods of terraform's HTTP backend protocol, each checked before the store is
//! touched: GET the state, POST a new one (checked as a successor, fenced by the lease), DELETE,
//! LOCK and UNLOCK (the job's lease stands for terraform's lock).

use axum::body::Bytes;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use state_backends::tfstate::{StateMeta, WriteCheck, check_successor};
use state_backends::{CurrentState, NewState, PutMode};

use super::{Handled, Refusal, Shared};

pub(super) async fn get(shared: &Shared) -> Handled {
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

/// The state written, as the current one, or `None` when it was already current.
async fn checked_write(shared: &Shared, body: Bytes) -> Result<Option<CurrentState>, Refusal> {
    let c = &shared.config;
    let meta = StateMeta::parse(&body)
        .map_err(|e| Refusal::new(StatusCode::BAD_REQUEST, format!("state write refused: {e}")))?;
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
    let mode = current.map_or(PutMode::Create, |cur| PutMode::Update(cur.token));
    let state = NewState {
        data: body.clone(),
        serial: meta.serial,
        lineage: meta.lineage,
    };
    let info = c
        .store
        .put(&c.ws, state, mode, Some(&shared.fence()))
        .await
        .map_err(|e| Refusal::from_store(&e))?;
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
