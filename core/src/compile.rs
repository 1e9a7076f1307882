//! The mask-aware compiler: a SUF at an effective width becomes a fixed,
//! mask-independent evaluation shape (seeds/001 §4.3–4.4, Protocol 3).
//!
//! # One DCF key per (mask, width)
//!
//! Every predicate is a comparison `[u < β]` on a public *view*
//! `u = ((x mod 2^w) + c) mod 2^w` of the input. The masked view
//! `û = ((x̂ mod 2^w) + c) mod 2^w` equals `u + (r mod 2^w) mod 2^w` for
//! every shift `c`, so one DCF key `D(y) = [y < r mod 2^w]` per width `w`
//! answers every comparison on every view of that width:
//!
//! `[u < β] = D((û − β) mod 2^w) ⊕ D(û) ⊕ [û < β]`
//!
//! (DESIGN.md §3; checked exhaustively in the tests). `D(û)` itself is the
//! view's *wrap bit* `[û < r_w]`, the carry that truncation and width
//! extension need. The public shape — views, thresholds, evaluation points
//! per key — is computed from the SUF alone, so it cannot depend on the
//! mask: there is no padding and no mask-dependent deduplication, and the
//! sentinel thresholds (β = 0 and β = 2^w) are constants decided from the
//! descriptor.
//!
//! # Boolean normalization
//!
//! Piecewise bit outputs become one global circuit (Lemma D.2): with
//! interval indicators `J_i = C_{α_{i+1}} ⊕ C_{α_i}`, output j is
//! `⊕_p U_p ∧ prog_p` where `U_p` is the XOR of the `J_i` of the intervals
//! whose output j runs program p. An output that runs one program
//! everywhere needs no indicator at all. `∨` becomes `a ⊕ b ⊕ (a ∧ b)`; AND
//! gates are levelled, and the levels are the Boolean rounds.

use crate::error::SufError;
use crate::ring::{Width, cast};
use crate::suf::{
    Domain, MAX_ARITH, MAX_BOOL, MAX_DEGREE, MAX_INTERVALS, MAX_PREDS, Op, Pred, Suf,
};

/// Most distinct views of the input.
pub const MAX_VIEWS: usize = 8;
/// Most comparison queries (thresholds) across all views.
pub const MAX_QUERIES: usize = MAX_INTERVALS + MAX_PREDS;
/// Most DCF keys (distinct view widths) per element.
pub const MAX_KEYS: usize = 6;
/// Most Boolean circuit nodes.
pub const MAX_NODES: usize = 128;
/// Most AND gates.
pub const MAX_ANDS: usize = 24;

/// A public view of the masked input: `((x̂ mod 2^width) + add) mod 2^width`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct View {
    /// The view's width w.
    pub width: Width,
    /// The shift c, reduced modulo 2^w.
    pub add: u64,
}

impl View {
    /// The view of width `width` shifted by `add`.
    pub const fn new(width: Width, add: u64) -> View {
        View {
            width,
            add: width.reduce(add),
        }
    }

    /// The view's value at a (masked or clear) word.
    #[inline(always)]
    pub const fn at(&self, x: u64) -> u64 {
        self.width.view(x, self.add)
    }
}

/// A comparison `[u_view < threshold]` with `0 < threshold < 2^w`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Query {
    /// Index of the view.
    pub view: u8,
    /// The public threshold β.
    pub threshold: u64,
}

/// A node of the normalized Boolean circuit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Node {
    /// The constant 0.
    Zero,
    /// The constant 1.
    One,
    /// The result of comparison query `i`.
    Query(u8),
    /// The wrap bit `[û_v < r mod 2^w]` of view `v`.
    Wrap(u8),
    /// XOR of two nodes.
    Xor(u8, u8),
    /// Negation.
    Not(u8),
    /// AND of two nodes: needs one round at its level.
    And(u8, u8),
}

/// The compiled, mask-independent shape of a SUF at an effective width.
#[derive(Debug, PartialEq, Eq)]
pub struct Compiled {
    /// The source SUF.
    pub suf: Suf,
    /// The effective width k of the main view.
    pub k: Width,
    /// The views; view 0 is the main view, on which the SUF's order is the
    /// unsigned order of the view.
    pub views: [View; MAX_VIEWS],
    /// How many views there are.
    pub view_count: usize,
    /// For each view, the index of its DCF key.
    pub view_key: [u8; MAX_VIEWS],
    /// Whether a view is evaluated at all (it has queries or its wrap bit
    /// is read); unused views get no key and no points.
    pub view_used: [bool; MAX_VIEWS],
    /// Distinct key widths.
    pub keys: [Width; MAX_KEYS],
    /// How many keys each element has.
    pub key_count: usize,
    /// The comparison queries.
    pub queries: [Query; MAX_QUERIES],
    /// How many queries there are.
    pub query_count: usize,
    /// Evaluation points per key, per element.
    pub points_per_key: [usize; MAX_KEYS],
    /// Offset of each view's own point `û` within its key's points.
    pub view_point: [usize; MAX_VIEWS],
    /// Offset of each query's point `û − β` within its key's points.
    pub query_point: [usize; MAX_QUERIES],
    /// The Boolean circuit, in topological order.
    pub nodes: [Node; MAX_NODES],
    /// How many nodes there are.
    pub node_count: usize,
    /// AND depth of each node.
    pub level: [u8; MAX_NODES],
    /// Number of AND levels.
    pub and_depth: usize,
    /// AND gates (node indices), ordered by level.
    pub ands: [u8; MAX_ANDS],
    /// How many AND gates there are.
    pub and_count: usize,
    /// `boundary[t]`: node of `C_t = [x < α_t]`, for `1 ≤ t < m`.
    pub boundary: [u8; MAX_INTERVALS],
    /// Node of each SUF predicate.
    pub pred_node: [u8; MAX_PREDS],
    /// Node of each bit output.
    pub bool_node: [u8; MAX_BOOL],
}

