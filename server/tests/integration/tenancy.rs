//! Who may read and write what (issue #19): tokens bound to tenants over
//! HTTP and gRPC, through every profile read path; the safe defaults of
//! loopback trust and of a server reachable from other hosts.

use std::process::Command;

use prost::Message;
use symtrace_proto::collector::profiles_service_client::ProfilesServiceClient;
use symtrace_testkit::*;

use crate::hostile::{deep_request, now_ns, TRACE};

const TOKENS: [&str; 4] = [
    "--read-tokens",
    "ra=team-a,rb=team-b,plain",
    "--upload-tokens",
    "ua=team-a,uall",
];

fn request(
    token: Option<&str>,
    tenant: Option<&str>,
    path: &str,
) -> reqwest::blocking::RequestBuilder {
    let mut req = client().get(path);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    if let Some(t) = tenant {
        req = req.header("X-Scope-OrgID", t);
    }
    req
}

fn get(server: &Server, token: Option<&str>, tenant: Option<&str>, path: &str) -> (u16, String) {
    let resp = request(token, tenant, &format!("{}{path}", server.url))
        .send()
        .unwrap();
    (resp.status().as_u16(), resp.text().unwrap())
}

fn export(
    server: &Server,
    token: &str,
    tenant: Option<&str>,
    service: &str,
    t: u64,
) -> (u16, String) {
    let mut req = client()
        .post(format!("{}/v1development/profiles", server.url))
        .header("Content-Type", "application/x-protobuf")
        .bearer_auth(token)
        .body(deep_request(service, 3, t).encode_to_vec());
    if let Some(tenant) = tenant {
        req = req.header("X-Scope-OrgID", tenant);
    }
    let resp = req.send().unwrap();
    let status = resp.status().as_u16();
    (
        status,
        String::from_utf8_lossy(&resp.bytes().unwrap()).into_owned(),
    )
}

fn grpc_export(
    server: &Server,
    token: &str,
    tenant: &str,
    service: &str,
    t: u64,
) -> Result<(), tonic::Status> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut client = ProfilesServiceClient::connect(format!("http://{}", server.grpc_addr))
            .await
            .unwrap();
        let mut req = tonic::Request::new(deep_request(service, 3, t));
        req.metadata_mut()
            .insert("authorization", format!("Bearer {token}").parse().unwrap());
        req.metadata_mut()
            .insert("x-scope-orgid", tenant.parse().unwrap());
        client.export(req).await.map(|_| ())
    })
}

#[test]
fn tokens_bound_to_tenants_read_and_write_only_their_tenants() {
    let server = Server::start(&Backend::local(), &TOKENS);
    let t = now_ns() - 60_000_000_000;
    // ua is bound to team-a: with no header it writes team-a; it may not
    // name team-b, over HTTP or gRPC.
    assert_eq!(export(&server, "ua", None, "svc-a", t).0, 200);
    let (status, body) = export(&server, "ua", Some("team-b"), "svc-intruder", t);
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("X-Scope-OrgID"), "{body}");
    let e = grpc_export(&server, "ua", "team-b", "svc-intruder", t).unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("X-Scope-OrgID"), "{e:?}");
    grpc_export(&server, "ua", "team-a", "svc-a2", t).expect("its own tenant over gRPC");
    // A plain token writes any tenant.
    assert_eq!(export(&server, "uall", Some("team-b"), "svc-b", t).0, 200);

    let range = format!("from={}&to={}", t - 1_000_000_000, t + 10_000_000_000);
    let trace = hex::encode(TRACE);
    let reads = [
        format!("/api/v1/flamegraph?service=svc-a&{range}&format=folded"),
        format!("/api/v1/diff?service=svc-a&{range}"),
        format!("/api/v1/traces/{trace}?{range}"),
        format!("/api/v1/profiles/samples?{range}"),
        format!("/api/v1/services?{range}"),
        format!("/api/v1/labels?{range}"),
        format!("/api/v1/labels/service.name/values?{range}"),
    ];
    for path in &reads {
        // ra reads team-a, by default or by name …
        let (status, own) = get(&server, Some("ra"), None, path);
        assert_eq!(status, 200, "{path}: {own}");
        let (status, named) = get(&server, Some("ra"), Some("team-a"), path);
        assert_eq!((status, &named), (200, &own), "{path}");
        // … never team-b: 403 naming the header.
        let (status, body) = get(&server, Some("ra"), Some("team-b"), path);
        assert_eq!(status, 403, "{path}: {body}");
        assert!(body.contains("X-Scope-OrgID"), "{path}: {body}");
        assert!(
            !own.contains("svc-b") && !own.contains("svc-intruder"),
            "{path}: {own}"
        );
        // Without a token: 401.
        assert_eq!(get(&server, None, Some("team-a"), path).0, 401, "{path}");
    }
    let (_, services) = get(&server, Some("ra"), None, &reads[4]);
    assert!(
        services.contains("svc-a") && services.contains("svc-a2"),
        "{services}"
    );
    let (_, values) = get(&server, Some("ra"), None, &reads[6]);
    assert!(
        values.contains("svc-a") && !values.contains("svc-b"),
        "{values}"
    );
    // rb sees team-b's only; the plain token reads both.
    let (_, b) = get(&server, Some("rb"), None, &reads[4]);
    assert!(b.contains("svc-b") && !b.contains("svc-a"), "{b}");
    for (tenant, service) in [("team-a", "svc-a"), ("team-b", "svc-b")] {
        let (status, body) = get(&server, Some("plain"), Some(tenant), &reads[4]);
        assert_eq!(status, 200);
        assert!(body.contains(service), "{tenant}: {body}");
    }
    // The upload token may read its own tenant too (upload implies read).
    let (status, body) = get(&server, Some("ua"), None, &reads[4]);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("svc-a") && !body.contains("svc-b"), "{body}");
}

