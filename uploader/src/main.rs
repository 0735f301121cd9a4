//! symtrace-upload: see `symtrace-upload --help` and docs/ci.md.

mod cli;
mod client;
mod discover;
mod framepointers;
mod prepare;
mod report;

use std::collections::{BTreeMap, HashMap};
use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use futures::StreamExt;
use symtrace_elf::BuildId;

use crate::cli::Args;
use crate::client::{Client, ClientError};
use crate::prepare::{Item, Plan};
use crate::report::{FileReport, ItemReport, Status, Summary};

fn main() -> ExitCode {
    let args = Args::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("symtrace-upload: error: cannot start the runtime: {e}");
            return ExitCode::from(2);
        }
    };
    match runtime.block_on(run(args)) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("symtrace-upload: error: {e:#}");
            ExitCode::from(2)
        }
    }
}

async fn run(args: Args) -> anyhow::Result<u8> {
    let prefix_map = args.prefix_map()?;
    if !(args.server.starts_with("http://") || args.server.starts_with("https://")) {
        anyhow::bail!(
            "--server {:?} must be an http:// or https:// URL",
            args.server
        );
    }
    let temp;
    let work_dir = match &args.work_dir {
        Some(d) => {
            std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
            d.clone()
        }
        None => {
            temp = tempfile::tempdir().context("creating a temporary directory")?;
            temp.path().to_owned()
        }
    };

    // Finding, splitting and hashing are blocking work.
    let plan_args = args.clone();
    let (discovery, mut plans) = tokio::task::spawn_blocking(move || {
        let opts = prepare::Options {
            work_dir: &work_dir,
            strip: plan_args.strip && !plan_args.dry_run,
            sources: !plan_args.no_sources,
            prefix_map: &prefix_map,
            source_roots: &plan_args.source_roots,
            frame_pointers: plan_args.require_frame_pointers,
        };
        let mut found = discover::discover(&plan_args.paths);
        let mut plans: BTreeMap<BuildId, Plan> = BTreeMap::new();
        let mut queue: Vec<BuildId> = found.groups.keys().cloned().collect();
        while let Some(id) = queue.pop() {
            // A file that trips a bug fails alone, not the whole run.
            let plan = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                prepare::plan(&id, &found.groups[&id], &opts)
            }))
            .unwrap_or_else(|_| Plan {
                errors: vec![format!(
                    "{id}: internal error while preparing (please report)"
                )],
                ..Plan::default()
            });
            for alt in &plan.alt_files {
                let before: Vec<BuildId> = found.groups.keys().cloned().collect();
                discover::add_file(&mut found, alt);
                queue.extend(found.groups.keys().filter(|k| !before.contains(k)).cloned());
            }
            plans.insert(id, plan);
        }
        (found, plans)
    })
    .await?;

    let items: Vec<Item> = plans
        .values()
        .flat_map(|p| p.items.iter().cloned())
        .collect();
    let client = Client::new(
        &args.server,
        args.token.clone(),
        args.retries,
        args.compress(),
    )?;
    let mut statuses: Vec<(Status, Option<String>)> = vec![(Status::Present, None); items.len()];
    if !items.is_empty() {
        match client.missing(&items).await {
            Ok(missing) => {
                for i in missing {
                    if let Some(s) = statuses.get_mut(i) {
                        *s = (
                            if args.dry_run {
                                Status::WouldUpload
                            } else {
                                Status::Uploaded
                            },
                            None,
                        );
                    }
                }
            }
            Err(ClientError::Refused {
                status: status @ (401 | 403),
                message,
            }) => {
                eprintln!(
                    "symtrace-upload: error: the server refused the token ({status}): {message}"
                );
                return Ok(2);
            }
            Err(e) => {
                for s in statuses.iter_mut() {
                    *s = (Status::Failed, Some(e.to_string()));
                }
            }
        }
    }

    if !args.dry_run {
        upload_all(&args, &client, &items, &mut statuses).await;
        replace_stripped(&mut plans, &items, &mut statuses);
    }
    let summary = summarize(&args, &discovery, &plans, &items, &statuses);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    }
    report::print_human(&summary);
    Ok(summary.exit_code)
}

