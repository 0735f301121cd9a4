//! Symbolizes addresses read from stdin (hex, one per line), printing
//! llvm-symbolizer's `--inlines` layout: per address, one `function` and one
//! `file:line:column` line per frame, innermost first, then a blank line.
//!
//! ```text
//! symbolize dwarf FILE [--threads N] < addrs   # straight from DWARF
//! symbolize build FILE INDEX [--threads N]  # write the index, print stats
//! symbolize index INDEX [--warm N] < addrs  # from a prebuilt index
//! symbolize cold FILE             < addrs   # build the index in memory, then answer
//! ```
//! `--raw` prints linkage names instead of demangled ones. Timings go to
//! stderr.

use std::io::{BufRead, Write};
use std::time::Instant;

use symtrace_symbolize::{index, DwarfSymbolizer, FrameRef, Inputs, SymbolIndex};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mode = args.first().map(String::as_str).unwrap_or("");
    let start = Instant::now();
    match mode {
        "build" => {
            let data = map(&args[1]);
            let threads = option(&args, "--threads");
            let inputs = Inputs::new(&data);
            let (bytes, stats) = match threads {
                Some(n) => index::build_with_threads(&inputs, n),
                None => index::build_with_stats(&inputs),
            }
            .expect("building");
            std::fs::write(&args[2], &bytes).expect("writing the index");
            eprintln!(
                "built {} bytes in {:?}: {stats:?} ({:.1}% of the file)",
                bytes.len(),
                start.elapsed(),
                100.0 * bytes.len() as f64 / data.len() as f64
            );
        }
        "dwarf" => {
            let addrs = read_addresses();
            let data = map(&args[1]);
            let symbolizer = DwarfSymbolizer::new(&Inputs::new(&data)).expect("opening");
            let threads = option(&args, "--threads").unwrap_or(1);
            let mut printer = InOrder::new(addrs.len());
            symbolizer
                .symbolize_on(&addrs, threads, |i, _, frames| printer.add(i, frames))
                .expect("symbolizing");
            printer.write();
            eprintln!("{} addresses in {:?}", addrs.len(), start.elapsed());
        }
        "index" | "cold" => {
            let addrs = read_addresses();
            let index = if mode == "index" {
                let data = map(&args[1]);
                SymbolIndex::new(data).expect("opening the index")
            } else {
                let data = map(&args[1]);
                SymbolIndex::new(index::build(&Inputs::new(&data)).expect("building")).unwrap()
            };
            let mut printer = InOrder::new(addrs.len());
            index.lookup_batch(&addrs, |i, _, frames| printer.add(i, frames));
            printer.write();
            let mut frames = Vec::new();
            eprintln!("{} addresses in {:?}", addrs.len(), start.elapsed());
            let warm: usize = option(&args, "--warm").unwrap_or(0);
            if warm > 0 {
                let t = Instant::now();
                let mut count = 0usize;
                for _ in 0..warm {
                    index.lookup_batch(&addrs, |_, _, frames| count += frames.len());
                }
                let batch_secs = t.elapsed().as_secs_f64();
                eprintln!(
                    "warm batches: {:.0} addresses/s ({count} frames)",
                    (warm * addrs.len()) as f64 / batch_secs
                );
                let t = Instant::now();
                count = 0;
                for _ in 0..warm {
                    for &a in &addrs {
                        let _ = index.lookup(a, &mut frames);
                        count += frames.len();
                    }
                }
                let secs = t.elapsed().as_secs_f64();
                eprintln!(
                    "warm one by one: {:.0} addresses/s ({count} frames)",
                    (warm * addrs.len()) as f64 / secs
                );
            }
        }
        _ => {
            eprintln!(
                "usage: symbolize dwarf|build|index|cold FILE [INDEX] [--warm N] < addresses"
            );
            std::process::exit(2);
        }
    }
}

/// The number after `name` on the command line.
fn option(args: &[String], name: &str) -> Option<usize> {
    let i = args.iter().position(|a| a == name)?;
    args.get(i + 1)?.parse().ok()
}

/// Answers arrive in address order; they are printed in input order.
struct InOrder {
    text: Vec<u8>,
    spans: Vec<std::ops::Range<usize>>,
}

impl InOrder {
    fn new(count: usize) -> Self {
        Self {
            text: Vec::new(),
            spans: vec![0..0; count],
        }
    }

    fn add(&mut self, i: usize, frames: &[FrameRef<'_>]) {
        let start = self.text.len();
        print_frames(&mut self.text, frames);
        self.spans[i] = start..self.text.len();
    }

    fn write(self) {
        let mut out = std::io::BufWriter::new(std::io::stdout().lock());
        for span in self.spans {
            out.write_all(&self.text[span]).unwrap();
        }
        out.flush().unwrap();
    }
}

fn map(path: &str) -> memmap2::Mmap {
    let file = std::fs::File::open(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    // SAFETY: benchmark input files are not modified while mapped.
    unsafe { memmap2::Mmap::map(&file) }.unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn read_addresses() -> Vec<u64> {
    std::io::stdin()
        .lock()
        .lines()
        .map_while(Result::ok)
        .filter_map(|l| {
            let l = l.trim();
            u64::from_str_radix(l.trim_start_matches("0x"), 16).ok()
        })
        .collect()
}

fn print_frames(out: &mut impl Write, frames: &[FrameRef<'_>]) {
    static RAW: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let raw = *RAW.get_or_init(|| std::env::args().any(|a| a == "--raw"));
    if frames.is_empty() {
        let _ = writeln!(out, "??\n??:0:0");
    }
    for f in frames {
        match (raw, f.linkage_name) {
            (true, Some(linkage)) => {
                let _ = writeln!(out, "{linkage}");
            }
            _ => {
                let _ = writeln!(out, "{}", f.function.unwrap_or("??"));
            }
        }
        let _ = writeln!(out, "{}:{}:{}", f.file.unwrap_or("??"), f.line, f.column);
    }
    let _ = writeln!(out);
}
