//! Each kind of input gives the best answer its data allows: DWARF from an
//! unstripped executable or a debug file, names from `.symtab` or
//! `.dynsym`, and an explicit reason when there is nothing.

use std::path::Path;
use std::process::Command;

use symtrace_symbolize::{index, DwarfSymbolizer, Inputs, Miss, Source, SymbolIndex};
use symtrace_testkit::{have, run};

const PROGRAM: &str = r#"
#include <stdio.h>
static int __attribute__((noinline)) helper(int x) { return x * 3 + 1; }
int __attribute__((noinline)) exported_entry(int x) { return helper(x) + 2; }
int main(int argc, char **argv) { printf("%d\n", exported_entry(argc)); return 0; }
"#;

fn symbol_address(file: &Path, name: &str) -> u64 {
    let out = run(Command::new("nm").arg(file));
    let text = String::from_utf8(out.stdout).unwrap();
    let line = text
        .lines()
        .find(|l| l.ends_with(&format!(" {name}")))
        .unwrap_or_else(|| panic!("{name} not in {}", file.display()));
    u64::from_str_radix(line.split(' ').next().unwrap(), 16).unwrap()
}

/// Answers from both tiers, which must agree.
fn answer(
    inputs: &Inputs<'_>,
    address: u64,
) -> Result<(Source, Vec<symtrace_symbolize::Frame>), Miss> {
    let from_dwarf = DwarfSymbolizer::new(inputs)
        .unwrap()
        .symbolize(&[address])
        .unwrap();
    let index = SymbolIndex::new(index::build(inputs).unwrap()).unwrap();
    let mut frames = Vec::new();
    let from_index = index
        .lookup(address, &mut frames)
        .map(|s| (s, frames.iter().map(|f| f.to_owned()).collect::<Vec<_>>()));
    assert_eq!(
        from_dwarf[0], from_index,
        "the two tiers disagree at {address:#x}"
    );
    from_index
}

#[test]
fn each_input_gives_the_best_answer_its_data_allows() {
    if !have("gcc") || !have("objcopy") || !have("strip") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("p.c"), PROGRAM).unwrap();
    run(Command::new("gcc")
        .args(["-O2", "-g", "-rdynamic", "-o"])
        .arg(d.join("full"))
        .arg(d.join("p.c")));
    run(Command::new("objcopy")
        .arg("--only-keep-debug")
        .arg(d.join("full"))
        .arg(d.join("debug")));
    run(Command::new("strip")
        .arg("--strip-debug")
        .arg("-o")
        .arg(d.join("symtab"))
        .arg(d.join("full")));
    run(Command::new("strip")
        .arg("--strip-all")
        .arg("-o")
        .arg(d.join("dynsym"))
        .arg(d.join("full")));
    run(Command::new("gcc")
        .args(["-O2", "-o"])
        .arg(d.join("plain"))
        .arg(d.join("p.c")));
    run(Command::new("strip")
        .arg("--strip-all")
        .arg(d.join("plain")));

    let helper = symbol_address(&d.join("full"), "helper") + 1;
    let exported = symbol_address(&d.join("full"), "exported_entry") + 1;
    let read = |name: &str| std::fs::read(d.join(name)).unwrap();
    let (full, debug, symtab, dynsym, plain) = (
        read("full"),
        read("debug"),
        read("symtab"),
        read("dynsym"),
        read("plain"),
    );

    // Unstripped executable, and the debug file alone: DWARF, with lines.
    for data in [&full, &debug] {
        let (source, frames) = answer(&Inputs::new(data), helper).unwrap();
        assert_eq!(source, Source::Dwarf);
        assert_eq!(frames.last().unwrap().function.as_deref(), Some("helper"));
        assert!(frames[0].file.as_deref().unwrap().ends_with("p.c"));
        assert_eq!(frames[0].line, 3);
    }
    // Symbol table only: the name, no line.
    let (source, frames) = answer(&Inputs::new(&symtab), helper).unwrap();
    assert_eq!(source, Source::Symtab);
    assert_eq!(frames.len(), 1);
    assert_eq!(frames[0].function.as_deref(), Some("helper"));
    assert_eq!((frames[0].file.as_deref(), frames[0].line), (None, 0));
    // Dynamic symbols only: exported functions are named; a static one is
    // not covered by any symbol.
    let (source, frames) = answer(&Inputs::new(&dynsym), exported).unwrap();
    assert_eq!(source, Source::Dynsym);
    assert_eq!(frames[0].function.as_deref(), Some("exported_entry"));
    assert_eq!(
        answer(&Inputs::new(&dynsym), helper),
        Err(Miss::OutsideFunctions)
    );
    // A debug file whose executable has the symbols: DWARF still wins, and
    // the executable's `.dynsym` backs a debug file without symbols.
    let with_exe = Inputs {
        executable: Some(&dynsym),
        ..Inputs::new(&debug)
    };
    assert_eq!(answer(&with_exe, helper).unwrap().0, Source::Dwarf);
    // Nothing at all.
    assert_eq!(answer(&Inputs::new(&plain), helper), Err(Miss::NoSymbols));
    // Outside every function of a file that has DWARF.
    assert_eq!(
        answer(&Inputs::new(&full), 0x10),
        Err(Miss::OutsideFunctions)
    );
}
