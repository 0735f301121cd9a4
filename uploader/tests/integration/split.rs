//! The native split serves gdb as objcopy's does, is no larger, and a
//! re-run publishes nothing.

use std::process::Command;

use symtrace_testkit::*;

use crate::{tools, upload};

#[test]
fn native_split_debugs_like_objcopy_and_is_not_larger() {
    if !tools(&["gcc", "objcopy", "strip", "readelf", "gdb"]) {
        return;
    }
    let server = Server::start(&Backend::local(), &[]);
    let fx = Fixture::hello("src", "hello.c", &["-g"]);
    let work = fx.dir.path().join("work");
    let (code, _, stderr) = upload(
        &server.url,
        &["--work-dir", work.to_str().unwrap()],
        &[&fx.unstripped],
    );
    assert_eq!(code, 0, "{stderr}");
    let ours = work.join(format!("{}.debug", fx.build_id));
    let theirs_size = std::fs::metadata(&fx.debug).unwrap().len();
    let ours_size = std::fs::metadata(&ours).unwrap().len();
    assert!(
        ours_size as f64 <= theirs_size as f64 * 1.03,
        "ours {ours_size} B vs objcopy {theirs_size} B"
    );
    // readelf finds nothing wrong with it.
    let check = run(Command::new("readelf").args(["-a", "-W"]).arg(&ours));
    let warnings = String::from_utf8_lossy(&check.stderr).to_string();
    assert!(
        !warnings.contains("Warning") && !warnings.contains("not covered"),
        "{warnings}"
    );

    // eu-elflint finds nothing in ours that it does not also find in objcopy's.
    if have("eu-elflint") {
        let lint = |f: &std::path::Path| -> Vec<String> {
            let out = Command::new("eu-elflint")
                .arg("-d")
                .arg(f)
                .output()
                .unwrap();
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .map(str::to_owned)
                .collect()
        };
        let theirs = lint(&fx.debug);
        let extra: Vec<String> = lint(&ours)
            .into_iter()
            .filter(|l| !theirs.contains(l))
            .collect();
        assert!(
            extra.is_empty(),
            "eu-elflint complaints only our split has: {extra:?}"
        );
    }

    // gdb with each debug file beside the stripped binary, found through a
    // .gnu_debuglink made for it (the CRC differs between the two files).
    let run_dir = fx.dir.path().join("run");
    std::fs::create_dir_all(&run_dir).unwrap();
    let session = |debug: &std::path::Path| {
        let (exe, linked) = (run_dir.join("hello"), run_dir.join("hello.debug"));
        std::fs::copy(debug, &linked).unwrap();
        run(Command::new("strip")
            .args(["--strip-debug", "--strip-unneeded", "-o"])
            .arg(&exe)
            .arg(&fx.unstripped));
        run(Command::new("objcopy")
            .arg(format!("--add-gnu-debuglink={}", linked.display()))
            .arg(&exe));
        let commands = ["break add", "run", "bt", "list main", "info scope main"];
        gdb_batch(&run_dir.join("hello"), &commands, None, &[])
    };
    let with_objcopy = session(&fx.debug);
    let with_ours = session(&ours);
    assert!(
        with_objcopy.contains("Breakpoint 1, add (a=1, b=41)"),
        "{with_objcopy}"
    );
    assert_eq!(
        with_ours, with_objcopy,
        "gdb behaves differently with the native split"
    );
}

#[test]
fn a_rerun_sends_nothing() {
    if !tools(&["gcc", "objcopy", "strip", "readelf"]) {
        return;
    }
    let server = Server::start(&Backend::local(), &[]);
    let fx = Fixture::hello("src", "hello.c", &["-g"]);
    let out_dir = fx.unstripped.parent().unwrap().to_path_buf();
    let (code, first, stderr) = upload(&server.url, &[], &[&out_dir]);
    assert_eq!(code, 0, "{stderr}");
    assert!(first["uploaded"].as_u64().unwrap() >= 3, "{first}");
    let sent = server.metric("symtrace_upload_bytes_total", &[]);
    assert!(sent > 0.0);
    let (code, second, stderr) = upload(&server.url, &[], &[&out_dir]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(second["uploaded"], 0, "{second}");
    assert_eq!(second["bytes_uploaded"], 0, "{second}");
    assert_eq!(
        server.metric("symtrace_upload_bytes_total", &[]),
        sent,
        "a re-run sent file bytes"
    );
    // --dry-run reports and sends nothing either.
    let (code, dry, _) = upload(&server.url, &["--dry-run"], &[&out_dir]);
    assert_eq!(code, 0);
    assert_eq!(dry["uploaded"], 0, "{dry}");
}