#[test]
fn a_tokens_file_binds_hashed_tokens_and_is_reloaded_on_sighup() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tokens");
    let hash = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(b"file-reader"))
    };
    std::fs::write(
        &file,
        format!("read sha256:{hash} team-a\nupload file-writer team-a\n"),
    )
    .unwrap();
    let path = file.to_str().unwrap();
    let server = Server::start(&Backend::local(), &["--tokens-file", path]);
    let t = now_ns() - 60_000_000_000;
    assert_eq!(export(&server, "file-writer", None, "svc-f", t).0, 200);
    let services = format!(
        "/api/v1/services?from={}&to={}",
        t - 1_000_000_000,
        t + 10_000_000_000
    );
    let (status, body) = get(&server, Some("file-reader"), None, &services);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("svc-f"), "{body}");
    assert_eq!(
        get(&server, Some("file-reader"), Some("team-b"), &services).0,
        403
    );
    // Rotate: the old reader goes, a new one comes, on SIGHUP.
    std::fs::write(&file, "read rotated team-a\nupload file-writer team-a\n").unwrap();
    let pid = server.pid();
    assert!(Command::new("kill")
        .args(["-HUP", &pid.to_string()])
        .status()
        .unwrap()
        .success());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while get(&server, Some("rotated"), None, &services).0 != 200 {
        assert!(
            std::time::Instant::now() < deadline,
            "not reloaded: {}",
            server.log_text()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(get(&server, Some("file-reader"), None, &services).0, 403);
    assert!(server.log_text().contains("tokens file reloaded"));
}

#[test]
fn loopback_trust_needs_a_loopback_host_and_can_be_turned_off() {
    let server = Server::start(&Backend::local(), &[]);
    let t = now_ns() - 60_000_000_000;
    let post = |host: Option<&str>, url: &str| {
        let mut req = client()
            .post(format!("{url}/v1development/profiles"))
            .header("Content-Type", "application/x-protobuf")
            .body(deep_request("svc-l", 3, t).encode_to_vec());
        if let Some(h) = host {
            req = req.header("Host", h);
        }
        let resp = req.send().unwrap();
        (resp.status().as_u16(), resp.text().unwrap_or_default())
    };
    assert_eq!(post(None, &server.url).0, 200, "a direct loopback client");
    // DNS rebinding: a page from attacker.example that resolved to 127.0.0.1.
    let (status, body) = post(Some("attacker.example"), &server.url);
    assert_eq!(status, 403, "{body}");
    // Loopback trust off: refused directly, and through a local TCP
    // forwarder that adds no proxy header (ssh -L, kubectl port-forward),
    // which loopback trust cannot tell from a local client.
    let strict = Server::start(&Backend::local(), &["--loopback-trust", "false"]);
    let (status, body) = post(None, &strict.url);
    assert_eq!(status, 403, "{body}");
    let forwarded = forwarder(&strict);
    let (status, body) = post(None, &forwarded);
    assert_eq!(status, 403, "through the forwarder: {body}");
    assert!(body.contains("loopback trust is off"), "{body}");
    // (With loopback trust on, the same forwarder is let through: the
    // reason to turn it off on hosts that run one.)
    let open_forwarded = forwarder(&server);
    assert_eq!(post(None, &open_forwarded).0, 200);
}

/// A plain TCP forwarder on another loopback port, adding no header; its
/// URL.
fn forwarder(to: &Server) -> String {
    use std::net::{TcpListener, TcpStream};
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let target = to.url.trim_start_matches("http://").to_owned();
    std::thread::spawn(move || {
        for client in listener.incoming().flatten() {
            let upstream = TcpStream::connect(&target).unwrap();
            let (mut c2, mut u2) = (client.try_clone().unwrap(), upstream.try_clone().unwrap());
            let (mut c, mut u) = (client, upstream);
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut c, &mut u);
                let _ = u.shutdown(std::net::Shutdown::Write);
            });
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut u2, &mut c2);
            });
        }
    });
    format!("http://127.0.0.1:{port}")
}

