//! The output formats of a query: the nested JSON tree, Pyroscope's
//! flamebearer, folded lines, the top-functions table, and (in the
//! submodules) pprof and SVG. Each works on the aggregate, its resolved
//! frames and the [`Tree`] or [`Expanded`] stacks; none recurses.

pub mod pprof;
pub mod svg;

use rustc_hash::FxHashMap;
use serde_json::{json, Value};

use crate::aggregate::Aggregate;
use crate::resolved::Resolved;
use crate::tree::{Expanded, Tree};

/// Functions by self value, from every stack (not the truncated tree):
/// self is what a function's leaf frames hold, total what the stacks
/// through it hold, a recursive function counted once per stack.
pub fn top_functions(
    expanded: &Expanded,
    agg: &Aggregate,
    resolved: &Resolved,
    limit: usize,
) -> Vec<Value> {
    // Dense name numbers.
    let mut name_of: Vec<u32> = Vec::with_capacity(resolved.shown.len());
    let mut names: FxHashMap<u32, u32> = FxHashMap::default();
    let mut first_frame: Vec<u32> = Vec::new();
    for (i, shown) in resolved.shown.iter().enumerate() {
        let next = names.len() as u32;
        let n = *names.entry(shown.name).or_insert(next);
        if n == next {
            first_frame.push(i as u32);
        }
        name_of.push(n);
    }
    let mut sums = vec![(0i64, 0i64); names.len()];
    // The last stack that counted each name toward total.
    let mut counted = vec![u32::MAX; names.len()];
    for (k, (stack, v)) in expanded.iter().enumerate() {
        for &f in stack {
            let name = name_of[f as usize] as usize;
            if counted[name] != k as u32 {
                counted[name] = k as u32;
                sums[name].1 += v[0];
            }
        }
        if let Some(&leaf) = stack.last() {
            sums[name_of[leaf as usize] as usize].0 += v[0];
        }
    }
    let mut rows: Vec<(usize, (i64, i64))> = sums.into_iter().enumerate().collect();
    rows.sort_by(|a, b| b.1 .0.cmp(&a.1 .0).then(b.1 .1.cmp(&a.1 .1)));
    rows.into_iter()
        .filter(|(_, (_, total))| *total != 0)
        .take(limit)
        .map(|(name, (self_, total))| {
            let mut m = frame_fields(agg, resolved, first_frame[name]);
            m.insert("self".into(), self_.into());
            m.insert("total".into(), total.into());
            Value::Object(m)
        })
        .collect()
}

/// A node's name and details as JSON fields.
fn frame_fields(
    agg: &Aggregate,
    resolved: &Resolved,
    frame: u32,
) -> serde_json::Map<String, Value> {
    let mut m = serde_json::Map::new();
    if frame == u32::MAX {
        m.insert("name".into(), "total".into());
        m.insert("kind".into(), "root".into());
        return m;
    }
    let s = &resolved.shown[frame as usize];
    m.insert("name".into(), agg.str(s.name).into());
    m.insert("kind".into(), agg.str(s.kind).into());
    if s.file != 0 {
        m.insert("file".into(), agg.str(s.file).into());
        let line = resolved.lines[frame as usize];
        if line != 0 {
            m.insert("line".into(), line.into());
        }
    }
    if s.build_id != 0 {
        m.insert("build_id".into(), agg.str(s.build_id).into());
    }
    m
}

/// The nested JSON tree as text; `diff` adds the comparison side's values.
///
/// Written depth-first with an explicit stack, never through a nested
/// `serde_json::Value`: building, serializing and dropping such a value
/// recurses once per level, and a stack's depth is the sender's choice.
pub fn json_tree(tree: &Tree, agg: &Aggregate, resolved: &Resolved, diff: bool) -> String {
    let mut out = String::with_capacity(tree.nodes.len() * 96);
    // (node, index of its next child to write).
    let mut stack: Vec<(u32, usize)> = vec![(0, 0)];
    open_node(&mut out, tree, agg, resolved, 0, diff);
    while let Some(top) = stack.last_mut() {
        let (i, next) = *top;
        let children = tree.children(i);
        if next < children.len() {
            top.1 += 1;
            if next > 0 {
                out.push(',');
            }
            let c = children[next];
            open_node(&mut out, tree, agg, resolved, c, diff);
            stack.push((c, 0));
        } else {
            out.push_str("]}");
            stack.pop();
        }
    }
    out
}

