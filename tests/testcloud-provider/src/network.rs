//! `testcloud_network`: a named network with a CIDR block.
//!
//! Changing `name` replaces the network; `cidr` is updated in place.

use serde::{Deserialize, Serialize};
use tf_provider::schema::{AttributeConstraint, AttributeType, Block, Schema};
use tf_provider::value::Value;
use tf_provider::{AttributePath, map};

use crate::resource::{NotKnown, Spec, attribute, changed, known};
use crate::store::Record;

/// CIDR used when the configuration does not set one.
pub const DEFAULT_CIDR: &str = "10.0.0.0/16";

/// Terraform state of a network.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct NetworkState {
    pub id: Value<String>,
    pub name: Value<String>,
    pub cidr: Value<String>,
}

/// A network as stored in `<root>/network/<id>.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NetworkRecord {
    pub id: String,
    pub name: String,
    pub cidr: String,
}

impl Record for NetworkRecord {
    const TYPE_NAME: &'static str = "testcloud_network";
    const DIR: &'static str = "network";
    const ID_PREFIX: &'static str = "net";

    fn id(&self) -> &str {
        &self.id
    }
    fn name(&self) -> &str {
        &self.name
    }
}

/// The `testcloud_network` resource type.
pub struct Network;

impl Spec for Network {
    type State = NetworkState;
    type Record = NetworkRecord;

    fn schema() -> Schema {
        use AttributeConstraint::{Computed, OptionalComputed, Required};
        Schema {
            version: 1,
            block: Block {
                description: "A network of the fake cloud.".into(),
                attributes: map! {
                    "id" => attribute(AttributeType::String, Computed, "Network id (`net-<8 hex>`)."),
                    "name" => attribute(AttributeType::String, Required, "Unique name; changing it replaces the network."),
                    "cidr" => attribute(AttributeType::String, OptionalComputed, "Address range (default `10.0.0.0/16`)."),
                },
                ..Default::default()
            },
        }
    }

    fn plan(planned: &mut NetworkState, config: &NetworkState) {
        if config.cidr.is_null() {
            planned.cidr = Value::Value(DEFAULT_CIDR.to_owned());
        }
    }

    fn requires_replace(prior: &NetworkState, proposed: &NetworkState) -> Vec<AttributePath> {
        changed("name", &prior.name, &proposed.name)
            .into_iter()
            .collect()
    }

    fn id_mut(state: &mut NetworkState) -> &mut Value<String> {
        &mut state.id
    }

    fn to_record(state: &NetworkState, id: String) -> Result<NetworkRecord, NotKnown> {
        Ok(NetworkRecord {
            id,
            name: known(&state.name, "name")?,
            cidr: known(&state.cidr, "cidr")?,
        })
    }

    fn from_record(record: NetworkRecord) -> NetworkState {
        NetworkState {
            id: Value::Value(record.id),
            name: Value::Value(record.name),
            cidr: Value::Value(record.cidr),
        }
    }
}
