//! `symtrace-agent unwind-table FILE…`: the unwind table the agent builds
//! from a file, summarized — what an operator asks when a stack through
//! that file is cut ("does it keep frame pointers? does its CFI cover its
//! code?"), and the table's build cost (bench/unwind-tables.sh).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use object::{Object, ObjectSection};

use super::deltas::{self, CfaBase, Coverage, Rule, SavedRbp, Table};

/// Prints one summary line per file, and the rule at each of `at`;
/// fails if any file had no table.
pub fn print(files: &[PathBuf], at: &[u64]) -> anyhow::Result<()> {
    let mut failed = 0;
    for path in files {
        match describe(path, at) {
            Ok(lines) => println!("{lines}"),
            Err(e) => {
                eprintln!("{}: {e:#}", path.display());
                failed += 1;
            }
        }
    }
    if failed > 0 {
        anyhow::bail!("{failed} of {} files have no unwind table", files.len());
    }
    Ok(())
}

fn describe(path: &Path, at: &[u64]) -> anyhow::Result<String> {
    let data = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let file = object::File::parse(&*data).context("not an ELF file")?;
    let mut parts = Vec::new();
    for (kind, name) in [
        (deltas::Kind::EhFrame, ".eh_frame"),
        (deltas::Kind::DebugFrame, ".debug_frame"),
    ] {
        let Some(section) = file.section_by_name(name) else {
            continue;
        };
        let bytes = section
            .uncompressed_data()
            .with_context(|| format!("{name} unreadable"))?;
        parts.push((kind, name, bytes, section.address()));
    }
    anyhow::ensure!(
        !parts.is_empty(),
        "no .eh_frame or .debug_frame (its frames are walked by frame pointer only)"
    );
    let text = file.section_by_name(".text").map_or(0, |s| s.address());
    let started = Instant::now();
    let table = deltas::build_parts(
        &parts
            .iter()
            .map(|(kind, _, bytes, address)| deltas::Part {
                kind: *kind,
                bytes,
                address: *address,
            })
            .collect::<Vec<_>>(),
        text,
        deltas::Limits::default(),
    )?;
    let bytes: usize = parts.iter().map(|(_, _, b, _)| b.len()).sum();
    let what: Vec<&str> = parts.iter().map(|(_, name, _, _)| *name).collect();
    let mut lines = summary(path, &what.join(" + "), bytes, &table, started.elapsed());
    for &address in at {
        lines.push_str(&format!(
            "\n  {address:#x}: {}",
            explain(table.rule(address))
        ));
    }
    Ok(lines)
}

/// A rule in words.
fn explain(rule: Rule) -> String {
    match rule {
        Rule::Step { base, cfa, ra, rbp } => {
            let base = match base {
                CfaBase::Rsp => "%rsp",
                CfaBase::Rbp => "%rbp (a frame pointer)",
            };
            let rbp = match rbp {
                SavedRbp::Same => "%rbp unchanged".to_owned(),
                SavedRbp::AtCfa(o) => format!("the caller's %rbp at CFA{o:+}"),
            };
            format!("CFA = {base}{cfa:+}, return address at CFA{ra:+}, {rbp}")
        }
        Rule::Outermost => "the outermost frame (no return address)".to_owned(),
        Rule::Unknown => "no rule (no CFI here, or a DWARF expression)".to_owned(),
    }
}

/// The line printed for a file.
fn summary(path: &Path, what: &str, cfi: usize, table: &Table, took: Duration) -> String {
    let Coverage {
        rbp,
        rsp,
        outermost,
        unknown,
    } = table.coverage();
    let code = (rbp + rsp + outermost + unknown).max(1) as f64;
    let share = |n: u64| 100.0 * n as f64 / code;
    let mib = cfi as f64 / f64::from(1 << 20);
    format!(
        "{}: {} {:.1} KiB -> {} ranges, {} rules{}, table {:.1} KiB; built in {:.2} ms \
         ({:.1} ms per MiB of CFI); code by rule: frame pointer {:.1}%, stack pointer \
         {:.1}%, outermost {:.1}%, unknown {:.1}%; {:.2}% of its code frameless: {}",
        path.display(),
        what,
        cfi as f64 / 1024.0,
        table.starts.len(),
        table.rules.len(),
        match table.skipped {
            0 => String::new(),
            n => format!(" ({n} malformed FDEs left out)"),
        },
        table.bytes() as f64 / 1024.0,
        took.as_secs_f64() * 1e3,
        took.as_secs_f64() * 1e3 / mib.max(f64::MIN_POSITIVE),
        share(rbp),
        share(rsp),
        share(outermost),
        share(unknown),
        100.0 * table.frameless_share(),
        if table.framed() {
            "keeps frame pointers (non-leaf frames step by them)"
        } else {
            "frameless code (every frame steps by the table)"
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summarizes_a_real_file_and_refuses_others() {
        // This test's own function: framed in its body (the workspace
        // keeps frame pointers); nothing at address 1.
        let exe = std::fs::read("/proc/self/exe").unwrap();
        let file = object::File::parse(&*exe).unwrap();
        use object::ObjectSymbol;
        let sym = file
            .symbols()
            .find(|s| s.name().is_ok_and(|n| n.contains("summarizes_a_real_file")) && s.size() > 32)
            .unwrap();
        let middle = sym.address() + sym.size() / 2;
        let lines = describe(Path::new("/proc/self/exe"), &[middle, 1]).unwrap();
        assert!(
            lines.contains(" ranges, ") && lines.contains("frame pointer "),
            "{lines}"
        );
        let framed = format!(
            "{middle:#x}: CFA = %rbp (a frame pointer)+16, return address at CFA-8, \
             the caller's %rbp at CFA-16"
        );
        assert!(lines.contains(&framed), "{lines}");
        assert!(lines.contains("0x1: no rule"), "{lines}");
        let not_elf = describe(Path::new("/proc/self/status"), &[]).unwrap_err();
        assert!(
            format!("{not_elf:#}").contains("not an ELF file"),
            "{not_elf:#}"
        );
        assert!(print(&[PathBuf::from("/nonexistent")], &[]).is_err());
        assert_eq!(
            explain(Rule::Outermost),
            "the outermost frame (no return address)"
        );
    }
}
