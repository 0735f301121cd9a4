//! Rendering a query's answer: the JSON tree, flamebearer, folded, pprof
//! and SVG forms of a flamegraph, and a diff.

use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use symtrace_profiles::answer::Answer;
use symtrace_profiles::render::{self, pprof, svg};
use symtrace_profiles::selection::{self, Selection};
use symtrace_profiles::tree;

use crate::error::ApiError;

/// What one flamegraph or diff answer says about itself.
fn summary(answer: &Answer, sides: &[Selection], max_nodes: usize, t: &tree::Tree) -> Value {
    let ty = answer.type_info();
    let build_ids: Vec<Value> = answer
        .resolved
        .build_ids
        .iter()
        .map(|m| {
            let mut v = json!({
                "build_id": m.build_id,
                "id_kind": m.kind.as_str(),
                "module": m.module,
                "status": m.status.to_string(),
                "reason": m.status.reason(),
                "addresses": m.addresses,
                "unnamed": m.unnamed,
            });
            if let Some(content) = &m.content {
                v["content_sha256"] = json!(content);
            }
            v
        })
        .collect();
    let sel = &sides[0];
    json!({
        "service": sel.service,
        "profile_type": answer.profile_type,
        "unit": ty.sample_unit,
        "period": ty.period,
        "period_type": ty.period_type,
        "period_unit": ty.period_unit,
        "from": sel.from_ns.to_string(),
        "to": sel.to_ns.to_string(),
        "selector": sel.selector.matchers.iter().map(|m| m.name.clone()).collect::<Vec<_>>(),
        "max_nodes": max_nodes,
        "nodes": t.nodes.len(),
        "folded_subtrees": t.folded,
        "segments_read": answer.agg.segments_read,
        "bytes_read": answer.agg.bytes_read,
        "build_ids": build_ids,
    })
}

pub fn flamegraph(
    answer: &Answer,
    sides: &[Selection],
    format: &str,
    max_nodes: usize,
) -> Result<Response, ApiError> {
    let (agg, resolved) = (&answer.agg, &answer.resolved);
    let title = answer.profile_type.clone().unwrap_or_default();
    Ok(match format {
        "folded" => (
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            render::folded(&tree::Expanded::new(agg, resolved), agg, resolved, 0),
        )
            .into_response(),
        "pprof" => {
            let ty = answer.type_info();
            let body = pprof::encode(
                agg,
                resolved,
                &ty,
                sides[0].from_ns,
                sides[0].to_ns.min(selection::now_ns()),
            );
            (
                [
                    (header::CONTENT_TYPE, "application/vnd.google.protobuf+gzip"),
                    (
                        header::CONTENT_DISPOSITION,
                        "attachment; filename=\"profile.pb.gz\"",
                    ),
                ],
                body,
            )
                .into_response()
        }
        "svg" => {
            let ty = answer.type_info();
            let body = svg::render(agg, resolved, &title, &ty.sample_type, false)
                .map_err(ApiError::internal)?;
            ([(header::CONTENT_TYPE, "image/svg+xml")], body).into_response()
        }
        _ => {
            let started = std::time::Instant::now();
            let expanded = tree::Expanded::new(agg, resolved);
            // The table of top functions reads every stack: on another core
            // while this one builds the tree.
            let (t, functions) = std::thread::scope(|scope| {
                let functions = (format == "json")
                    .then(|| scope.spawn(|| render::top_functions(&expanded, agg, resolved, 100)));
                let t = tree::Tree::build(&expanded, max_nodes);
                (t, functions.map(|f| f.join().expect("top functions")))
            });
            tracing::debug!(
                nodes = t.nodes.len(),
                ms = started.elapsed().as_millis() as u64,
                "flamegraph tree built"
            );
            let mut out = summary(answer, sides, max_nodes, &t);
            out["samples"] = answer.points()[0].into();
            out["total"] = t.nodes[0].total[0].into();
            if format == "flamebearer" {
                let ty = answer.type_info();
                out = json!({
                    "version": 1,
                    "flamebearer": render::flamebearer(&t, agg, resolved),
                    "metadata": {
                        "format": "single",
                        "name": answer.profile_type,
                        "units": if ty.sample_unit == "count" { "samples" } else { ty.sample_unit.as_str() },
                        "sampleRate": if ty.period > 0 && ty.period_unit == "nanoseconds" {
                            1_000_000_000 / ty.period
                        } else { 0 },
                    },
                    "symtrace": out,
                });
                return Ok(Json(out).into_response());
            }
            out["functions"] = functions.unwrap_or_default().into();
            let tree = render::json_tree(&t, agg, resolved, false);
            json_response(render::with_raw_field(&out, "tree", &tree))
        }
    })
}

pub fn diff(
    answer: &Answer,
    sides: &[Selection],
    format: &str,
    max_nodes: usize,
) -> Result<Response, ApiError> {
    let (agg, resolved) = (&answer.agg, &answer.resolved);
    if format == "svg" {
        let ty = answer.type_info();
        let title = format!("diff: {}", answer.profile_type.clone().unwrap_or_default());
        let body = svg::render(agg, resolved, &title, &ty.sample_type, true)
            .map_err(ApiError::internal)?;
        return Ok(([(header::CONTENT_TYPE, "image/svg+xml")], body).into_response());
    }
    let t = tree::Tree::build(&tree::Expanded::new(agg, resolved), max_nodes);
    let mut out = summary(answer, sides, max_nodes, &t);
    let points = answer.points();
    out["baseline"] = json!({
        "from": sides[0].from_ns.to_string(), "to": sides[0].to_ns.to_string(),
        "samples": points[0], "total": t.nodes[0].total[0],
    });
    out["comparison"] = json!({
        "from": sides[1].from_ns.to_string(), "to": sides[1].to_ns.to_string(),
        "samples": points[1], "total": t.nodes[0].total[1],
    });
    let tree = render::json_tree(&t, agg, resolved, true);
    Ok(json_response(render::with_raw_field(&out, "tree", &tree)))
}

fn json_response(body: String) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}
