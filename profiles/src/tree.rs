//! The flamegraph tree (root = all samples, children = callees) built from
//! resolved stacks, truncated to `max_nodes`. [`crate::render`] turns it
//! (and the stacks) into the output formats.

use crate::aggregate::Aggregate;
use crate::resolved::Resolved;

/// A node of the shown tree: a frame and the run of sorted stacks that
/// pass through it.
pub struct Node {
    /// A shown frame, `u32::MAX` for the root.
    pub frame: u32,
    /// Values of the stacks through this node, per side.
    pub total: [i64; 2],
    /// Values of the stacks ending here (and of subtrees folded into it).
    pub self_: [i64; 2],
    /// Kept children, heaviest first.
    pub children: Vec<u32>,
    depth: u32,
    /// The stacks through this node: `[lo, hi)` of the sorted stacks.
    lo: u32,
    hi: u32,
}

/// The `max_nodes` heaviest nodes of the flamegraph tree.
///
/// Sorted stacks make the tree implicit: a node at depth d is a run of
/// stacks sharing d frames, its total a difference of prefix sums, its
/// children runs found by binary search. So the tree is walked heaviest
/// node first and stops at `max_nodes`, without building the millions of
/// nodes a large selection has; the subtrees left out fold into their
/// parent's self value (as Pyroscope does).
pub struct Tree {
    /// The kept nodes, the root first.
    pub nodes: Vec<Node>,
    /// Subtrees folded into their parent.
    pub folded: usize,
}

/// Every aggregated stack expanded to shown frames, root first, in one
/// buffer, sorted so that stacks sharing a prefix are adjacent.
pub struct Expanded {
    frames: Vec<u32>,
    /// (start, end) in `frames`, and the values, in sorted order.
    stacks: Vec<(u32, u32, [i64; 2])>,
    /// `prefix[i]`: sum of the values of stacks `0..i`.
    prefix: Vec<[i64; 2]>,
}

impl Expanded {
    /// The stacks of `agg` with their frames resolved.
    pub fn new(agg: &Aggregate, resolved: &Resolved) -> Self {
        let mut frames = Vec::new();
        let mut stacks = Vec::with_capacity(agg.stacks.len());
        for ((_, raw), v) in &agg.stacks {
            let start = frames.len() as u32;
            for &f in raw.iter().rev() {
                frames.extend(resolved.expansion(f).iter().rev());
            }
            stacks.push((start, frames.len() as u32, *v));
        }
        stacks.sort_unstable_by(|a, b| {
            frames[a.0 as usize..a.1 as usize].cmp(&frames[b.0 as usize..b.1 as usize])
        });
        let mut prefix = Vec::with_capacity(stacks.len() + 1);
        let mut sum = [0i64; 2];
        prefix.push(sum);
        for s in &stacks {
            add(&mut sum, s.2);
            prefix.push(sum);
        }
        Self {
            frames,
            stacks,
            prefix,
        }
    }

    /// The stacks (root first) with their values, in sorted order.
    pub fn iter(&self) -> impl Iterator<Item = (&[u32], [i64; 2])> + '_ {
        self.stacks
            .iter()
            .map(|&(a, b, v)| (&self.frames[a as usize..b as usize], v))
    }

    fn stack(&self, i: usize) -> &[u32] {
        let (a, b, _) = self.stacks[i];
        &self.frames[a as usize..b as usize]
    }

    /// Values of stacks `lo..hi`.
    fn sum(&self, lo: usize, hi: usize) -> [i64; 2] {
        let (a, b) = (self.prefix[lo], self.prefix[hi]);
        [b[0] - a[0], b[1] - a[1]]
    }
}

impl Tree {
    /// The `max_nodes` heaviest nodes.
    pub fn build(expanded: &Expanded, max_nodes: usize) -> Self {
        let n = expanded.stacks.len();
        let weight = |v: [i64; 2]| v[0].abs() + v[1].abs();
        let mut nodes = vec![Node {
            frame: u32::MAX,
            total: expanded.sum(0, n),
            self_: [0; 2],
            children: Vec::new(),
            depth: 0,
            lo: 0,
            hi: n as u32,
        }];
        // Candidates: (weight, parent, frame, depth, lo, hi), heaviest first.
        let mut heap = std::collections::BinaryHeap::new();
        let expand = |nodes: &mut Vec<Node>,
                      heap: &mut std::collections::BinaryHeap<_>,
                      id: u32| {
            let (depth, lo, hi) = {
                let node = &nodes[id as usize];
                (node.depth as usize, node.lo as usize, node.hi as usize)
            };
            // Stacks ending at this node sort first in its run.
            let mut k = lo
                + expanded.stacks[lo..hi].partition_point(|&(a, b, _)| (b - a) as usize <= depth);
            let own = expanded.sum(lo, k);
            add(&mut nodes[id as usize].self_, own);
            while k < hi {
                let frame = expanded.stack(k)[depth];
                let end = k + expanded.stacks[k..hi]
                    .partition_point(|&(a, _, _)| expanded.frames[a as usize + depth] <= frame);
                let total = expanded.sum(k, end);
                heap.push((
                    weight(total),
                    std::cmp::Reverse(k as u32),
                    id,
                    frame,
                    end as u32,
                ));
                k = end;
            }
        };
        expand(&mut nodes, &mut heap, 0);
        let mut folded = 0;
        while let Some((_, std::cmp::Reverse(lo), parent, frame, hi)) = heap.pop() {
            let total = expanded.sum(lo as usize, hi as usize);
            if nodes.len() >= max_nodes || weight(total) == 0 {
                add(&mut nodes[parent as usize].self_, total);
                folded += 1;
                continue;
            }
            let id = nodes.len() as u32;
            let depth = nodes[parent as usize].depth + 1;
            nodes.push(Node {
                frame,
                total,
                self_: [0; 2],
                children: Vec::new(),
                depth,
                lo,
                hi,
            });
            nodes[parent as usize].children.push(id);
            expand(&mut nodes, &mut heap, id);
        }
        // Popped heaviest first: children lists are already in that order.
        Self { nodes, folded }
    }

