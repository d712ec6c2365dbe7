//! Elementwise-fusion grouping: marks maximal chains of elementwise nodes that a codegen
//! engine can compile into one loop nest. An edge joins a group when the value it carries
//! is used exactly once and is not a graph output, so no intermediate must be materialised.
//! Groups of one node are left unmarked.

use crate::Graph;

pub fn group_elementwise(g: &Graph) -> Graph {
    let uses = g.uses();
    let mut parent: Vec<usize> = (0..g.nodes.len()).collect();
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
    for (i, n) in g.nodes.iter().enumerate() {
        if !n.op.is_elementwise() {
            continue;
        }
        for v in n.input_values() {
            let Some(p) = g.producer(v) else { continue };
            if g.node(p).op.is_elementwise() && uses[v.index()].len() == 1 && !g.is_output(v) {
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
    let mut out = g.clone();
    let mut ids: std::collections::HashMap<usize, u32> = std::collections::HashMap::new();
    for i in 0..g.nodes.len() {
        let r = find(&mut parent, i);
        out.nodes[i].group = if size[r] >= 2 && g.nodes[i].op.is_elementwise() {
            let next = ids.len() as u32;
            Some(*ids.entry(r).or_insert(next))
        } else {
            None
        };
    }
    out
}