/// Adds a node, or returns the index of an identical one.
const fn push_node(c: &mut Compiled, node: Node) -> Result<u8, SufError> {
    let mut i = 0;
    while i < c.node_count {
        if node_eq(c.nodes[i], node) {
            return Ok(cast::u8_from_index(i));
        }
        i += 1;
    }
    if c.node_count >= MAX_NODES {
        return Err(SufError::Capacity);
    }
    let level = match node {
        Node::Xor(a, b) => max_u8(
            c.level[cast::usize_from_u8(a)],
            c.level[cast::usize_from_u8(b)],
        ),
        Node::Not(a) => c.level[cast::usize_from_u8(a)],
        Node::And(a, b) => {
            max_u8(
                c.level[cast::usize_from_u8(a)],
                c.level[cast::usize_from_u8(b)],
            ) + 1
        }
        _ => 0,
    };
    c.nodes[c.node_count] = node;
    c.level[c.node_count] = level;
    c.node_count += 1;
    Ok(cast::u8_from_index(c.node_count - 1))
}

const fn node_eq(a: Node, b: Node) -> bool {
    match (a, b) {
        (Node::Zero, Node::Zero) | (Node::One, Node::One) => true,
        (Node::Query(x), Node::Query(y))
        | (Node::Wrap(x), Node::Wrap(y))
        | (Node::Not(x), Node::Not(y)) => x == y,
        (Node::Xor(a1, b1), Node::Xor(a2, b2)) | (Node::And(a1, b1), Node::And(a2, b2)) => {
            a1 == a2 && b1 == b2
        }
        _ => false,
    }
}

const fn max_u8(a: u8, b: u8) -> u8 {
    if a > b { a } else { b }
}

/// XOR with constant folding (only the constants decided by the
/// descriptor fold, so the shape stays mask-independent).
const fn xor(c: &mut Compiled, a: u8, b: u8) -> Result<u8, SufError> {
    if a == b {
        return push_node(c, Node::Zero);
    }
    match (
        c.nodes[cast::usize_from_u8(a)],
        c.nodes[cast::usize_from_u8(b)],
    ) {
        (Node::Zero, _) => Ok(b),
        (_, Node::Zero) => Ok(a),
        (Node::One, _) => not(c, b),
        (_, Node::One) => not(c, a),
        (Node::Not(x), _) if x == b => push_node(c, Node::One),
        (_, Node::Not(y)) if y == a => push_node(c, Node::One),
        _ => push_node(c, Node::Xor(a, b)),
    }
}

const fn not(c: &mut Compiled, a: u8) -> Result<u8, SufError> {
    match c.nodes[cast::usize_from_u8(a)] {
        Node::Zero => push_node(c, Node::One),
        Node::One => push_node(c, Node::Zero),
        Node::Not(x) => Ok(x),
        _ => push_node(c, Node::Not(a)),
    }
}

const fn and(c: &mut Compiled, a: u8, b: u8) -> Result<u8, SufError> {
    match (
        c.nodes[cast::usize_from_u8(a)],
        c.nodes[cast::usize_from_u8(b)],
    ) {
        (Node::Zero, _) | (_, Node::Zero) => push_node(c, Node::Zero),
        (Node::One, _) => Ok(b),
        (_, Node::One) => Ok(a),
        _ => push_node(c, Node::And(a, b)),
    }
}

