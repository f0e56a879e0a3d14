//! `testcloud_cluster`: a cluster of nodes attached to a network.
//!
//! Changing `name`, `region` or `network_id` replaces the cluster;
//! `node_count` and `instance_type` are updated in place.

use serde::{Deserialize, Serialize};
use tf_provider::schema::{AttributeConstraint, AttributeType, Block, Schema};
use tf_provider::value::Value;
use tf_provider::{AttributePath, Diagnostics, map};

use crate::diag;
use crate::resource::{NotKnown, Spec, attribute, changed, known};
use crate::store::Record;

/// Instance type used when the configuration does not set one.
pub const DEFAULT_INSTANCE_TYPE: &str = "small";

/// Terraform state of a cluster.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ClusterState {
    pub id: Value<String>,
    pub name: Value<String>,
    pub network_id: Value<String>,
    pub region: Value<String>,
    /// A Terraform number: floats are accepted here so that `validate` can
    /// reject fractional counts with a clear message.
    pub node_count: Value<f64>,
    pub instance_type: Value<String>,
    pub endpoint: Value<String>,
}

/// A cluster as stored in `<root>/cluster/<id>.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClusterRecord {
    pub id: String,
    pub name: String,
    pub network_id: String,
    pub region: String,
    pub node_count: i64,
    pub instance_type: String,
    pub endpoint: String,
}

impl Record for ClusterRecord {
    const TYPE_NAME: &'static str = "testcloud_cluster";
    const DIR: &'static str = "cluster";
    const ID_PREFIX: &'static str = "cls";

    fn id(&self) -> &str {
        &self.id
    }
    fn name(&self) -> &str {
        &self.name
    }
}

/// `https://<name>.<region>.testcloud.local`
fn endpoint(name: &str, region: &str) -> String {
    format!("https://{name}.{region}.testcloud.local")
}

/// The `testcloud_cluster` resource type.
pub struct Cluster;

impl Spec for Cluster {
    type State = ClusterState;
    type Record = ClusterRecord;

    fn schema() -> Schema {
        use AttributeConstraint::{Computed, OptionalComputed, Required};
        use AttributeType::{Number, String};
        Schema {
            version: 1,
            block: Block {
                description: "A cluster of the fake cloud.".into(),
                attributes: map! {
                    "id" => attribute(String, Computed, "Cluster id (`cls-<8 hex>`)."),
                    "name" => attribute(String, Required, "Unique name; changing it replaces the cluster."),
                    "network_id" => attribute(String, Required, "Id of the network; changing it replaces the cluster."),
                    "region" => attribute(String, Required, "Region; changing it replaces the cluster."),
                    "node_count" => attribute(Number, Required, "Number of nodes (integer, at least 1)."),
                    "instance_type" => attribute(String, OptionalComputed, "Instance type (default `small`)."),
                    "endpoint" => attribute(String, Computed, "`https://<name>.<region>.testcloud.local`."),
                },
                ..Default::default()
            },
        }
    }

    fn validate(diags: &mut Diagnostics, config: &ClusterState) {
        let Value::Value(count) = config.node_count else {
            return;
        };
        if count.fract() != 0.0 {
            diag::error(
                diags,
                "node_count must be a whole number",
                format!("node_count is {count}."),
                AttributePath::new("node_count"),
            );
        } else if count < 1.0 {
            diag::error(
                diags,
                "node_count must be at least 1",
                format!("node_count is {count}; a cluster needs at least one node."),
                AttributePath::new("node_count"),
            );
        }
    }

    fn plan(planned: &mut ClusterState, config: &ClusterState) {
        if config.instance_type.is_null() {
            planned.instance_type = Value::Value(DEFAULT_INSTANCE_TYPE.to_owned());
        }
        planned.endpoint = match (&planned.name, &planned.region) {
            (Value::Value(name), Value::Value(region)) => Value::Value(endpoint(name, region)),
            _ => Value::Unknown,
        };
    }

    fn requires_replace(prior: &ClusterState, proposed: &ClusterState) -> Vec<AttributePath> {
        [
            changed("name", &prior.name, &proposed.name),
            changed("region", &prior.region, &proposed.region),
            changed("network_id", &prior.network_id, &proposed.network_id),
        ]
        .into_iter()
        .flatten()
        .collect()
    }

    fn id_mut(state: &mut ClusterState) -> &mut Value<String> {
        &mut state.id
    }

    fn to_record(state: &ClusterState, id: String) -> Result<ClusterRecord, NotKnown> {
        let name = known(&state.name, "name")?;
        let region = known(&state.region, "region")?;
        Ok(ClusterRecord {
            id,
            endpoint: endpoint(&name, &region),
            name,
            region,
            network_id: known(&state.network_id, "network_id")?,
            // Whole number (checked by `validate`).
            node_count: known(&state.node_count, "node_count")? as i64,
            instance_type: known(&state.instance_type, "instance_type")?,
        })
    }

    fn from_record(record: ClusterRecord) -> ClusterState {
        ClusterState {
            id: Value::Value(record.id),
            name: Value::Value(record.name),
            network_id: Value::Value(record.network_id),
            region: Value::Value(record.region),
            node_count: Value::Value(record.node_count as f64),
            instance_type: Value::Value(record.instance_type),
            endpoint: Value::Value(record.endpoint),
        }
    }
}
