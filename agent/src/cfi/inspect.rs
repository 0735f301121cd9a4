//! `symtrace-agent unwind-table FILE…`: the unwind table the agent builds
//! from a file, summarized — what an operator asks when a stack through
//! that file is cut ("does it keep frame pointers? does its CFI cover its
//! code?"), and the table's build cost (bench/unwind-tables.sh).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use object::{Object, ObjectSection};

use super::deltas::{self, Coverage, Table};

/// Prints one summary line per file; fails if any file had no table.
pub fn print(files: &[PathBuf]) -> anyhow::Result<()> {
    let mut failed = 0;
    for path in files {
        match describe(path) {
            Ok(line) => println!("{line}"),
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

fn describe(path: &Path) -> anyhow::Result<String> {
    let data = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let file = object::File::parse(&*data).context("not an ELF file")?;
    let section = file
        .section_by_name(".eh_frame")
        .context("no .eh_frame (its frames are walked by frame pointer only)")?;
    let bytes = section.data().context(".eh_frame unreadable")?;
    let text = file.section_by_name(".text").map_or(0, |s| s.address());
    let started = Instant::now();
    let table = deltas::build(bytes, section.address(), text, deltas::Limits::default())?;
    Ok(summary(path, bytes.len(), &table, started.elapsed()))
}

/// The line printed for a file.
fn summary(path: &Path, eh_frame: usize, table: &Table, took: Duration) -> String {
    let Coverage {
        rbp,
        rsp,
        outermost,
        unknown,
    } = table.coverage();
    let code = (rbp + rsp + outermost + unknown).max(1) as f64;
    let share = |n: u64| 100.0 * n as f64 / code;
    let mib = eh_frame as f64 / f64::from(1 << 20);
    format!(
        "{}: .eh_frame {:.1} KiB -> {} ranges, {} rules{}, table {:.1} KiB; built in {:.2} ms \
         ({:.1} ms per MiB of .eh_frame); code by rule: frame pointer {:.1}%, stack pointer \
         {:.1}%, outermost {:.1}%, unknown {:.1}%",
        path.display(),
        eh_frame as f64 / 1024.0,
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
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summarizes_a_real_file_and_refuses_others() {
        let line = describe(Path::new("/proc/self/exe")).unwrap();
        assert!(
            line.contains(" ranges, ") && line.contains("frame pointer "),
            "{line}"
        );
        let not_elf = describe(Path::new("/proc/self/status")).unwrap_err();
        assert!(
            format!("{not_elf:#}").contains("not an ELF file"),
            "{not_elf:#}"
        );
        assert!(print(&[PathBuf::from("/nonexistent")]).is_err());
    }
}
