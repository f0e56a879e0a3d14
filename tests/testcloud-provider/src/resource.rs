//! Generic Terraform resource whose objects live in the [`Store`].
//!
//! [`FileResource`] implements the Terraform lifecycle (validate, plan, read,
//! create, update, delete, import) once; each resource type only describes its
//! schema, planning rules and mapping to a stored [`Record`] through [`Spec`].

use std::fmt::Display;
use std::marker::PhantomData;

use async_trait::async_trait;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tf_provider::schema::{Attribute, AttributeConstraint, AttributeType, Schema};
use tf_provider::value::{Value, ValueEmpty};
use tf_provider::{AttributePath, Diagnostics, Resource};

use std::time::Duration;

use crate::diag;
use crate::faults::{Kind, Op};
use crate::interrupt;
use crate::provider::Context;
use crate::store::{Record, Store};

/// Description of one resource type.
pub trait Spec: Send + Sync + 'static {
    /// Terraform-side state (values may be null or unknown).
    type State: Serialize + DeserializeOwned + Send;
    /// Stored form of the resource.
    type Record: Record;

    /// Terraform schema of the resource.
    fn schema() -> Schema;

    /// Checks the configuration (unknown values must be accepted).
    fn validate(diags: &mut Diagnostics, config: &Self::State) {
        let _ = (diags, config);
    }

    /// Fills defaults and computed attributes (except `id`) of a planned state.
    fn plan(planned: &mut Self::State, config: &Self::State);

    /// Attributes whose change between `prior` and `proposed` forces replacement.
    fn requires_replace(prior: &Self::State, proposed: &Self::State) -> Vec<AttributePath>;

    /// The `id` attribute.
    fn id_mut(state: &mut Self::State) -> &mut Value<String>;

    /// Record to store for a fully known state.
    fn to_record(state: &Self::State, id: String) -> Result<Self::Record, NotKnown>;

    /// State of a stored record.
    fn from_record(record: Self::Record) -> Self::State;
}