    /// The kept children of node `i`, heaviest first.
    pub fn children(&self, i: u32) -> &[u32] {
        &self.nodes[i as usize].children
    }
}

fn add(to: &mut [i64; 2], v: [i64; 2]) {
    to[0] += v[0];
    to[1] += v[1];
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::resolved::Shown;

    /// An aggregate whose frames are shown as themselves, named by `names`.
    pub(crate) fn setup(names: &[&str], stacks: &[(&[u32], i64)]) -> (Aggregate, Resolved) {
        let mut agg = Aggregate::default();
        let mut resolved = Resolved::new(names.len());
        let kind = agg.intern("native");
        for (i, n) in names.iter().enumerate() {
            let name = agg.intern(n);
            resolved.shown.insert(Shown {
                name,
                file: 0,
                kind,
                build_id: 0,
            });
            resolved.lines.push(0);
            resolved.push_expansion(i as u32, &[i as u32]);
        }
        for (frames, v) in stacks {
            // Leaf first, as stored.
            let key: Box<[u32]> = frames.iter().rev().copied().collect();
            *agg.stacks.entry((0, key)).or_default() = [*v, 0];
        }
        (agg, resolved)
    }

    fn names(t: &Tree, agg: &Aggregate, r: &Resolved, i: u32) -> Vec<String> {
        t.children(i)
            .iter()
            .map(|&c| {
                let n = &t.nodes[c as usize];
                format!(
                    "{}:{}/{}",
                    agg.str(r.shown[n.frame as usize].name),
                    n.total[0],
                    n.self_[0]
                )
            })
            .collect()
    }

    // main → a → b ×5, main → a ×2, main → c ×3, main → c → a ×1,
    // main → a → a (recursion) ×4, other ×1 (a different root).
    pub(crate) const NAMES: [&str; 5] = ["main", "a", "b", "c", "other"];
    pub(crate) const STACKS: [(&[u32], i64); 6] = [
        (&[0, 1, 2], 5),
        (&[0, 1], 2),
        (&[0, 3], 3),
        (&[0, 3, 1], 1),
        (&[0, 1, 1], 4),
        (&[4], 1),
    ];

    #[test]
    fn tree_totals_self_and_order() {
        let (agg, r) = setup(&NAMES, &STACKS);
        let e = Expanded::new(&agg, &r);
        let t = Tree::build(&e, 100);
        assert_eq!(t.nodes[0].total[0], 16);
        assert_eq!(t.folded, 0);
        assert_eq!(names(&t, &agg, &r, 0), ["main:15/0", "other:1/1"]);
        let main = t.children(0)[0];
        assert_eq!(names(&t, &agg, &r, main), ["a:11/2", "c:4/3"]);
        let a = t.children(main)[0];
        assert_eq!(names(&t, &agg, &r, a), ["b:5/5", "a:4/4"]);
        assert_eq!(t.nodes.len(), 8);
    }

    #[test]
    fn truncation_keeps_the_heaviest_and_folds_the_rest_into_self() {
        let (agg, r) = setup(&NAMES, &STACKS);
        let e = Expanded::new(&agg, &r);
        // Root, main (15), a (11), b (5): the next are a→a (4) and c (4).
        let t = Tree::build(&e, 4);
        assert_eq!(t.nodes.len(), 4);
        assert_eq!(names(&t, &agg, &r, 0), ["main:15/4"], "c folded into main");
        let main = t.children(0)[0];
        assert_eq!(names(&t, &agg, &r, main), ["a:11/6"], "a→a folded into a");
        // Values are conserved: total = sum of self over the kept nodes.
        let selves: i64 = t.nodes.iter().map(|n| n.self_[0]).sum();
        assert_eq!(selves, 16, "other (1) folded into the root");
        assert_eq!(t.folded, 3);
    }
}
