//! `symtrace-server symbolize BUILD_ID ADDR…`: asks a running server and
//! prints each address's frames innermost first, `function` then
//! `file:line:column`, like `llvm-symbolizer --inlines`.

use anyhow::{bail, Context};
use serde_json::{json, Value};

pub async fn run(
    build_id: &str,
    addresses: &[String],
    server: &str,
    token: Option<&str>,
    raw_json: bool,
) -> anyhow::Result<()> {
    let url = format!("{}/api/v1/symbolize", server.trim_end_matches('/'));
    let mut request = reqwest::Client::new()
        .post(&url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(json!({ "build_id": build_id, "addresses": addresses }).to_string());
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request
        .send()
        .await
        .with_context(|| format!("POST {url}"))?;
    let status = response.status();
    let text = response
        .text()
        .await
        .with_context(|| format!("reading {url}"))?;
    let body: Value = serde_json::from_str(&text)
        .with_context(|| format!("{url} answered {status} without JSON"))?;
    if !status.is_success() {
        bail!(
            "{url} answered {status}: {}",
            body["error"]["message"].as_str().unwrap_or("(no message)")
        );
    }
    if raw_json {
        println!("{}", serde_json::to_string_pretty(&body)?);
        return Ok(());
    }
    let result = &body["results"][0];
    if let Some(message) = result["message"].as_str() {
        eprintln!(
            "{build_id}: {} ({message})",
            result["status"].as_str().unwrap_or("?")
        );
    }
    for address in result["addresses"].as_array().into_iter().flatten() {
        println!("{}", address["address"].as_str().unwrap_or("?"));
        let frames = address["frames"].as_array().cloned().unwrap_or_default();
        if frames.is_empty() {
            println!("?? ({})", address["status"].as_str().unwrap_or("?"));
        }
        for frame in frames {
            let inlined = if frame["inlined"].as_bool() == Some(true) {
                " (inlined)"
            } else {
                ""
            };
            println!("{}{inlined}", frame["function"].as_str().unwrap_or("??"));
            println!(
                "  {}:{}:{}",
                frame["file"].as_str().unwrap_or("??"),
                frame["line"].as_u64().unwrap_or(0),
                frame["column"].as_u64().unwrap_or(0)
            );
        }
        println!();
    }
    Ok(())
}
