//! The package as an application gets it: `npm pack` (the addon prebuilt
//! into the tarball), then, in a new application directory with no cargo
//! on `PATH`, `npm install` of the tarball with OpenTelemetry's SDK, and a
//! span run under `SymtraceContextManager` — and the same through a plain
//! `npm install <path>` (a link to the package folder). Skipped without
//! `node`/`npm`, except in CI (`CI=true`), where that fails.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const PACKAGE_FILES: &[&str] = &[
    "package.json",
    "index.js",
    "index.d.ts",
    "otel.js",
    "otel.d.ts",
    "platform.js",
    "README.md",
    "scripts/prebuild.js",
];

/// A `PATH` with node and npm and nothing of Rust's.
const APP_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

const APP: &str = r#"
const { NodeTracerProvider } = require("@opentelemetry/sdk-trace-node");
const { resourceFromAttributes } = require("@opentelemetry/resources");
const { trace } = require("@opentelemetry/api");
const { SymtraceContextManager } = require("@symtrace/context/otel");
const symtrace = require("@symtrace/context");

const resource = resourceFromAttributes({ "service.name": "install-test" });
const provider = new NodeTracerProvider({ resource });
provider.register({ contextManager: new SymtraceContextManager({ resource }) });
const out = { addonPath: symtrace.addonPath };
trace.getTracer("install-test").startActiveSpan("work", (span) => {
  const sc = span.spanContext();
  out.span = [sc.traceId, sc.spanId];
  out.inside = symtrace.current();
  span.end();
});
out.after = symtrace.current();
console.log(JSON.stringify(out));
"#;

fn tools_present() -> bool {
    let ok = |tool: &str| {
        Command::new(tool)
            .arg("--version")
            .env("PATH", APP_PATH)
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if ok("node") && ok("npm") {
        return true;
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "node and npm are required in CI (on {APP_PATH})"
    );
    println!("skipped: node or npm not on {APP_PATH}");
    false
}

fn checked(what: &str, out: Output) -> String {
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `npm …` in `dir`, with nothing of Rust's on `PATH`, the npm cache the
/// test services filled preferred to the registry.
fn npm(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("npm")
        .args(args)
        .args([
            "--no-audit",
            "--no-fund",
            "--prefer-offline",
            "--loglevel=error",
        ])
        .current_dir(dir)
        .env("PATH", APP_PATH)
        .env_remove("NODE_PATH")
        .env_remove("SYMTRACE_CONTEXT_ADDON")
        .output()
        .expect("running npm");
    checked(&format!("npm {}", args.join(" ")), out)
}

/// Runs the application in `app`; its JSON answer.
fn run_app(app: &Path) -> serde_json::Value {
    std::fs::write(app.join("main.js"), APP).unwrap();
    let out = Command::new("node")
        .arg("main.js")
        .current_dir(app)
        .env("PATH", APP_PATH)
        .env_remove("NODE_PATH")
        .env_remove("SYMTRACE_CONTEXT_ADDON")
        .output()
        .expect("running node");
    let text = checked("node main.js", out);
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{e}: {text}"))
}

fn assert_span_published(answer: &serde_json::Value, addon_under: &Path) {
    let span = &answer["span"];
    assert_eq!(
        answer["inside"],
        serde_json::json!([span[0], span[1], 1]),
        "the span is published while it is active: {answer}"
    );
    assert!(answer["after"].is_null(), "and cleared after: {answer}");
    let addon = PathBuf::from(answer["addonPath"].as_str().unwrap());
    assert!(
        addon.starts_with(addon_under)
            && addon.ends_with("prebuilds/linux-x64-gnu/symtrace_context.node"),
        "the prebuilt addon under {} was loaded, not {}",
        addon_under.display(),
        addon.display()
    );
}

fn new_app(dir: &Path, name: &str) -> PathBuf {
    let app = dir.join(name);
    std::fs::create_dir(&app).unwrap();
    std::fs::write(
        app.join("package.json"),
        format!(r#"{{"name": "{name}", "version": "1.0.0", "private": true}}"#),
    )
    .unwrap();
    app
}

const OTEL: &[&str] = &[
    "@opentelemetry/api@^1.9",
    "@opentelemetry/sdk-trace-node@^2",
    "@opentelemetry/context-async-hooks@^2",
    "@opentelemetry/resources@^2",
];

#[test]
fn the_packed_package_installs_and_runs_a_span_without_a_compiler() {
    if !tools_present() {
        return;
    }
    let cargo_visible = Command::new("sh")
        .args(["-c", "command -v cargo rustc"])
        .env("PATH", APP_PATH)
        .output()
        .unwrap();
    assert!(
        cargo_visible.stdout.is_empty(),
        "{APP_PATH} must hold no Rust toolchain for this test: {}",
        String::from_utf8_lossy(&cargo_visible.stdout)
    );
    let source = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let addon = symtrace_testkit::target_dir().join("libsymtrace_context_node.so");
    assert!(
        addon.exists(),
        "{} not built (scripts/test.sh builds it: cargo build -p symtrace-context-node)",
        addon.display()
    );

    // The package, copied to a clean directory, packed with the addon this
    // build made (`npm pack` runs the prepack script, scripts/prebuild.js).
    let dir = tempfile::tempdir().unwrap();
    let package = dir.path().join("package");
    for file in PACKAGE_FILES {
        let to = package.join(file);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(source.join(file), &to).unwrap();
    }
    let out = Command::new("npm")
        .args(["pack", "--pack-destination"])
        .arg(dir.path())
        .current_dir(&package)
        .env("SYMTRACE_CONTEXT_PREBUILT", &addon)
        .output()
        .expect("running npm pack");
    let packed = checked("npm pack", out);
    let tarball = dir.path().join(packed.lines().last().unwrap().trim());
    let listing = checked(
        "tar",
        Command::new("tar")
            .arg("tzf")
            .arg(&tarball)
            .output()
            .unwrap(),
    );
    assert!(
        listing
            .lines()
            .any(|l| l == "package/prebuilds/linux-x64-gnu/symtrace_context.node"),
        "the tarball carries the addon: {listing}"
    );

    // A new application installs the tarball and OpenTelemetry's SDK.
    let app = new_app(dir.path(), "tarball-app");
    let mut args = vec!["install", tarball.to_str().unwrap()];
    args.extend(OTEL);
    npm(&app, &args);
    let answer = run_app(&app);
    assert_span_published(&answer, &app.join("node_modules/@symtrace/context"));

    // A plain path install links the package folder: the peers are found
    // from the application, the addon in the folder (prebuilt by the pack).
    let linked = new_app(dir.path(), "path-app");
    let mut args = vec!["install", package.to_str().unwrap()];
    args.extend(OTEL);
    npm(&linked, &args);
    assert!(
        std::fs::symlink_metadata(linked.join("node_modules/@symtrace/context"))
            .unwrap()
            .file_type()
            .is_symlink(),
        "npm links a path install"
    );
    let answer = run_app(&linked);
    assert_span_published(&answer, &package);
}
