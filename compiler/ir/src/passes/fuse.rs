//! Elementwise-fusion grouping: marks maximal chains of elementwise nodes that a codegen
//! engine can compile into one loop nest. An edge joins a group when the value it carries
//! is used exactly once and is not a graph output, so no intermediate must be materialised.
//! Groups of one node are left unmarked.

use crate::Graph;

pub fn group_elementwise(g: &Graph) -> Graph {
    fuse_if_changed(g).unwrap_or_else(|| g.clone())
}

/// [`group_elementwise`], or `None` when every node already has the group it would get:
/// the groups are worked out first, and the graph is copied only to change one.
pub(crate) fn fuse_if_changed(g: &Graph) -> Option<Graph> {
    let groups = groups(g);
    if g.nodes.iter().zip(&groups).all(|(n, &group)| n.group == group) {
        return None;
    }
    let mut out = g.clone();
    for (n, group) in out.nodes.iter_mut().zip(groups) {
        n.group = group;
    }
    Some(out)
}

/// The fusion group of each node, numbered in order of the groups' first nodes.
fn groups(g: &Graph) -> Vec<Option<u32>> {
    let uses = g.use_counts();
    // Graph outputs as flags, not a scan of the outputs per edge.
    let mut output = vec![false; g.values.len()];
    for o in &g.outputs {
        if let Some(flag) = output.get_mut(o.value.index()) {
            *flag = true;
        }
    }
    let mut parent: Vec<usize> = (0..g.nodes.len()).collect();
    for (i, n) in g.nodes.iter().enumerate() {
        if !n.op.is_elementwise() {
            continue;
        }
        for v in n.input_values() {
            let Some(p) = g.producer(v) else { continue };
            if g.node(p).op.is_elementwise() && uses[v.index()] == 1 && !output[v.index()] {
                let (a, b) = (find(&mut parent, p.index()), find(&mut parent, i));
                parent[b.max(a)] = a.min(b);
            }
        }
    }
    let mut size = vec![0usize; g.nodes.len()];
    for i in 0..g.nodes.len() {
        let r = find(&mut parent, i);
        size[r] += 1;
    }
    // Group ids by root, handed out in node order.
    let mut ids: Vec<Option<u32>> = vec![None; g.nodes.len()];
    let mut next = 0u32;
    (0..g.nodes.len())
        .map(|i| {
            let r = find(&mut parent, i);
            if size[r] < 2 || !g.nodes[i].op.is_elementwise() {
                return None;
            }
            Some(*ids[r].get_or_insert_with(|| {
                next += 1;
                next - 1
            }))
        })
        .collect()
}

/// The root of `x`'s set, compressing the path to it.
fn find(p: &mut [usize], x: usize) -> usize {
    let mut r = x;
    while p[r] != r {
        r = p[r];
    }
    let mut y = x;
    while p[y] != r {
        let next = p[y];
        p[y] = r;
        y = next;
    }
    r
}