impl Compiled {
    /// Storage for [`Compiled::init`]: every field is overwritten there.
    pub const EMPTY: Compiled = Compiled {
        suf: Suf::new(Width::W64, Domain::Unsigned, 0, 0, 0),
        k: Width::W64,
        views: [View::new(Width::W64, 0); MAX_VIEWS],
        view_count: 0,
        view_key: [0; MAX_VIEWS],
        view_used: [false; MAX_VIEWS],
        keys: [Width::W64; MAX_KEYS],
        key_count: 0,
        queries: [Query {
            view: 0,
            threshold: 0,
        }; MAX_QUERIES],
        query_count: 0,
        points_per_key: [0; MAX_KEYS],
        view_point: [0; MAX_VIEWS],
        query_point: [0; MAX_QUERIES],
        nodes: [Node::Zero; MAX_NODES],
        node_count: 0,
        level: [0; MAX_NODES],
        and_depth: 0,
        ands: [0; MAX_ANDS],
        and_count: 0,
        boundary: [0; MAX_INTERVALS],
        pred_node: [0; MAX_PREDS],
        bool_node: [0; MAX_BOOL],
    };

    /// Compiles `suf` at effective width `k`, also exposing the wrap bits of
    /// `wraps` (views a post-processing circuit needs).
    pub const fn new(suf: &Suf, k: Width, wraps: &[View]) -> Result<Compiled, SufError> {
        let mut c = Compiled::EMPTY;
        match c.init(suf, k, wraps) {
            Ok(()) => Ok(c),
            Err(e) => Err(e),
        }
    }

    /// [`Compiled::new`] in place: every field is assigned where it lies,
    /// so no second copy of the descriptor is ever on the stack. On an
    /// error `self` is left partly written and must not be used.
    pub const fn init(&mut self, suf: &Suf, k: Width, wraps: &[View]) -> Result<(), SufError> {
        if let Err(e) = suf.validate() {
            return Err(e);
        }
        if k.bits() > suf.ring.bits() || suf.min_width() > k.bits() {
            return Err(SufError::Predicate);
        }
        let main = View::new(
            k,
            match suf.domain {
                Domain::Signed => k.half(),
                Domain::Unsigned => 0,
            },
        );
        self.reset(suf, k, main);
        let zero = match push_node(self, Node::Zero) {
            Ok(z) => z,
            Err(e) => return Err(e),
        };
        let one = match push_node(self, Node::One) {
            Ok(o) => o,
            Err(e) => return Err(e),
        };
        if let Err(e) = self.compile_boundaries(zero) {
            return Err(e);
        }
        if let Err(e) = self.compile_preds(main) {
            return Err(e);
        }
        if let Err(e) = self.compile_wraps(wraps) {
            return Err(e);
        }
        if let Err(e) = self.compile_bools(zero, one) {
            return Err(e);
        }
        self.drop_unused_views();
        self.layout_points();
        self.order_ands();
        Ok(())
    }

    /// Every field at its empty value for `suf` at width `k`, with the
    /// main view `main` as view 0.
    const fn reset(&mut self, suf: &Suf, k: Width, main: View) {
        self.suf = *suf;
        self.k = k;
        self.views = [main; MAX_VIEWS];
        self.view_count = 1;
        self.view_key = [0; MAX_VIEWS];
        self.view_used = [false; MAX_VIEWS];
        self.keys = [k; MAX_KEYS];
        self.key_count = 1;
        self.queries = [Query {
            view: 0,
            threshold: 0,
        }; MAX_QUERIES];
        self.query_count = 0;
        self.points_per_key = [0; MAX_KEYS];
        self.view_point = [0; MAX_VIEWS];
        self.query_point = [0; MAX_QUERIES];
        self.nodes = [Node::Zero; MAX_NODES];
        self.node_count = 0;
        self.level = [0; MAX_NODES];
        self.and_depth = 0;
        self.ands = [0; MAX_ANDS];
        self.and_count = 0;
        self.boundary = [0; MAX_INTERVALS];
        self.pred_node = [0; MAX_PREDS];
        self.bool_node = [0; MAX_BOOL];
    }

    /// Interval boundaries C_t on the main view (view 0); the first
    /// interval's is the constant `zero`.
    const fn compile_boundaries(&mut self, zero: u8) -> Result<(), SufError> {
        let m = self.suf.intervals;
        let min = self.suf.domain.min(self.k.bits());
        let mut t = 1;
        while t < m {
            let b = match self.compare(0, self.suf.bounds[t] - min) {
                Ok(b) => b,
                Err(e) => return Err(e),
            };
            self.boundary[t] = b;
            t += 1;
        }
        self.boundary[0] = zero;
        Ok(())
    }

    /// The SUF's predicates, each a comparison on its view.
    const fn compile_preds(&mut self, main: View) -> Result<(), SufError> {
        let k = self.k;
        let min = self.suf.domain.min(k.bits());
        let mut p = 0;
        while p < self.suf.pred_count {
            let (view, threshold) = match self.suf.preds[p] {
                Pred::Lt(b) => (main, b - min),
                Pred::LowLt { bits, gamma } => {
                    (View::new(Width::of(bits), 0), cast::i128_from_u128(gamma))
                }
                Pred::Msb => (View::new(k, k.half()), cast::i128_from_u64(k.half())),
                Pred::MsbPlus(a) => (
                    View::new(k, a.wrapping_add(k.half())),
                    cast::i128_from_u64(k.half()),
                ),
            };
            let v = match self.add_view(view) {
                Ok(v) => v,
                Err(e) => return Err(e),
            };
            self.pred_node[p] = match self.compare(v, threshold) {
                Ok(n) => n,
                Err(e) => return Err(e),
            };
            p += 1;
        }
        Ok(())
    }

