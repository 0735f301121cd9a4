//! The flamegraph tree (root = all samples, children = callees) built from
//! resolved stacks, truncated to `max_nodes`, and the text forms derived
//! from the stacks: folded lines and the top-functions table.

use rustc_hash::FxHashMap;
use serde_json::{json, Value};

use super::aggregate::Aggregate;
use super::frames::Resolved;

/// One node of the full tree; nodes are in pre-order (a parent comes
/// before its descendants), without child lists (millions of nodes would
/// mean millions of allocations).
pub struct Node {
    /// A shown frame, `u32::MAX` for the root.
    pub frame: u32,
    /// `u32::MAX` for the root.
    pub parent: u32,
    pub total: [i64; 2],
    pub self_: [i64; 2],
}

pub struct Tree {
    pub nodes: Vec<Node>,
    /// The shown tree after truncation: kept nodes' children, heaviest first.
    pub children: FxHashMap<u32, Vec<u32>>,
    /// Nodes shown, and nodes dropped (their values went to their
    /// parent's self, as Pyroscope does).
    pub kept: usize,
    pub truncated: usize,
    /// Each node's own self value (side 0) before truncation moved
    /// dropped values into parents.
    own_self: Vec<i64>,
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
    /// the previous one, so only the rest becomes new nodes (no hashing),
    /// then the `max_nodes` heaviest are kept.
    pub fn build(expanded: &Expanded, max_nodes: usize) -> Self {
        let mut nodes = vec![Node {
            frame: u32::MAX,
            parent: u32::MAX,
            total: [0; 2],
            self_: [0; 2],
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
                nodes.push(Node {
                    frame,
                    parent: path.last().copied().unwrap_or(0),
                    total: [0; 2],
                    self_: [0; 2],
                });
                path.push(id);
            }
            add(&mut nodes[0].total, v);
            for &n in &path {
                add(&mut nodes[n as usize].total, v);
            }
            add(
                &mut nodes[path.last().copied().unwrap_or(0) as usize].self_,
                v,
            );
            prev = stack;
        }
        let own_self = nodes.iter().map(|n| n.self_[0]).collect();
        let mut tree = Self {
            nodes,
            children: FxHashMap::default(),
            kept: 0,
            truncated: 0,
            own_self,
        };
        tree.truncate(max_nodes);
        tree
    }

    fn weight(n: &Node) -> i64 {
        n.total[0].abs() + n.total[1].abs()
    }

    /// Keeps the `max` heaviest nodes. A node weighs at least as much as
    /// any descendant, so the kept set is a subtree; what is dropped is
    /// added to its parent's self value.
    fn truncate(&mut self, max: usize) {
        let threshold = if self.nodes.len() <= max {
            i64::MIN
        } else {
            let mut weights: Vec<i64> = self.nodes.iter().map(Self::weight).collect();
            *weights.select_nth_unstable_by(max - 1, |a, b| b.cmp(a)).1
        };
        let mut keep = vec![false; self.nodes.len()];
        keep[0] = true;
        let mut kept = 1usize;
        for i in 1..self.nodes.len() {
            let parent = self.nodes[i].parent as usize;
            if !keep[parent] {
                continue;
            }
            let w = Self::weight(&self.nodes[i]);
            if w >= threshold && kept < max {
                keep[i] = true;
                kept += 1;
                self.children
                    .entry(parent as u32)
                    .or_default()
                    .push(i as u32);
            } else {
                let t = self.nodes[i].total;
                add(&mut self.nodes[parent].self_, t);
            }
        }
        for children in self.children.values_mut() {
            children.sort_by_key(|&c| std::cmp::Reverse(Self::weight(&self.nodes[c as usize])));
        }
        self.kept = kept;
        self.truncated = self.nodes.len() - kept;
    }

    pub fn children(&self, i: u32) -> &[u32] {
        self.children.get(&i).map_or(&[], Vec::as_slice)
    }

    /// Functions by self value, over the whole tree: per name, self is the
    /// sum of its nodes' own self values (from before truncation) and
    /// total the sum over nodes with no ancestor of the same name
    /// (recursion counts once).
    pub fn top_functions(&self, agg: &Aggregate, resolved: &Resolved, limit: usize) -> Vec<Value> {
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
        // The ancestors of the current node (pre-order walk).
        let mut path: Vec<u32> = Vec::new();
        for (i, n) in self.nodes.iter().enumerate().skip(1) {
            while path.last().is_some_and(|&p| p != n.parent) {
                let p = path.pop().expect("non-empty");
                active[name_of[self.nodes[p as usize].frame as usize] as usize] -= 1;
            }
            let name = name_of[n.frame as usize] as usize;
            sums[name].0 += self.own_self[i];
            if active[name] == 0 {
                sums[name].1 += n.total[0];
            }
            active[name] += 1;
            path.push(i as u32);
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
        let children: Vec<Value> = t
            .children(i)
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
