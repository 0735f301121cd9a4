//! Names as runtimes write them to perf maps and jitdump, parsed into a
//! function, a file, a line and a column:
//!
//! - V8 (Node.js, Deno, Chromium): `TAG:[tier]name file:line:col`, tags
//!   `JS`, `LazyCompile`, `Function`, `Script`, `Eval` for JavaScript (the
//!   line is where the function starts; the tier marker is `~` Ignition,
//!   `^` Sparkplug, `+` Maglev, `*` TurboFan), and `Builtin`,
//!   `BytecodeHandler`, `Stub`, `RegExp`, `Handler`, … for V8's own code
//!   (kept whole).
//! - HotSpot (`jcmd Compiler.perfmap`): `double Hot.heavy(int)`: the
//!   function is `Hot.heavy`, the whole signature its system name.
//! - Anything else: the name as written.

use super::{FrameKind, Symbol};

/// V8 tags of JavaScript code.
const V8_JS_TAGS: [&str; 5] = ["JS", "LazyCompile", "Function", "Script", "Eval"];
/// V8 tags of its own code.
const V8_OTHER_TAGS: [&str; 14] = [
    "Builtin",
    "BytecodeHandler",
    "Stub",
    "RegExp",
    "Handler",
    "Callback",
    "Interpreter",
    "LoadIC",
    "StoreIC",
    "KeyedLoadIC",
    "KeyedStoreIC",
    "LoadGlobalIC",
    "StoreGlobalIC",
    "CodeCreation",
];

/// The tier a V8 marker stands for.
fn v8_tier(marker: char) -> Option<&'static str> {
    Some(match marker {
        '~' => "ignition",
        '^' => "sparkplug",
        '+' => "maglev",
        '*' => "turbofan",
        _ => return None,
    })
}

/// What process a name came from, as far as the agent knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runtime {
    V8,
    Jvm,
    Dotnet,
    Unknown,
}

/// Parses `name` as `runtime` writes it. V8's tags are recognized whatever
/// the runtime (a renamed `node`, an embedder).
pub fn parse(name: &str, runtime: Runtime) -> Symbol {
    if let Some(s) = parse_v8(name) {
        return s;
    }
    match runtime {
        Runtime::Jvm => parse_jvm(name),
        Runtime::V8 => Symbol {
            kind: FrameKind::V8js,
            ..Symbol::named(name)
        },
        Runtime::Dotnet => Symbol {
            kind: FrameKind::Dotnet,
            ..Symbol::named(name)
        },
        Runtime::Unknown => Symbol {
            kind: FrameKind::Jit,
            ..Symbol::named(name)
        },
    }
}

fn parse_v8(name: &str) -> Option<Symbol> {
    let (tag, rest) = name.split_once(':')?;
    if V8_OTHER_TAGS.contains(&tag) {
        return Some(Symbol {
            kind: FrameKind::V8js,
            ..Symbol::named(name)
        });
    }
    if !V8_JS_TAGS.contains(&tag) {
        return None;
    }
    let mut chars = rest.chars();
    let tier = chars.next().and_then(v8_tier);
    let rest = if tier.is_some() { chars.as_str() } else { rest };
    // `name file:line:col`, `name` or ` file:line:col` (anonymous). A
    // function's name may hold spaces (`get x`), and so may a path: the
    // source starts at the first space followed by something that looks
    // like a location (a path, a URL, `node:…`) ending in `:line[:col]`,
    // else at the last space followed by `…:line[:col]`.
    // At most the first and last 8 spaces are tried: a hostile name full
    // of spaces costs no more than a short one.
    let spaces: Vec<usize> = rest.match_indices(' ').map(|(i, _)| i).collect();
    let candidates: Vec<usize> = if spaces.len() > 16 {
        spaces[..8]
            .iter()
            .chain(&spaces[spaces.len() - 8..])
            .copied()
            .collect()
    } else {
        spaces
    };
    let split = candidates
        .iter()
        .copied()
        .find(|&i| looks_like_location(&rest[i + 1..]) && source_position(&rest[i + 1..]).is_some())
        .or_else(|| {
            candidates
                .iter()
                .copied()
                .rev()
                .find(|&i| source_position(&rest[i + 1..]).is_some())
        });
    let (function, source) = match split {
        Some(i) => (rest[..i].trim(), source_position(&rest[i + 1..])),
        None => (rest.trim(), None),
    };
    let function = match (function, tag) {
        ("", "Script") => "(script)",
        ("", _) => "(anonymous)",
        (f, _) => f,
    };
    let (file, line, column) = source.unwrap_or(("", 0, 0));
    Some(Symbol {
        function: function.into(),
        system_name: (function != name).then(|| name.into()),
        file: (!file.is_empty()).then(|| file.into()),
        line,
        column,
        kind: FrameKind::V8js,
        tier,
    })
}

/// A path or a URL (`scheme:` first).
fn looks_like_location(s: &str) -> bool {
    if s.starts_with('/') || s.starts_with('.') {
        return true;
    }
    s.split_once(':').is_some_and(|(scheme, _)| {
        !scheme.is_empty()
            && scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '+' || c == '-')
    })
}

