//! The sweeps, run by hand over the store: `backup` and `drift`.

use std::path::Path;

use anyhow::Context as _;

use crate::cli::Global;
use crate::exit;

/// `terrace backup`: the backup sweep over the store, with this retention.
pub(crate) async fn backup(g: &Global, hourly: usize, daily: usize) -> anyhow::Result<u8> {
    let store = g.open_store().await?;
    let keep = shared::sweeps::backup::Retention { hourly, daily };
    let report =
        shared::sweeps::backup::sweep(&*store, time::OffsetDateTime::now_utc(), keep).await?;
    for (ws, b) in &report.backed_up {
        outln!("{ws}: backed up version {} as {}", b.version, b.label);
    }
    for (ws, label) in &report.pruned {
        outln!("{ws}: dropped backup {label} (retention)");
    }
    for (ws, why) in &report.failed {
        eprintln!("{ws}: not backed up: {why}");
    }
    let plans = shared::sweeps::plans::sweep(&*store, time::OffsetDateTime::now_utc()).await?;
    for (ws, plan) in &plans.deleted {
        outln!("{ws}: deleted plan {plan} (expired)");
    }
    for (ws, why) in &plans.failed {
        eprintln!("{ws}: expired plans not deleted: {why}");
    }
    outln!(
        "{} changed, {} backed up, {} unchanged, {} dropped, {} failed; {} expired plans deleted",
        report.changed,
        report.backed_up.len(),
        report.unchanged.len(),
        report.pruned.len(),
        report.failed.len() + plans.failed.len(),
        plans.deleted.len()
    );
    Ok(if report.failed.is_empty() && plans.failed.is_empty() {
        exit::OK
    } else {
        exit::FAILED
    })
}

pub(crate) async fn drift(g: &Global, queue: &Path, sign: Option<&Path>) -> anyhow::Result<u8> {
    let key = match sign.map(crate::submit_cmd::signing_key).transpose() {
        Ok(key) => key,
        Err(why) => {
            eprintln!("error: {why}");
            return Ok(exit::USAGE);
        }
    };
    #[cfg(feature = "amqp")]
    let broker = match queue.to_str().filter(|q| q.contains("://")) {
        Some(url) => match crate::serve::amqp::Broker::parse(url)
            .and_then(|b| Ok((b, crate::serve::amqp::Credentials::from_env()?)))
        {
            Ok(broker) => Some(broker),
            Err(why) => {
                eprintln!("error: --queue: {why}");
                return Ok(exit::USAGE);
            }
        },
        None => None,
    };
    #[cfg(not(feature = "amqp"))]
    let broker: Option<std::convert::Infallible> = None;
    let store = g.open_store().await?;
    let plan =
        shared::sweeps::drift::plan(&*store, time::OffsetDateTime::now_utc(), usize::MAX).await?;
    if broker.is_none() {
        std::fs::create_dir_all(queue)
            .with_context(|| format!("cannot create the queue folder {}", queue.display()))?;
    }
    let mut not_sent = 0;
    for (ws, job) in &plan.jobs {
        let id = job.0["id"].as_str().unwrap_or("drift").to_owned();
        let name = format!("{id}--{}--{}.json", ws.tenant(), ws.workspace());
        // Written under a hidden name first: `serve` never sees half a file.
        let partial = queue.join(format!(".{name}.partial"));
        let mut job = job.0.clone();
        if let Some(key) = &key
            && let Err(why) = key.sign(
                shared::job::signature::Kind::Job,
                &mut job,
                time::OffsetDateTime::now_utc(),
            )
        {
            eprintln!("{ws}: not queued: --sign: {why}");
            continue;
        }
        #[cfg(feature = "amqp")]
        if let Some((broker, credentials)) = &broker {
            let message = serde_json::json!({ "job": job }).to_string();
            match crate::serve::amqp::send(broker, credentials, message.as_bytes()).await {
                Ok(()) => outln!("{ws}: drift check {id} queued on {}", broker.jobs),
                Err(why) => {
                    eprintln!("{ws}: not queued: {why}");
                    not_sent += 1;
                }
            }
            continue;
        }
        std::fs::write(&partial, serde_json::to_vec_pretty(&job)?)
            .with_context(|| format!("cannot write {}", partial.display()))?;
        std::fs::rename(&partial, queue.join(&name))?;
        outln!("{ws}: drift check queued as {name}");
    }
    for (ws, names) in &plan.needs_secrets {
        eprintln!(
            "{ws}: not queued: its last apply had sensitive variables ({}); send its drift check with their values",
            names.join(", ")
        );
    }
    for (ws, why) in &plan.failed {
        eprintln!("{ws}: not queued: {why}");
    }
    outln!(
        "{} queued, {} need secrets, {} never applied, {} failed",
        plan.jobs.len() - not_sent,
        plan.needs_secrets.len(),
        plan.never_applied,
        plan.failed.len()
    );
    Ok(if plan.failed.is_empty() && not_sent == 0 {
        exit::OK
    } else {
        exit::FAILED
    })
}
