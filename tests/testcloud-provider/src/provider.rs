//! The `testcloud` provider: configuration (`root` folder) and resource registry.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, PoisonError, RwLock};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tf_provider::schema::{Attribute, AttributeConstraint, AttributeType, Block, Schema};
use tf_provider::value::{Value, ValueEmpty};
use tf_provider::{AttributePath, Diagnostics, DynamicResource, Provider, map};

use crate::cluster::Cluster;
use crate::diag;
use crate::network::Network;
use crate::resource::FileResource;
use crate::store::Store;

/// Environment variable used when the provider block has no `root`.
pub const ROOT_ENV: &str = "TESTCLOUD_ROOT";

/// Provider configuration block.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Config {
    pub root: Value<String>,
}

/// Provider configuration shared with the resources (they are created before
/// `configure` runs, so they hold this handle rather than a [`Store`]).
#[derive(Debug, Clone, Default)]
pub struct Context {
    root: Arc<RwLock<Option<PathBuf>>>,
}

impl Context {
    /// Store of the configured root folder, or an error diagnostic.
    pub fn store(&self, diags: &mut Diagnostics) -> Option<Store> {
        let root = self
            .root
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if root.is_none() {
            diag::root_error(diags, "testcloud provider is not configured");
        }
        root.map(Store::new)
    }

    fn set_root(&self, root: PathBuf) {
        *self.root.write().unwrap_or_else(PoisonError::into_inner) = Some(root);
    }
}

/// The provider.
#[derive(Debug, Clone, Default)]
pub struct TestCloudProvider {
    context: Context,
}

#[async_trait]
impl Provider for TestCloudProvider {
    type Config<'a> = Config;
    type MetaState<'a> = ValueEmpty;

    fn schema(&self, _diags: &mut Diagnostics) -> Option<Schema> {
        Some(Schema {
            version: 1,
            block: Block {
                description: "Fake cloud whose resources are JSON files in a folder.".into(),
                attributes: map! {
                    "root" => Attribute {
                        attr_type: AttributeType::String,
                        description: format!(
                            "Folder holding the resources (defaults to ${ROOT_ENV})."
                        )
                        .into(),
                        constraint: AttributeConstraint::Optional,
                        ..Default::default()
                    },
                },
                ..Default::default()
            },
        })
    }

    async fn configure<'a>(
        &self,
        diags: &mut Diagnostics,
        _terraform_version: String,
        config: Self::Config<'a>,
    ) -> Option<()> {
        let root = match config.root {
            Value::Value(root) => Some(root),
            Value::Null => std::env::var(ROOT_ENV).ok(),
            Value::Unknown => {
                diag::error(
                    diags,
                    "testcloud root folder is unknown",
                    "`root` must be known when the provider is configured.",
                    AttributePath::new("root"),
                );
                return Some(());
            }
        };
        match root.filter(|root| !root.is_empty()) {
            Some(root) => self.context.set_root(root.into()),
            None => diag::error(
                diags,
                "testcloud root folder is not set",
                format!(
                    "Set `root` in the provider \"testcloud\" block or the {ROOT_ENV} environment variable."
                ),
                AttributePath::new("root"),
            ),
        }
        Some(())
    }

    fn get_resources(
        &self,
        _diags: &mut Diagnostics,
    ) -> Option<HashMap<String, Box<dyn DynamicResource>>> {
        // The server prefixes these names with the provider name: `testcloud_network`, ...
        Some(map! {
            "network" => FileResource::<Network>::new(self.context.clone()),
            "cluster" => FileResource::<Cluster>::new(self.context.clone()),
        })
    }
}
