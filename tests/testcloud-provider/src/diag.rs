//! Diagnostic helpers.
//!
//! `tf_provider::Diagnostic::new` appends a backtrace to the detail whenever
//! `RUST_BACKTRACE` is set (Terraform passes its environment to providers), which
//! buries short messages; these helpers build diagnostics without it.

use std::borrow::Cow;

use tf_provider::{AttributePath, Diagnostic, Diagnostics};

/// Adds an error about `attribute`.
pub fn error(
    diags: &mut Diagnostics,
    summary: impl Into<Cow<'static, str>>,
    detail: impl Into<Cow<'static, str>>,
    attribute: AttributePath,
) {
    diags.add_error(Diagnostic {
        summary: summary.into(),
        detail: detail.into(),
        attribute,
    });
}

/// Adds an error that is not about a specific attribute.
pub fn root_error(diags: &mut Diagnostics, summary: impl Into<Cow<'static, str>>) {
    error(diags, summary, "", AttributePath::root());
}