    /// Views whose wrap bits the post-processing reads.
    const fn compile_wraps(&mut self, wraps: &[View]) -> Result<(), SufError> {
        let mut w = 0;
        while w < wraps.len() {
            let v = match self.add_view(wraps[w]) {
                Ok(v) => v,
                Err(e) => return Err(e),
            };
            if let Err(e) = push_node(self, Node::Wrap(cast::u8_from_index(v))) {
                return Err(e);
            }
            w += 1;
        }
        Ok(())
    }

    /// Bit outputs, normalized by interval indicators.
    const fn compile_bools(&mut self, zero: u8, one: u8) -> Result<(), SufError> {
        let mut j = 0;
        while j < self.suf.bools {
            let node = match self.normalize_output(j, zero, one) {
                Ok(n) => n,
                Err(e) => return Err(e),
            };
            self.bool_node[j] = node;
            j += 1;
        }
        Ok(())
    }

    /// Index of `view`, adding it (and its key width) if new.
    const fn add_view(&mut self, view: View) -> Result<usize, SufError> {
        let mut v = 0;
        while v < self.view_count {
            if self.views[v].width.bits() == view.width.bits() && self.views[v].add == view.add {
                return Ok(v);
            }
            v += 1;
        }
        if self.view_count >= MAX_VIEWS {
            return Err(SufError::Capacity);
        }
        let mut key = 0;
        while key < self.key_count && self.keys[key].bits() != view.width.bits() {
            key += 1;
        }
        if key == self.key_count {
            if self.key_count >= MAX_KEYS {
                return Err(SufError::Capacity);
            }
            self.keys[key] = view.width;
            self.key_count += 1;
        }
        self.views[self.view_count] = view;
        self.view_key[self.view_count] = cast::u8_from_index(key);
        self.view_count += 1;
        Ok(self.view_count - 1)
    }

    /// The node of `[u_view < threshold]`; sentinels become constants.
    const fn compare(&mut self, view: usize, threshold: i128) -> Result<u8, SufError> {
        let w = self.views[view].width;
        if threshold <= 0 {
            return push_node(self, Node::Zero);
        }
        if threshold >= cast::i128_from_u128(w.modulus()) {
            return push_node(self, Node::One);
        }
        let threshold = cast::u64_from_i128(threshold);
        let mut q = 0;
        while q < self.query_count {
            if cast::usize_from_u8(self.queries[q].view) == view
                && self.queries[q].threshold == threshold
            {
                return push_node(self, Node::Query(cast::u8_from_index(q)));
            }
            q += 1;
        }
        if self.query_count >= MAX_QUERIES {
            return Err(SufError::Capacity);
        }
        self.queries[q] = Query {
            view: cast::u8_from_index(view),
            threshold,
        };
        self.query_count += 1;
        push_node(self, Node::Query(cast::u8_from_index(q)))
    }

    /// The normalized node of bit output `j` (Lemma D.2).
    const fn normalize_output(&mut self, j: usize, zero: u8, one: u8) -> Result<u8, SufError> {
        // Read the SUF through `self` rather than copying its 4.7 KB out.
        let m = self.suf.intervals;
        let mut acc = zero;
        let mut p = 0;
        while p < self.suf.program_count {
            // U_p = XOR of J_i over intervals using program p; XOR of the J_i
            // telescopes to the boundaries where membership changes.
            let mut used = 0usize;
            let mut u = zero;
            let mut i = 0;
            while i < m {
                if cast::usize_from_u8(self.suf.pieces[i].bools[j]) == p {
                    used += 1;
                    let hi = if i + 1 == m {
                        one
                    } else {
                        self.boundary[i + 1]
                    };
                    let lo = if i == 0 { zero } else { self.boundary[i] };
                    let ji = match xor(self, hi, lo) {
                        Ok(n) => n,
                        Err(e) => return Err(e),
                    };
                    u = match xor(self, u, ji) {
                        Ok(n) => n,
                        Err(e) => return Err(e),
                    };
                }
                i += 1;
            }
            if used == m {
                // Every interval runs p: U_p = 1 and no AND is needed.
                u = one;
            }
            if used > 0 {
                let prog = match self.program_node(p, zero, one) {
                    Ok(n) => n,
                    Err(e) => return Err(e),
                };
                // Every interval uses p: U_p is the constant 1 (folded).
                let term = match and(self, u, prog) {
                    Ok(n) => n,
                    Err(e) => return Err(e),
                };
                acc = match xor(self, acc, term) {
                    Ok(n) => n,
                    Err(e) => return Err(e),
                };
            }
            p += 1;
        }
        Ok(acc)
    }