#[test]
fn a_server_reachable_from_other_hosts_needs_read_tokens_or_says_it_is_public() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(server_bin())
        .args(["--http-addr", "0.0.0.0:0", "--grpc-addr", "127.0.0.1:0"])
        .arg("--data-dir")
        .arg(dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("SYMTRACE_READ_TOKENS") && stderr.contains("SYMTRACE_PUBLIC_READS=true"),
        "{stderr}"
    );
    // With SYMTRACE_PUBLIC_READS=true it starts and says so.
    let public = Server::start(
        &Backend::local(),
        &["--http-addr", "0.0.0.0:0", "--public-reads"],
    );
    assert!(
        public.log_text().contains("reads are public"),
        "{}",
        public.log_text()
    );
}

fn put(server: &Server, token: &str, path: &str, body: Vec<u8>) -> (u16, String) {
    let resp = client()
        .put(format!("{}{path}", server.url))
        .bearer_auth(token)
        .body(body)
        .send()
        .unwrap();
    (resp.status().as_u16(), resp.text().unwrap())
}

#[test]
fn the_symbol_store_lists_and_serves_sources_by_tenant_and_keeps_owners() {
    if !have("gcc") || !have("objcopy") {
        return;
    }
    let server = Server::start(
        &Backend::local(),
        &[
            "--read-tokens",
            "ra=team-a,rb=team-b",
            "--upload-tokens",
            "ua=team-a,ub=team-b,uall",
            "--admin-tokens",
            "adm-b=team-b",
        ],
    );
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("proprietary.c");
    std::fs::write(
        &source,
        "int secret_sauce(int x) { return x * 42; }\nint main(void) { return secret_sauce(1); }\n",
    )
    .unwrap();
    let bin = dir.path().join("prog");
    run(Command::new("gcc")
        .args(["-g", "-O1"])
        .arg(&source)
        .arg("-o")
        .arg(&bin));
    let id = build_id_of(&bin);
    let source_url = format!("/api/v1/debuginfo/{id}/source{}", source.display());
    // team-a publishes the debug info and its source.
    let (status, body) = put(
        &server,
        "ua",
        &format!("/api/v1/debuginfo/{id}/debuginfo"),
        std::fs::read(&bin).unwrap(),
    );
    assert_eq!(status, 201, "{body}");
    let (status, body) = put(&server, "ua", &source_url, std::fs::read(&source).unwrap());
    assert_eq!(status, 201, "{body}");

    // Listing and details follow the reader's tenants.
    let (_, listed_a) = get(&server, Some("ra"), None, "/api/v1/debuginfo");
    assert!(listed_a.contains(&id), "{listed_a}");
    let (_, listed_b) = get(&server, Some("rb"), None, "/api/v1/debuginfo");
    assert!(!listed_b.contains(&id), "{listed_b}");
    let (_, details_b) = get(
        &server,
        Some("rb"),
        None,
        &format!("/api/v1/debuginfo/{id}"),
    );
    assert!(!details_b.contains("proprietary.c"), "{details_b}");
    // The source is team-a's; the debug info is shared by build-ID.
    let fetch = format!("/buildid/{id}/source{}", source.display());
    let (status, text) = get(&server, Some("ra"), None, &fetch);
    assert_eq!(status, 200);
    assert!(text.contains("secret_sauce"));
    let (status, _) = get(&server, Some("rb"), None, &fetch);
    assert_eq!(status, 404, "team-b must not read team-a's source");
    assert_eq!(
        get(
            &server,
            Some("rb"),
            None,
            &format!("/buildid/{id}/debuginfo")
        )
        .0,
        200
    );

    // team-b may not replace team-a's files; a token of every tenant may.
    let stripped = dir.path().join("prog-symtab");
    run(Command::new("objcopy")
        .arg("--strip-debug")
        .arg(&bin)
        .arg(&stripped));
    let (status, body) = put(
        &server,
        "ub",
        &format!("/api/v1/debuginfo/{id}/debuginfo"),
        std::fs::read(&stripped).unwrap(),
    );
    assert_eq!(status, 409, "{body}");
    assert!(body.contains("another tenant"), "{body}");
    // Nor by another kind: a debuginfo request may be served an executable
    // with DWARF.
    let (status, body) = put(
        &server,
        "ub",
        &format!("/api/v1/debuginfo/{id}/executable"),
        std::fs::read(&bin).unwrap(),
    );
    assert_eq!(status, 409, "{body}");
    let (status, body) = put(&server, "ub", &source_url, b"int stolen;\n".to_vec());
    assert_eq!(status, 409, "{body}");
    // Nor delete them with an admin token bound to team-b.
    let resp = client()
        .delete(format!("{}/api/v1/debuginfo/{id}", server.url))
        .bearer_auth("adm-b")
        .send()
        .unwrap();
    assert_eq!(resp.status(), 409, "{}", resp.text().unwrap());
    // `missing` does not confirm team-a's source to team-b (by its hash).
    let sha = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(std::fs::read(&source).unwrap()))
    };
    let ask = serde_json::json!({"items": [{"build_id": id, "kind": "source", "sha256": sha, "path": source.to_str().unwrap()}]});
    let missing_for = |token: &str| -> usize {
        let resp = client()
            .post(format!("{}/api/v1/debuginfo/missing", server.url))
            .bearer_auth(token)
            .json(&ask)
            .send()
            .unwrap();
        let body: serde_json::Value = resp.json().unwrap();
        body["missing"].as_array().unwrap().len()
    };
    assert_eq!(missing_for("ua"), 0, "team-a's own source is there");
    assert_eq!(missing_for("ub"), 1, "not confirmed to team-b");
    // A page of a listing is cut after the reader's tenants: team-b's newer
    // upload does not push team-a's off its first page.
    let other = dir.path().join("other");
    std::fs::write(dir.path().join("other.c"), "int main(void) { return 7; }\n").unwrap();
    run(Command::new("gcc")
        .args(["-g"])
        .arg(dir.path().join("other.c"))
        .arg("-o")
        .arg(&other));
    let other_id = build_id_of(&other);
    let (status, _) = put(
        &server,
        "ub",
        &format!("/api/v1/debuginfo/{other_id}/debuginfo"),
        std::fs::read(&other).unwrap(),
    );
    assert_eq!(status, 201);
    let (_, page) = get(&server, Some("ra"), None, "/api/v1/debuginfo?limit=1");
    assert!(page.contains(&id) && !page.contains(&other_id), "{page}");
    let (_, text) = get(&server, Some("ra"), None, &fetch);
    assert!(
        text.contains("secret_sauce"),
        "the source was replaced: {text}"
    );
    let (status, body) = put(
        &server,
        "ua",
        &format!("/api/v1/debuginfo/{id}/debuginfo"),
        std::fs::read(&stripped).unwrap(),
    );
    assert!(
        status == 200 || status == 201,
        "its own tenant adds a candidate: {body}"
    );
    let (status, body) = put(&server, "uall", &source_url, b"int replaced;\n".to_vec());
    assert_eq!(status, 201, "{body}");
}