/// `{"name":…,…,"children":[` of one node.
fn open_node(out: &mut String, t: &Tree, agg: &Aggregate, r: &Resolved, i: u32, diff: bool) {
    let n = &t.nodes[i as usize];
    let mut m = frame_fields(agg, r, n.frame);
    if diff {
        m.insert("baseline".into(), n.total[0].into());
        m.insert("comparison".into(), n.total[1].into());
        m.insert("self_baseline".into(), n.self_[0].into());
        m.insert("self_comparison".into(), n.self_[1].into());
    } else {
        m.insert("self".into(), n.self_[0].into());
        m.insert("total".into(), n.total[0].into());
    }
    let fields = Value::Object(m).to_string();
    // `{…}` without its closing brace.
    out.push_str(&fields[..fields.len() - 1]);
    out.push_str(",\"children\":[");
}

/// A JSON object's text with `"key": raw` added (`raw` is JSON already).
pub fn with_raw_field(object: &Value, key: &str, raw: &str) -> String {
    let text = object.to_string();
    let body = text.strip_suffix('}').unwrap_or(&text);
    let mut out = String::with_capacity(body.len() + key.len() + raw.len() + 8);
    out.push_str(body);
    if body.len() > 1 {
        out.push(',');
    }
    out.push_str(&Value::String(key.to_owned()).to_string());
    out.push(':');
    out.push_str(raw);
    out.push('}');
    out
}