    /// Compiles Boolean program `p` into circuit nodes.
    const fn program_node(&mut self, p: usize, zero: u8, one: u8) -> Result<u8, SufError> {
        let prog = self.suf.programs[p];
        let mut stack = [0u8; crate::suf::MAX_OPS];
        let mut sp = 0;
        let mut i = 0;
        while i < prog.len {
            let r = match prog.ops[i] {
                Op::Pred(q) => Ok(self.pred_node[cast::usize_from_u8(q)]),
                Op::Const(b) => Ok(if b { one } else { zero }),
                Op::Not => {
                    sp -= 1;
                    not(self, stack[sp])
                }
                Op::And | Op::Or | Op::Xor => {
                    sp -= 2;
                    let (a, b) = (stack[sp], stack[sp + 1]);
                    match prog.ops[i] {
                        Op::And => and(self, a, b),
                        Op::Xor => xor(self, a, b),
                        _ => match xor(self, a, b) {
                            // a ∨ b = a ⊕ b ⊕ (a ∧ b)
                            Ok(s) => match and(self, a, b) {
                                Ok(t) => xor(self, s, t),
                                Err(e) => Err(e),
                            },
                            Err(e) => Err(e),
                        },
                    }
                }
            };
            match r {
                Ok(n) => {
                    stack[sp] = n;
                    sp += 1;
                }
                Err(e) => return Err(e),
            }
            i += 1;
        }
        Ok(stack[0])
    }

    /// Keeps keys only for views that are evaluated, in first-use order.
    const fn drop_unused_views(&mut self) {
        let mut v = 0;
        while v < self.view_count {
            let mut used = false;
            let mut q = 0;
            while q < self.query_count {
                if cast::usize_from_u8(self.queries[q].view) == v {
                    used = true;
                }
                q += 1;
            }
            let mut i = 0;
            while i < self.node_count {
                if let Node::Wrap(x) = self.nodes[i]
                    && cast::usize_from_u8(x) == v
                {
                    used = true;
                }
                i += 1;
            }
            self.view_used[v] = used;
            v += 1;
        }
        let mut keys = [self.k; MAX_KEYS];
        let mut count = 0;
        let mut v = 0;
        while v < self.view_count {
            if self.view_used[v] {
                let w = self.views[v].width;
                let mut key = 0;
                while key < count && keys[key].bits() != w.bits() {
                    key += 1;
                }
                if key == count {
                    keys[count] = w;
                    count += 1;
                }
                self.view_key[v] = cast::u8_from_index(key);
            }
            v += 1;
        }
        self.keys = keys;
        self.key_count = count;
    }

    /// Assigns each view and query its evaluation point within its key.
    const fn layout_points(&mut self) {
        let mut key = 0;
        while key < self.key_count {
            let mut count = 0;
            let mut v = 0;
            while v < self.view_count {
                if self.view_used[v] && cast::usize_from_u8(self.view_key[v]) == key {
                    self.view_point[v] = count;
                    count += 1;
                    let mut q = 0;
                    while q < self.query_count {
                        if cast::usize_from_u8(self.queries[q].view) == v {
                            self.query_point[q] = count;
                            count += 1;
                        }
                        q += 1;
                    }
                }
                v += 1;
            }
            self.points_per_key[key] = count;
            key += 1;
        }
    }

    /// Lists AND gates by level and records the depth.
    const fn order_ands(&mut self) {
        let mut depth = 0;
        let mut i = 0;
        while i < self.node_count {
            if self.level[i] > depth {
                depth = self.level[i];
            }
            i += 1;
        }
        self.and_depth = cast::usize_from_u8(depth);
        let mut count = 0;
        let mut l = 1;
        while l <= depth {
            let mut i = 0;
            while i < self.node_count {
                if matches!(self.nodes[i], Node::And(..)) && self.level[i] == l && count < MAX_ANDS
                {
                    self.ands[count] = cast::u8_from_index(i);
                    count += 1;
                }
                i += 1;
            }
            l += 1;
        }
        self.and_count = count;
    }

    /// The views of key `key`'s width, through their shared mask.
    pub const fn key_width(&self, key: usize) -> Width {
        self.keys[key]
    }

    /// The DCF threshold of key `key` for input mask `r`: `r mod 2^w`.
    pub const fn key_alpha(&self, key: usize, r: u64) -> u64 {
        self.keys[key].reduce(r)
    }

    /// Total evaluation points per element over all keys.
    pub const fn total_points(&self) -> usize {
        let mut t = 0;
        let mut i = 0;
        while i < self.key_count {
            t += self.points_per_key[i];
            i += 1;
        }
        t
    }

    /// The public evaluation points of key `key` for masked input `x_hat`.
    pub fn points(&self, key: usize, x_hat: u64, out: &mut [u64]) {
        for v in 0..self.view_count {
            if !self.view_used[v] || usize::from(self.view_key[v]) != key {
                continue;
            }
            let view = self.views[v];
            let u = view.at(x_hat);
            out[self.view_point[v]] = u;
            for q in 0..self.query_count {
                if usize::from(self.queries[q].view) == v {
                    out[self.query_point[q]] = view.width.sub(u, self.queries[q].threshold);
                }
            }
        }
    }