/// `file:line:col` (or `file:line`) → its parts.
fn source_position(s: &str) -> Option<(&str, u32, u32)> {
    let (head, last) = s.rsplit_once(':')?;
    let last: u32 = last.parse().ok()?;
    match head.rsplit_once(':') {
        Some((file, line)) if !file.is_empty() => match line.parse::<u32>() {
            Ok(line) => Some((file, line, last)),
            Err(_) => Some((head, last, 0)),
        },
        _ if !head.is_empty() => Some((head, last, 0)),
        _ => None,
    }
}

/// `ret pkg.Class.method(params)` → `pkg.Class.method`; other names (stubs,
/// `Interpreter`) as they are.
fn parse_jvm(name: &str) -> Symbol {
    let base = Symbol {
        kind: FrameKind::Jvm,
        ..Symbol::named(name)
    };
    let Some(open) = name.find('(') else {
        return base;
    };
    if !name.ends_with(')') {
        return base;
    }
    let head = &name[..open];
    let method = head.rsplit_once(' ').map_or(head, |(_, m)| m);
    if method.is_empty() || !method.contains('.') {
        return base;
    }
    Symbol {
        function: method.into(),
        system_name: Some(name.into()),
        ..base
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v8(name: &str) -> Symbol {
        parse(name, Runtime::V8)
    }

    #[test]
    fn v8_javascript_names() {
        let s = v8("JS:~computeRed /path/x.js:6:20");
        assert_eq!(&*s.function, "computeRed");
        assert_eq!(s.file.as_deref(), Some("/path/x.js"));
        assert_eq!((s.line, s.column), (6, 20));
        assert_eq!((s.kind, s.tier), (FrameKind::V8js, Some("ignition")));
        assert_eq!(
            s.system_name.as_deref(),
            Some("JS:~computeRed /path/x.js:6:20")
        );
        let s = v8("JS:*innerLoop /tmp/a b/x.js:1:19");
        assert_eq!(&*s.function, "innerLoop");
        assert_eq!(s.file.as_deref(), Some("/tmp/a b/x.js"));
        let s = v8("JS:~ evalmachine.<anonymous>:1:1");
        assert_eq!(
            (&*s.function, s.file.as_deref()),
            ("(anonymous)", Some("evalmachine.<anonymous>"))
        );
        let s = v8("LazyCompile:*get value file:///srv/app.mjs:10:3");
        assert_eq!(&*s.function, "get value");
        assert_eq!(s.file.as_deref(), Some("file:///srv/app.mjs"));
        assert_eq!((s.line, s.column, s.tier), (10, 3, Some("turbofan")));
        let s = v8("JS:^ /srv/app.js:1:1");
        assert_eq!((&*s.function, s.line), ("(anonymous)", 1));
        assert_eq!(s.tier, Some("sparkplug"));
        let s = v8("Script:~ /srv/app.js:1:1");
        assert_eq!(&*s.function, "(script)");
        let s = v8("JS:+fib");
        assert_eq!((&*s.function, s.file.as_deref(), s.line), ("fib", None, 0));
        assert_eq!(s.tier, Some("maglev"));
        let s = v8("Function:node:internal/main:3:7");
        assert_eq!(&*s.function, "node:internal/main:3:7", "no space: a name");
        let s = v8("JS:~ node:internal/timers:512:25");
        assert_eq!(s.file.as_deref(), Some("node:internal/timers"));
        assert_eq!(&*s.function, "(anonymous)");
    }

    #[test]
    fn v8_own_code_and_other_runtimes() {
        let s = parse("Builtin:ArrayPrototypePush", Runtime::Unknown);
        assert_eq!(
            (&*s.function, s.kind),
            ("Builtin:ArrayPrototypePush", FrameKind::V8js)
        );
        assert_eq!(s.tier, None);
        let s = parse("double Hot.heavy(int)", Runtime::Jvm);
        assert_eq!((&*s.function, s.kind), ("Hot.heavy", FrameKind::Jvm));
        assert_eq!(s.system_name.as_deref(), Some("double Hot.heavy(int)"));
        let s = parse(
            "java.lang.Object jdk.internal.misc.Unsafe.getReferenceVolatile(java.lang.Object, long)",
            Runtime::Jvm,
        );
        assert_eq!(
            &*s.function,
            "jdk.internal.misc.Unsafe.getReferenceVolatile"
        );
        let s = parse("void Hot.<init>()", Runtime::Jvm);
        assert_eq!(&*s.function, "Hot.<init>");
        let s = parse("Interpreter", Runtime::Jvm);
        assert_eq!(
            (&*s.function, s.system_name.as_deref()),
            ("Interpreter", None)
        );
        let s = parse("StubRoutines (1)", Runtime::Jvm);
        assert_eq!(&*s.function, "StubRoutines (1)");
        let s = parse("[unknown] something: odd", Runtime::Unknown);
        assert_eq!(
            (&*s.function, s.kind),
            ("[unknown] something: odd", FrameKind::Jit)
        );
        let s = parse(
            "instance void [System.Private.CoreLib] X::Y()",
            Runtime::Dotnet,
        );
        assert_eq!(s.kind, FrameKind::Dotnet);
    }
}