/// Pyroscope's flamebearer: per depth, a flat list of
/// `[x offset from the previous node's end, total, self, name index]`.
pub fn flamebearer(tree: &Tree, agg: &Aggregate, resolved: &Resolved) -> Value {
    let mut names: Vec<String> = Vec::new();
    let mut name_ids: FxHashMap<u32, usize> = FxHashMap::default();
    let mut levels: Vec<Vec<i64>> = Vec::new();
    // Per level: the x where the previous node ended.
    let mut ends: Vec<i64> = Vec::new();
    let mut max_self = 0;
    // Depth-first, left to right: (node, depth, x).
    let mut stack = vec![(0u32, 0usize, 0i64)];
    while let Some((i, depth, x)) = stack.pop() {
        let n = &tree.nodes[i as usize];
        let name = *name_ids.entry(n.frame).or_insert_with(|| {
            names.push(
                frame_fields(agg, resolved, n.frame)["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            );
            names.len() - 1
        });
        if levels.len() <= depth {
            levels.push(Vec::new());
            ends.push(0);
        }
        levels[depth].extend([x - ends[depth], n.total[0], n.self_[0], name as i64]);
        ends[depth] = x + n.total[0];
        max_self = max_self.max(n.self_[0]);
        // Children start at the parent's x, heaviest (first) leftmost.
        let mut cx = x;
        let first = stack.len();
        for &c in tree.children(i) {
            stack.push((c, depth + 1, cx));
            cx += tree.nodes[c as usize].total[0];
        }
        stack[first..].reverse();
    }
    json!({
        "names": names,
        "levels": levels,
        "numTicks": tree.nodes[0].total[0],
        "maxSelf": max_self,
    })
}

/// `root;…;leaf value` lines (the format of flamegraph.pl, inferno and
/// speedscope), heaviest first, one line per distinct name path: stacks
/// that differ only in what the names leave out (the address, line or file
/// of a frame) add up into one line.
pub fn folded(expanded: &Expanded, agg: &Aggregate, resolved: &Resolved, side: usize) -> String {
    let mut sums: FxHashMap<String, i64> = FxHashMap::default();
    for (stack, v) in expanded.iter().filter(|(_, v)| v[side] != 0) {
        *sums.entry(folded_names(stack, agg, resolved)).or_default() += v[side];
    }
    let mut lines: Vec<(i64, String)> = sums
        .into_iter()
        .filter(|&(_, v)| v != 0)
        .map(|(s, v)| (v, s))
        .collect();
    lines.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    let mut out = String::new();
    for (v, s) in lines {
        out.push_str(&s);
        out.push(' ');
        out.push_str(&v.to_string());
        out.push('\n');
    }
    out
}

/// A stack's names joined by `;` (newlines, which would break the line
/// format, become spaces).
pub fn folded_names(stack: &[u32], agg: &Aggregate, resolved: &Resolved) -> String {
    let names: Vec<&str> = stack
        .iter()
        .map(|&f| agg.str(resolved.shown[f as usize].name))
        .collect();
    names.join(";").replace(['\n', '\r'], " ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::tests::{setup, NAMES, STACKS};

    #[test]
    fn top_functions_count_recursion_once() {
        let (agg, r) = setup(&NAMES, &STACKS);
        let e = Expanded::new(&agg, &r);
        let top = top_functions(&e, &agg, &r, 10);
        let row = |name: &str| {
            let f = top.iter().find(|f| f["name"] == name).unwrap();
            (f["self"].as_i64().unwrap(), f["total"].as_i64().unwrap())
        };
        assert_eq!(row("b"), (5, 5));
        assert_eq!(row("a"), (2 + 1 + 4, 5 + 2 + 1 + 4));
        assert_eq!(row("main"), (0, 15));
        assert_eq!(top[0]["name"], "a", "heaviest self first");
    }

    #[test]
    fn flamebearer_levels_and_folded_lines() {
        let (agg, r) = setup(&NAMES, &STACKS);
        let e = Expanded::new(&agg, &r);
        let t = Tree::build(&e, 100);
        let fb = flamebearer(&t, &agg, &r);
        assert_eq!(fb["numTicks"], 16);
        let names: Vec<&str> = fb["names"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        // Level 2 (a, c under main): [x delta, total, self, name].
        let level: Vec<i64> = fb["levels"][2]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_i64().unwrap())
            .collect();
        assert_eq!(level.len(), 8);
        assert_eq!(&level[..3], [0, 11, 2]);
        assert_eq!(names[level[3] as usize], "a");
        assert_eq!(&level[4..7], [0, 4, 3], "c right after a");
        assert_eq!(names[level[7] as usize], "c");
        // "other" starts where main ends: x = 15 on level 1.
        assert_eq!(fb["levels"][1][4], 0);
        let folded = folded(&e, &agg, &r, 0);
        assert_eq!(
            folded,
            "main;a;b 5\nmain;a;a 4\nmain;c 3\nmain;a 2\nmain;c;a 1\nother 1\n"
        );
    }

    #[test]
    fn folded_lines_merge_stacks_with_the_same_names() {
        use crate::resolved::Shown;
        // Raw frames 0 and 1: two addresses of `work` (one shown frame);
        // raw frame 2: `main`; raw frame 3: another `work`, from another
        // file (another shown frame, the same name).
        let mut agg = Aggregate::default();
        let mut r = Resolved::new(4);
        let kind = agg.intern("native");
        let (work, main, other) = (agg.intern("work"), agg.intern("main"), agg.intern("b.c"));
        for (name, file) in [(work, 0), (main, 0), (work, other)] {
            r.shown.insert(Shown {
                name,
                file,
                kind,
                build_id: 0,
            });
            r.lines.push(0);
        }
        r.push_expansion(0, &[0]);
        r.push_expansion(1, &[0]);
        r.push_expansion(2, &[1]);
        r.push_expansion(3, &[2]);
        for (raw, v) in [([0u32, 2], 3), ([1, 2], 4), ([3, 2], 5)] {
            *agg.stacks.entry((0, Box::new(raw))).or_default() = [v, 0];
        }
        let e = Expanded::new(&agg, &r);
        assert_eq!(folded(&e, &agg, &r, 0), "main;work 12\n");
        // The tree keeps the frames apart (their files differ).
        let t = Tree::build(&e, 100);
        assert_eq!(t.nodes.len(), 4, "root, main, work (a.c), work (b.c)");
    }
}