    /// One party's XOR shares of every node below the first AND level, as a
    /// bit mask: from the DCF outputs of each key (`dcf[key]` holds that
    /// key's points for this element). AND nodes are left 0 for the MPC
    /// layer ([`Compiled::fill_level`]).
    pub fn base_nodes(&self, party: u64, x_hat: u64, dcf: &[&[u64]; MAX_KEYS]) -> u128 {
        let mut vals = 0u128;
        for i in 0..self.node_count {
            let bit = match self.nodes[i] {
                Node::Zero => 0,
                Node::One => party ^ 1,
                Node::Query(q) => {
                    let query = self.queries[usize::from(q)];
                    let v = usize::from(query.view);
                    let key = usize::from(self.view_key[v]);
                    let u = self.views[v].at(x_hat);
                    let public = cast::u64_from_u32(u32::from(u < query.threshold));
                    dcf[key][self.query_point[usize::from(q)]]
                        ^ dcf[key][self.view_point[v]]
                        ^ (public & (party ^ 1))
                }
                Node::Wrap(v) => {
                    let key = usize::from(self.view_key[usize::from(v)]);
                    dcf[key][self.view_point[usize::from(v)]]
                }
                Node::Xor(a, b) => node_bit(vals, a) ^ node_bit(vals, b),
                Node::Not(a) => node_bit(vals, a) ^ (party ^ 1),
                Node::And(..) => 0,
            };
            vals |= cast::u128_from_u64(bit & 1) << i;
        }
        vals
    }

    /// [`Compiled::base_nodes`] bit-sliced over a block of up to 64
    /// elements: `words[i]` holds node i of element e in bit e. `x_hat`
    /// holds the block's masked inputs and `dcf[key]` each element's points
    /// of that key in turn (`points_per_key[key]` per element). AND nodes
    /// are left 0 for the MPC layer ([`Compiled::fill_level_words`]).
    pub fn base_words(
        &self,
        party: u64,
        x_hat: &[u64],
        dcf: &[&[u64]; MAX_KEYS],
        words: &mut [u64],
    ) {
        let ones = block_mask(x_hat.len());
        // P0 holds the public constants; P1's share of them is 0.
        let p0 = ones & 0u64.wrapping_sub(party ^ 1);
        for i in 0..self.node_count {
            words[i] = match self.nodes[i] {
                Node::Zero | Node::And(..) => 0,
                Node::One => p0,
                Node::Query(q) => {
                    let query = self.queries[usize::from(q)];
                    let v = usize::from(query.view);
                    let key = usize::from(self.view_key[v]);
                    let per = self.points_per_key[key];
                    let (qp, vp) = (self.query_point[usize::from(q)], self.view_point[v]);
                    let mut w = 0u64;
                    for e in 0..x_hat.len() {
                        let bit = dcf[key][e * per + qp] ^ dcf[key][e * per + vp];
                        w |= (bit & 1) << e;
                    }
                    // The public comparison [û < β] is added by P0 alone.
                    w ^ (p0 & public_word(self, v, query.threshold, x_hat))
                }
                Node::Wrap(v) => {
                    let key = usize::from(self.view_key[usize::from(v)]);
                    let (per, vp) = (self.points_per_key[key], self.view_point[usize::from(v)]);
                    let mut w = 0u64;
                    for e in 0..x_hat.len() {
                        w |= (dcf[key][e * per + vp] & 1) << e;
                    }
                    w
                }
                Node::Xor(a, b) => words[usize::from(a)] ^ words[usize::from(b)],
                Node::Not(a) => words[usize::from(a)] ^ p0,
            };
        }
    }

    /// [`Compiled::fill_level`] bit-sliced over a block of `count` elements.
    pub fn fill_level_words(&self, party: u64, words: &mut [u64], level: u8, count: usize) {
        let p0 = block_mask(count) & 0u64.wrapping_sub(party ^ 1);
        for i in 0..self.node_count {
            if self.level[i] != level {
                continue;
            }
            match self.nodes[i] {
                Node::Xor(a, b) => words[i] = words[usize::from(a)] ^ words[usize::from(b)],
                Node::Not(a) => words[i] = words[usize::from(a)] ^ p0,
                _ => {}
            }
        }
    }

    /// Recomputes the XOR and NOT nodes that depend on AND results, once the
    /// AND gates of every level up to `level` are filled in.
    pub fn fill_level(&self, party: u64, vals: u128, level: u8) -> u128 {
        let mut vals = vals;
        for i in 0..self.node_count {
            if self.level[i] != level {
                continue;
            }
            let bit = match self.nodes[i] {
                Node::Xor(a, b) => node_bit(vals, a) ^ node_bit(vals, b),
                Node::Not(a) => node_bit(vals, a) ^ (party ^ 1),
                _ => continue,
            };
            vals = (vals & !(1u128 << i)) | (cast::u128_from_u64(bit) << i);
        }
        vals
    }

