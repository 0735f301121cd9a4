//! The flamegraph tree (root = all samples, children = callees) built from
//! resolved stacks, truncated to `max_nodes`, and the text forms derived
//! from the stacks: folded lines and the top-functions table.

use rustc_hash::FxHashMap;
use serde_json::{json, Value};

use super::aggregate::Aggregate;
use super::frames::Resolved;

pub struct Node {
    /// A shown frame, `u32::MAX` for the root.
    pub frame: u32,
    pub total: [i64; 2],
    pub self_: [i64; 2],
    pub children: Vec<u32>,
}

pub struct Tree {
    pub nodes: Vec<Node>,
    /// Nodes dropped by truncation (their values went to the parent's self).
    pub truncated: usize,
}

/// Every aggregated stack expanded to shown frames, root first, in one
/// buffer, sorted so that stacks sharing a prefix are adjacent.
pub struct Expanded {
    frames: Vec<u32>,
    /// (start, end) in `frames`, and the values, in sorted order.
    stacks: Vec<(u32, u32, [i64; 2])>,
}

impl Expanded {
    pub fn new(agg: &Aggregate, resolved: &Resolved) -> Self {
        let mut frames = Vec::new();
        let mut stacks = Vec::with_capacity(agg.stacks.len());
        for ((_, raw), v) in &agg.stacks {
            let start = frames.len() as u32;
            for &f in raw.iter().rev() {
                frames.extend(resolved.expansion[f as usize].iter().rev());
            }
            stacks.push((start, frames.len() as u32, *v));
        }
        stacks.sort_unstable_by(|a, b| {
            frames[a.0 as usize..a.1 as usize].cmp(&frames[b.0 as usize..b.1 as usize])
        });
        Self { frames, stacks }
    }

    pub fn iter(&self) -> impl Iterator<Item = (&[u32], [i64; 2])> + '_ {
        self.stacks
            .iter()
            .map(|&(a, b, v)| (&self.frames[a as usize..b as usize], v))
    }
}

impl Tree {
    /// One pass over the sorted stacks: each stack shares its prefix with
    /// the previous one, so only the rest becomes new nodes (no hashing).
    pub fn build(expanded: &Expanded) -> Self {
        let mut nodes = vec![Node {
            frame: u32::MAX,
            total: [0; 2],
            self_: [0; 2],
            children: Vec::new(),
        }];
        // Node ids along the previous stack.
        let mut path: Vec<u32> = Vec::new();
        let mut prev: &[u32] = &[];
        for (stack, v) in expanded.iter() {
            let common = prev
                .iter()
                .zip(stack)
                .take_while(|(a, b)| a == b)
                .count()
                .min(path.len());
            path.truncate(common);
            for &frame in &stack[common..] {
                let id = nodes.len() as u32;
                let parent = path.last().copied().unwrap_or(0);
                nodes.push(Node {
                    frame,
                    total: [0; 2],
                    self_: [0; 2],
                    children: Vec::new(),
                });
                nodes[parent as usize].children.push(id);
                path.push(id);
            }
            add(&mut nodes[0].total, v);
            for &n in &path {
                add(&mut nodes[n as usize].total, v);
            }
            add(&mut nodes[path.last().copied().unwrap_or(0) as usize].self_, v);
            prev = stack;
        }
        // Heaviest child first.
        let weight = |n: &Node| n.total[0].abs() + n.total[1].abs();
        for i in 0..nodes.len() {
            if nodes[i].children.len() > 1 {
                let mut children = std::mem::take(&mut nodes[i].children);
                children.sort_by_key(|&c| std::cmp::Reverse(weight(&nodes[c as usize])));
                nodes[i].children = children;
            }
        }
        Self {
            nodes,
            truncated: 0,
        }
    }

    /// Keeps the `max` heaviest nodes. A node weighs at least as much as
    /// any descendant, so the kept set is a subtree; what is dropped is
    /// added to its parent's self value (as Pyroscope does).
    pub fn truncate(&mut self, max: usize) {
        if self.nodes.len() <= max {
            return;
        }
        let weight = |n: &Node| n.total[0].abs() + n.total[1].abs();
        let mut weights: Vec<i64> = self.nodes.iter().map(weight).collect();
        let (_, &mut threshold, _) = weights.select_nth_unstable_by(max - 1, |a, b| b.cmp(a));
        let mut kept = 0usize;
        let mut stack = vec![0u32];
        while let Some(i) = stack.pop() {
            kept += 1;
            let children = std::mem::take(&mut self.nodes[i as usize].children);
            let mut kept_children = Vec::new();
            for c in children {
                let n = &self.nodes[c as usize];
                if weight(n) >= threshold && weight(n) > 0 && kept + stack.len() < max {
                    kept_children.push(c);
                    stack.push(c);
                } else {
                    let t = n.total;
                    add(&mut self.nodes[i as usize].self_, t);
                }
            }
            self.nodes[i as usize].children = kept_children;
        }
        self.truncated = self.nodes.len() - kept;
    }

    /// Functions by self value, from the untruncated tree: per name, self
    /// is the sum of its nodes' self values and total the sum over nodes
    /// with no ancestor of the same name (recursion counts once).
    pub fn top_functions(
        &self,
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
        let mut active = vec![0u32; names.len()];
        // (node, entering?)
        let mut stack: Vec<(u32, bool)> = vec![(0, true)];
        while let Some((i, enter)) = stack.pop() {
            let n = &self.nodes[i as usize];
            let name = (n.frame != u32::MAX).then(|| name_of[n.frame as usize] as usize);
            if !enter {
                if let Some(name) = name {
                    active[name] -= 1;
                }
                continue;
            }
            if let Some(name) = name {
                sums[name].0 += n.self_[0];
                if active[name] == 0 {
                    sums[name].1 += n.total[0];
                }
                active[name] += 1;
            }
            stack.push((i, false));
            stack.extend(n.children.iter().map(|&c| (c, true)));
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
}

fn add(to: &mut [i64; 2], v: [i64; 2]) {
    to[0] += v[0];
    to[1] += v[1];
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

/// The nested JSON tree; `diff` adds the comparison side's values.
pub fn json_tree(tree: &Tree, agg: &Aggregate, resolved: &Resolved, diff: bool) -> Value {
    fn node(t: &Tree, agg: &Aggregate, r: &Resolved, i: u32, diff: bool) -> Value {
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
        let children: Vec<Value> = n
            .children
            .iter()
            .map(|&c| node(t, agg, r, c, diff))
            .collect();
        m.insert("children".into(), children.into());
        Value::Object(m)
    }
    node(tree, agg, resolved, 0, diff)
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
        for &c in &n.children {
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
/// speedscope), heaviest first.
pub fn folded(expanded: &Expanded, agg: &Aggregate, resolved: &Resolved, side: usize) -> String {
    let mut lines: Vec<(i64, String)> = expanded
        .iter()
        .filter(|(_, v)| v[side] != 0)
        .map(|(stack, v)| (v[side], folded_names(stack, agg, resolved)))
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