/// An attribute that must be known at apply time is null or unknown.
#[derive(Debug, thiserror::Error)]
#[error("attribute `{0}` must be known when applying")]
pub struct NotKnown(pub &'static str);

/// Value of `attr`, which must be known.
pub fn known<T: Clone>(value: &Value<T>, attr: &'static str) -> Result<T, NotKnown> {
    value.as_ref().as_option().cloned().ok_or(NotKnown(attr))
}

/// `attr` if it differs between the two values.
pub fn changed<T: PartialEq>(
    attr: &'static str,
    prior: &Value<T>,
    proposed: &Value<T>,
) -> Option<AttributePath> {
    (prior != proposed).then(|| AttributePath::new(attr))
}

/// Schema attribute helper.
pub fn attribute(
    attr_type: AttributeType,
    constraint: AttributeConstraint,
    description: &str,
) -> Attribute {
    Attribute {
        attr_type,
        constraint,
        description: description.into(),
        ..Default::default()
    }
}

/// A Terraform resource stored as JSON files, described by `S`.
pub struct FileResource<S> {
    context: Context,
    spec: PhantomData<fn() -> S>,
}

impl<S> FileResource<S> {
    pub fn new(context: Context) -> Self {
        Self {
            context,
            spec: PhantomData,
        }
    }
}

fn report(diags: &mut Diagnostics, err: impl Display) {
    diag::root_error(diags, err.to_string());
}

type Private = ValueEmpty;

#[async_trait]
impl<S: Spec> Resource for FileResource<S> {
    type State<'a> = S::State;
    type PrivateState<'a> = Private;
    type ProviderMetaState<'a> = ValueEmpty;

    fn schema(&self, _diags: &mut Diagnostics) -> Option<Schema> {
        Some(S::schema())
    }

    async fn validate<'a>(&self, diags: &mut Diagnostics, config: S::State) -> Option<()> {
        S::validate(diags, &config);
        Some(())
    }

    async fn read<'a>(
        &self,
        diags: &mut Diagnostics,
        mut state: S::State,
        private_state: Private,
        _provider_meta_state: ValueEmpty,
    ) -> Option<(S::State, Private)> {
        let Value::Value(id) = S::id_mut(&mut state).clone() else {
            return Some((state, private_state));
        };
        let Some(store) = self.context.store(diags) else {
            return Some((state, private_state));
        };
        match store.read::<S::Record>(&id) {
            Ok(Some(record)) => Some((S::from_record(record), private_state)),
            // Gone: Terraform drops it from the state and plans to recreate it.
            Ok(None) => None,
            Err(err) => {
                report(diags, err);
                Some((state, private_state))
            }
        }
    }

    async fn plan_create<'a>(
        &self,
        _diags: &mut Diagnostics,
        mut proposed_state: S::State,
        config_state: S::State,
        _provider_meta_state: ValueEmpty,
    ) -> Option<(S::State, Private)> {
        *S::id_mut(&mut proposed_state) = Value::Unknown;
        S::plan(&mut proposed_state, &config_state);
        Some((proposed_state, Private::default()))
    }

    async fn plan_update<'a>(
        &self,
        _diags: &mut Diagnostics,
        mut prior_state: S::State,
        mut proposed_state: S::State,
        config_state: S::State,
        prior_private_state: Private,
        _provider_meta_state: ValueEmpty,
    ) -> Option<(S::State, Private, Vec<AttributePath>)> {
        let replace = S::requires_replace(&prior_state, &proposed_state);
        *S::id_mut(&mut proposed_state) = std::mem::take(S::id_mut(&mut prior_state));
        S::plan(&mut proposed_state, &config_state);
        Some((proposed_state, prior_private_state, replace))
    }

    async fn plan_destroy<'a>(
        &self,
        _diags: &mut Diagnostics,
        _prior_state: S::State,
        prior_private_state: Private,
        _provider_meta_state: ValueEmpty,
    ) -> Option<Private> {
        Some(prior_private_state)
    }

    async fn create<'a>(
        &self,
        diags: &mut Diagnostics,
        planned_state: S::State,
        _config_state: S::State,
        planned_private_state: Private,
        _provider_meta_state: ValueEmpty,
    ) -> Option<(S::State, Private)> {
        let store = self.context.store(diags)?;
        let record = S::to_record(&planned_state, Store::new_id::<S::Record>())
            .map_err(|err| report(diags, err))
            .ok()?;
        let fault = store
            .take_fault::<S::Record>(record.name(), Op::Create)
            .map_err(|err| report(diags, err))
            .ok()?;
        let finished = match &fault {
            Some(f) if f.kind == Kind::Hang => std::future::pending().await,
            Some(f) if f.kind == Kind::Slow => wait_unless_interrupted(f.delay()).await,
            _ => wait_unless_interrupted(create_delay()).await,
        };
        if !finished {
            report(
                diags,
                Kind::Slow.message(S::Record::TYPE_NAME, record.name()),
            );
            return None;
        }
        store
            .create_after(&record, fault.map(|f| f.kind))
            .map_err(|err| report(diags, err))
            .ok()?;
        Some((S::from_record(record), planned_private_state))
    }

    async fn update<'a>(
        &self,
        diags: &mut Diagnostics,
        mut prior_state: S::State,
        planned_state: S::State,
        _config_state: S::State,
        planned_private_state: Private,
        _provider_meta_state: ValueEmpty,
    ) -> Option<(S::State, Private)> {
        let store = self.context.store(diags)?;
        let record = known(S::id_mut(&mut prior_state), "id")
            .and_then(|id| S::to_record(&planned_state, id))
            .map_err(|err| report(diags, err))
            .ok()?;
        store
            .update(&record)
            .map_err(|err| report(diags, err))
            .ok()?;
        Some((S::from_record(record), planned_private_state))
    }

    async fn destroy<'a>(
        &self,
        diags: &mut Diagnostics,
        mut state: S::State,
        _planned_private_state: Private,
        _provider_meta_state: ValueEmpty,
    ) -> Option<()> {
        let store = self.context.store(diags)?;
        if let Value::Value(id) = S::id_mut(&mut state) {
            store
                .delete::<S::Record>(id)
                .map_err(|err| report(diags, err))
                .ok()?;
        }
        Some(())
    }

    async fn import<'a>(&self, diags: &mut Diagnostics, id: String) -> Option<(S::State, Private)> {
        let store = self.context.store(diags)?;
        match store.read::<S::Record>(&id) {
            Ok(Some(record)) => Some((S::from_record(record), Private::default())),
            Ok(None) => {
                report(
                    diags,
                    format!(
                        "cannot import: {} {id} does not exist",
                        S::Record::TYPE_NAME
                    ),
                );
                None
            }
            Err(err) => {
                report(diags, err);
                None
            }
        }
    }
}

/// Environment variable: milliseconds every create waits before writing, so tests can catch a
/// runner in the middle of an apply.
pub const CREATE_DELAY_ENV: &str = "TESTCLOUD_CREATE_DELAY_MS";

fn create_delay() -> Duration {
    let delay = std::env::var(CREATE_DELAY_ENV)
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0);
    Duration::from_millis(delay)
}

/// Waits `delay`; false when the provider was interrupted first.
async fn wait_unless_interrupted(delay: Duration) -> bool {
    if delay.is_zero() {
        return true;
    }
    tokio::select! {
        () = tokio::time::sleep(delay) => true,
        () = interrupt::interrupted() => false,
    }
}