    /// Which boundaries change some polynomial coefficient, as a bit mask
    /// over `t` (bit t set: `C_t` must be converted to arithmetic).
    pub const fn coefficient_boundaries(&self) -> u64 {
        let suf = &self.suf;
        let mut mask = 0u64;
        let mut t = 1;
        while t < suf.intervals {
            let mut j = 0;
            while j < suf.arith {
                let mut i = 0;
                while i <= suf.degree {
                    if suf.pieces[t - 1].coeffs[j][i] != suf.pieces[t].coeffs[j][i] {
                        mask |= 1 << t;
                    }
                    i += 1;
                }
                j += 1;
            }
            t += 1;
        }
        mask
    }

    /// `Δ_t = v_{t−1} − v_t` for coefficient `i` of output `j` at boundary t,
    /// and the last interval's value: coefficient = v_{m−1} + Σ_t C_t·Δ_t.
    pub const fn coefficient_delta(&self, j: usize, i: usize, t: usize) -> u64 {
        let s = &self.suf;
        s.ring
            .sub(s.pieces[t - 1].coeffs[j][i], s.pieces[t].coeffs[j][i])
    }

    /// The last interval's coefficient `i` of output `j`.
    pub const fn coefficient_base(&self, j: usize, i: usize) -> u64 {
        self.suf.pieces[self.suf.intervals - 1].coeffs[j][i]
    }

    /// Whether coefficient `i` of output `j` is the same on every interval
    /// (then it is public and needs no arithmetic boundary bits).
    pub const fn coefficient_is_public(&self, j: usize, i: usize) -> bool {
        let s = &self.suf;
        let mut t = 1;
        while t < s.intervals {
            if s.pieces[t - 1].coeffs[j][i] != s.pieces[t].coeffs[j][i] {
                return false;
            }
            t += 1;
        }
        true
    }

    /// Cleartext value of every node at input `x` (for tests and the
    /// reference): what the two parties' shares must XOR to.
    pub fn clear_nodes(&self, x: u64, r: u64) -> u128 {
        let x_hat = self.suf.ring.add(x, r);
        let mut vals = 0u128;
        for i in 0..self.node_count {
            let bit = match self.nodes[i] {
                Node::Zero => false,
                Node::One => true,
                Node::Query(q) => {
                    let query = self.queries[usize::from(q)];
                    self.views[usize::from(query.view)].at(x) < query.threshold
                }
                Node::Wrap(v) => {
                    let view = self.views[usize::from(v)];
                    view.at(x_hat) < view.width.reduce(r)
                }
                Node::Xor(a, b) => (node_bit(vals, a) ^ node_bit(vals, b)) == 1,
                Node::Not(a) => node_bit(vals, a) == 0,
                Node::And(a, b) => (node_bit(vals, a) & node_bit(vals, b)) == 1,
            };
            vals |= u128::from(bit) << i;
        }
        vals
    }
}

/// The low `count` bits set (`count ≤ 64`).
const fn block_mask(count: usize) -> u64 {
    if count >= 64 {
        u64::MAX
    } else {
        (1u64 << count) - 1
    }
}

/// `[view_v(x̂_e) < β]` for each element of a block, in bit e.
fn public_word(c: &Compiled, v: usize, threshold: u64, x_hat: &[u64]) -> u64 {
    let mut w = 0u64;
    for (e, x) in x_hat.iter().enumerate() {
        w |= u64::from(c.views[v].at(*x) < threshold) << e;
    }
    w
}

/// Node `i`'s bit in a node mask.
#[inline(always)]
pub const fn node_bit(vals: u128, i: u8) -> u64 {
    cast::low_u64((vals >> i) & 1)
}