/// Uploads what the server lacks: executables and debuginfo first, then the
/// sources (the server accepts a source only once it knows the DWARF naming it).
async fn upload_all(
    args: &Args,
    client: &Client,
    items: &[Item],
    statuses: &mut [(Status, Option<String>)],
) {
    let todo: Vec<usize> = (0..items.len())
        .filter(|&i| statuses[i].0 == Status::Uploaded)
        .collect();
    if todo.is_empty() {
        return;
    }
    let total: u64 = todo.iter().map(|&i| items[i].size).sum();
    let (sources, artifacts): (Vec<usize>, Vec<usize>) =
        todo.into_iter().partition(|&i| items[i].kind == "source");
    let bar = (std::io::stderr().is_terminal() && !args.json).then(|| {
        let bar = indicatif::ProgressBar::new(total);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{bar:40} {bytes}/{total_bytes} {bytes_per_sec} {msg}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar
    });
    let ticker = bar.clone().map(|bar| {
        let sent = client.sent.clone();
        tokio::spawn(async move {
            loop {
                bar.set_position(sent.load(Ordering::Relaxed));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    });
    let mut results: Vec<(usize, Result<String, ClientError>)> = Vec::new();
    for phase in [artifacts, sources] {
        results.extend(upload_phase(args, client, items, phase).await);
    }
    if let Some(t) = ticker {
        t.abort();
    }
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    for (i, r) in results {
        statuses[i] = match r {
            Ok(status) if status == "unchanged" => (Status::Present, None),
            Ok(_) => (Status::Uploaded, None),
            Err(e) => (Status::Failed, Some(e.to_string())),
        };
    }
}

async fn upload_phase(
    args: &Args,
    client: &Client,
    items: &[Item],
    todo: Vec<usize>,
) -> Vec<(usize, Result<String, ClientError>)> {
    futures::stream::iter(todo)
        .map(|i| async move {
            let r = client.upload(&items[i]).await;
            if !std::io::stderr().is_terminal() {
                match &r {
                    Ok(_) => eprintln!(
                        "symtrace-upload: sent {} {} ({} bytes)",
                        items[i].kind, items[i].name, items[i].size
                    ),
                    Err(e) => eprintln!(
                        "symtrace-upload: FAILED {} {}: {e}",
                        items[i].kind, items[i].name
                    ),
                }
            }
            (i, r)
        })
        .buffer_unordered(args.concurrency.max(1))
        .collect()
        .await
}

/// `--strip`: a binary is replaced by its stripped form only once its
/// debuginfo and the stripped executable are on the server, so a failed run
/// never loses debug info.
fn replace_stripped(
    plans: &mut BTreeMap<BuildId, Plan>,
    items: &[Item],
    statuses: &mut [(Status, Option<String>)],
) {
    for (id, plan) in plans.iter_mut() {
        let Some(replace) = plan.replace.take() else {
            continue;
        };
        let published = ["debuginfo", "executable"].iter().all(|kind| {
            items.iter().zip(statuses.iter()).any(|(i, (s, _))| {
                &i.build_id == id
                    && i.kind == *kind
                    && matches!(s, Status::Uploaded | Status::Present)
            })
        });
        let target = replace.target.clone();
        if !published {
            plan.errors.push(format!(
                "{}: not stripped, because its debug info was not published",
                target.display()
            ));
        } else if let Err(e) = replace.apply() {
            plan.errors.push(format!(
                "{}: writing the stripped file failed: {e}",
                target.display()
            ));
        }
    }
}

fn summarize(
    args: &Args,
    discovery: &discover::Discovery,
    plans: &BTreeMap<BuildId, Plan>,
    items: &[Item],
    statuses: &[(Status, Option<String>)],
) -> Summary {
    let mut by_id: HashMap<&BuildId, Vec<ItemReport>> = HashMap::new();
    for (item, (status, reason)) in items.iter().zip(statuses) {
        by_id.entry(&item.build_id).or_default().push(ItemReport {
            kind: item.kind,
            path: if item.kind == "source" {
                item.name.clone()
            } else {
                item.local.display().to_string()
            },
            bytes: item.size,
            status: *status,
            reason: reason.clone(),
        });
    }
    let mut files = Vec::new();
    let mut gate_failed = false;
    for (id, plan) in plans {
        let gate = args.require_frame_pointers.then(|| {
            plan.frame_pointers
                .as_ref()
                .is_some_and(|fp| fp.share_without_percent > args.frame_pointer_threshold)
        });
        gate_failed |= gate == Some(true);
        files.push(FileReport {
            path: plan.label.clone(),
            build_id: id.to_string(),
            items: by_id.remove(id).unwrap_or_default(),
            missing_sources: plan.missing_sources.clone(),
            skipped_sources: plan
                .skipped_sources
                .iter()
                .map(|(path, reason)| report::SkippedSource {
                    path: path.clone(),
                    reason: reason.clone(),
                })
                .collect(),
            errors: plan.errors.clone(),
            frame_pointers: plan.frame_pointers.clone(),
            frame_pointer_gate_failed: gate.filter(|_| plan.frame_pointers.is_some()),
        });
    }
    let count = |s: Status| statuses.iter().filter(|(st, _)| *st == s).count();
    let failed = count(Status::Failed)
        + discovery.failures.len()
        + plans.values().map(|p| p.errors.len()).sum::<usize>();
    let bytes_uploaded = items
        .iter()
        .zip(statuses)
        .filter(|(_, (s, _))| *s == Status::Uploaded)
        .map(|(i, _)| i.size)
        .sum();
    Summary {
        server: args.server.clone(),
        files,
        failures: discovery.failures.clone(),
        non_elf_files: discovery.non_elf,
        objects_ignored: discovery.objects_ignored,
        uploaded: count(Status::Uploaded) + count(Status::WouldUpload),
        present: count(Status::Present),
        failed,
        bytes_uploaded,
        exit_code: if failed > 0 || gate_failed { 1 } else { 0 },
    }
}
