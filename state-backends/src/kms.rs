//! The customer's AWS KMS key as a [`KeySource`]: each sealed object gets a data key of its
//! own from `GenerateDataKey`, unwrapped by `Decrypt`, both with the workspace as encryption
//! context (so CloudTrail shows which workspace a decryption was for, and a wrapped key moved
//! to another workspace does not unwrap).

use async_trait::async_trait;
use aws_sdk_kms::primitives::Blob;
use aws_sdk_kms::types::DataKeySpec;

use crate::WorkspaceId;
use crate::sealed::{DataKey, KeyError, KeySource};

/// The prefix of a KMS key's id in a sealed object's header.
pub const PREFIX: &str = "aws-kms:";

/// What the encryption context names the workspace by.
const CONTEXT: &str = "terrace:workspace";

/// A KMS key (id, ARN or alias) reached with `config`'s credentials (the customer's role).
#[derive(Debug, Clone)]
pub struct KmsKey {
    client: aws_sdk_kms::Client,
    key: String,
}

impl KmsKey {
    pub fn new(config: &aws_config::SdkConfig, key: &str) -> Self {
        Self {
            client: aws_sdk_kms::Client::new(config),
            key: key.to_owned(),
        }
    }
}

fn failed<E>(
    what: &str,
    e: &aws_sdk_kms::error::SdkError<E, aws_sdk_kms::config::http::HttpResponse>,
) -> KeyError
where
    E: aws_sdk_kms::error::ProvideErrorMetadata + std::error::Error + 'static,
{
    let retryable = crate::s3::may_pass(e);
    KeyError {
        message: format!("KMS {what}: {}", crate::s3::brief(e)),
        retryable,
    }
}

#[async_trait]
impl KeySource for KmsKey {
    fn id(&self) -> String {
        format!("{PREFIX}{}", self.key)
    }

    /// Any KMS key: the header names it, and the caller's permissions decide.
    fn opens(&self, id: &str) -> bool {
        id.starts_with(PREFIX)
    }

    async fn data_key(&self, ws: &WorkspaceId) -> Result<DataKey, KeyError> {
        let out = self
            .client
            .generate_data_key()
            .key_id(&self.key)
            .key_spec(DataKeySpec::Aes256)
            .encryption_context(CONTEXT, ws.to_string())
            .send()
            .await
            .map_err(|e| failed(&format!("GenerateDataKey with {}", self.key), &e))?;
        let plain = out
            .plaintext()
            .and_then(|b| <[u8; 32]>::try_from(b.as_ref()).ok())
            .ok_or_else(|| KeyError {
                message: "KMS GenerateDataKey returned no 32-byte key".into(),
                retryable: false,
            })?;
        let wrapped = out
            .ciphertext_blob()
            .map(|b| b.as_ref().to_vec())
            .ok_or_else(|| KeyError {
                message: "KMS GenerateDataKey returned no wrapped key".into(),
                retryable: false,
            })?;
        // The key's ARN as KMS answers it: an alias pointed elsewhere later still finds it.
        let id = format!("{PREFIX}{}", out.key_id().unwrap_or(&self.key));
        Ok(DataKey {
            key: plain,
            wrapped,
            id,
        })
    }

    async fn unwrap(
        &self,
        id: &str,
        ws: &WorkspaceId,
        wrapped: &[u8],
    ) -> Result<[u8; 32], KeyError> {
        let key = id.strip_prefix(PREFIX).unwrap_or(id);
        let out = self
            .client
            .decrypt()
            .key_id(key)
            .ciphertext_blob(Blob::new(wrapped))
            .encryption_context(CONTEXT, ws.to_string())
            .send()
            .await
            .map_err(|e| failed(&format!("Decrypt with {key}"), &e))?;
        out.plaintext()
            .and_then(|b| <[u8; 32]>::try_from(b.as_ref()).ok())
            .ok_or_else(|| KeyError {
                message: "KMS Decrypt returned no 32-byte key".into(),
                retryable: false,
            })
    }
}