/// Coefficient arrays are indexed up to these bounds.
const _: () = assert!(MAX_ARITH * (MAX_DEGREE + 1) <= 16);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::{BatchEval, Serial};
    use crate::dcf;
    use crate::fss::{KeyBatch, Params, Party};
    use crate::prg::{FixedKeyAes, Prg};
    use crate::suf::{Program, Suf};

    /// A SUF exercising every predicate kind, OR and per-interval programs.
    fn mixed(n: Width, q: i128) -> Suf {
        let mut s = Suf::piecewise(
            n,
            Domain::Signed,
            0,
            1,
            1,
            &[-q, 0, q],
            &[
                [[1, 0, 0, 0], [0; 4]],
                [[2, 1, 0, 0], [0; 4]],
                [[0, 1, 0, 0], [0; 4]],
                [[3, 0, 0, 0], [0; 4]],
            ],
        )
        .with_pred(Pred::LowLt { bits: 2, gamma: 3 })
        .with_pred(Pred::MsbPlus(3))
        .with_pred(Pred::Lt(1))
        .with_pred(Pred::Msb)
        .with_program(Program::from_ops(&[Op::Pred(0), Op::Pred(1), Op::Or]))
        .with_program(Program::from_ops(&[
            Op::Pred(2),
            Op::Not,
            Op::Pred(3),
            Op::Xor,
        ]))
        .with_bools(&[1, 2]);
        // Bit 0 differs per interval: program 1 on even intervals, 0 on odd.
        s.pieces[1].bools[0] = 0;
        s.pieces[3].bools[0] = 2;
        s
    }

    /// Both parties' node shares, with AND gates resolved in the clear
    /// (the MPC layer's job; here we only check the compiler's algebra).
    fn shares(c: &Compiled, x: u64, r: u64, prg: &mut Prg) -> u128 {
        let aes = FixedKeyAes::new();
        let x_hat = c.suf.ring.add(x, r);
        let mut out = [[[0u64; 64]; MAX_KEYS]; 2];
        for key in 0..c.key_count {
            let p = Params::dcf_bit(c.key_width(key));
            let mut k0 = [0u8; 1200];
            let mut k1 = [0u8; 1200];
            let len = p.key_len();
            let roots = [prg.next_block(), prg.next_block()];
            dcf::generate(
                &aes,
                &p,
                c.key_alpha(key, r),
                1,
                roots,
                prg,
                &mut k0[..len],
                &mut k1[..len],
            )
            .unwrap();
            let mut points = [0u64; 64];
            let np = c.points_per_key[key];
            c.points(key, x_hat, &mut points[..np]);
            for (b, kb) in [&k0, &k1].into_iter().enumerate() {
                let batch =
                    KeyBatch::new(p, Party::from_index(b as u64).unwrap(), &kb[..len]).unwrap();
                Serial::new()
                    .eval(&batch, &points[..np], &mut out[b][key][..np])
                    .unwrap();
            }
        }
        let mut v = [0u128; 2];
        for b in 0..2 {
            let refs: [&[u64]; MAX_KEYS] = core::array::from_fn(|k| &out[b][k][..]);
            v[b] = c.base_nodes(b as u64, x_hat, &refs);
        }
        // Resolve AND gates level by level from the reconstructed inputs.
        for l in 1..=c.and_depth as u8 {
            for &a in &c.ands[..c.and_count] {
                if c.level[usize::from(a)] != l {
                    continue;
                }
                let Node::And(p, q) = c.nodes[usize::from(a)] else {
                    unreachable!()
                };
                let val = (node_bit(v[0] ^ v[1], p) & node_bit(v[0] ^ v[1], q)) as u128;
                v[0] |= val << a;
            }
            v[0] = c.fill_level(0, v[0], l);
            v[1] = c.fill_level(1, v[1], l);
        }
        v[0] ^ v[1]
    }

    #[test]
    fn nodes_reconstruct_for_every_input_and_wrap_masks() {
        let n = Width::of(6);
        let mut prg = Prg::new(&[5; 16]);
        for k in [4u32, 6] {
            let k = Width::of(k);
            let c = Compiled::new(&mixed(n, 3), k, &[View::new(Width::of(3), 0)]).unwrap();
            assert!(c.and_depth >= 1);
            // Every mask, including 0, 2^n − 1 and the boundary wraps.
            for r in 0..(1u64 << n.bits()) {
                for x in 0..(1u64 << n.bits()) {
                    let got = shares(&c, x, r, &mut prg);
                    assert_eq!(got, c.clear_nodes(x, r), "k={} x={x} r={r}", k.bits());
                    let want = c.suf.eval_at(x, k);
                    for j in 0..c.suf.bools {
                        let bit = node_bit(got, c.bool_node[j]);
                        assert_eq!(
                            bit,
                            u64::from((want.bits >> j) & 1),
                            "bool {j} k={} x={x} r={r}",
                            k.bits()
                        );
                    }
                    for t in 1..c.suf.intervals {
                        let v = c.suf.domain.value(k, x);
                        assert_eq!(node_bit(got, c.boundary[t]), u64::from(v < c.suf.bounds[t]));
                    }
                }
            }
        }
    }

    #[test]
    fn shape_does_not_depend_on_the_mask() {
        // The compiled shape is a function of the SUF and width only; the
        // mask enters solely through key thresholds r mod 2^w.
        let n = Width::of(16);
        let c1 = Compiled::new(&mixed(n, 1000), Width::of(12), &[]).unwrap();
        let c2 = Compiled::new(&mixed(n, 1000), Width::of(12), &[]).unwrap();
        assert_eq!(c1, c2);
        assert_eq!(c1.total_points(), c1.points_per_key.iter().sum::<usize>());
        assert!(Compiled::new(&mixed(n, 1000), Width::of(17), &[]).is_err());
        assert!(Compiled::new(&mixed(n, 1000), Width::of(10), &[]).is_err());
    }
}
