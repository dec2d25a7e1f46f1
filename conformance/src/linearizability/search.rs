//! The search for a linearization of one key's history: the Wing-Gong algorithm with
//! Lowe's memoization of (set of calls linearized, model state), as Porcupine does it.

use std::collections::HashMap;
use std::time::Duration;

use super::history::Operation;
use super::step::{Revealed, State, successors};

/// How the search for one key ended.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// A linearization exists.
    Linearizable,
    /// None exists; the longest prefix of calls (indices into the key's operations) that
    /// could be linearized, in order.
    Not { longest: Vec<usize> },
    /// The search gave up after this many steps.
    GaveUp { steps: u64 },
}

const NIL: usize = usize::MAX;

/// A doubly linked list of call / return events, ordered by time, with a sentinel at 0.
struct Events {
    next: Vec<usize>,
    prev: Vec<usize>,
    /// For a call event: its operation and its return event. `None` for returns.
    call: Vec<Option<(usize, usize)>>,
}

impl Events {
    fn new(operations: &[Operation]) -> Self {
        // (time, is_return, operation): a call sorts before a return at the same instant,
        // which only allows more orders.
        let mut events: Vec<(Duration, bool, usize)> = operations
            .iter()
            .enumerate()
            .flat_map(|(i, op)| [(op.invoked, false, i), (op.returned, true, i)])
            .collect();
        events.sort();
        let n = events.len() + 1;
        let mut list = Events {
            next: (1..=n).map(|i| if i == n { NIL } else { i }).collect(),
            prev: (0..n).map(|i| i.wrapping_sub(1)).collect(),
            call: vec![None; n],
        };
        let mut return_of = vec![0; operations.len()];
        for (i, &(_, is_return, op)) in events.iter().enumerate() {
            if is_return {
                return_of[op] = i + 1;
            }
        }
        for (i, &(_, is_return, op)) in events.iter().enumerate() {
            if !is_return {
                list.call[i + 1] = Some((op, return_of[op]));
            }
        }
        list
    }

    fn unlink(&mut self, node: usize) {
        let (p, n) = (self.prev[node], self.next[node]);
        self.next[p] = n;
        if n != NIL {
            self.prev[n] = p;
        }
    }

    fn relink(&mut self, node: usize) {
        let (p, n) = (self.prev[node], self.next[node]);
        self.next[p] = node;
        if n != NIL {
            self.prev[n] = node;
        }
    }

    /// Take a call and its return out of the list.
    fn lift(&mut self, call: usize, ret: usize) {
        self.unlink(call);
        self.unlink(ret);
    }

    /// Put them back (in reverse order).
    fn unlift(&mut self, call: usize, ret: usize) {
        self.relink(ret);
        self.relink(call);
    }
}

/// The set of calls linearized so far.
#[derive(Clone, PartialEq, Eq, Hash)]
struct Bits(Vec<u64>);

impl Bits {
    fn flip(&mut self, i: usize) {
        self.0[i / 64] ^= 1 << (i % 64);
    }
}

/// Search for a linearization of `operations` (all on one key), starting from no record.
pub(crate) fn check_key(operations: &[Operation], slack: Duration, max_steps: u64) -> Outcome {
    let revealed = Revealed::of(operations);
    let mut events = Events::new(operations);
    let mut seen: HashMap<Bits, Vec<Vec<State>>> = HashMap::new();
    let mut linearized = Bits(vec![0; operations.len().div_ceil(64)]);
    let mut states: Vec<State> = vec![None];
    // The calls linearized, in order, with the states before each.
    let mut stack: Vec<(usize, Vec<State>)> = Vec::new();
    let mut longest: Vec<usize> = Vec::new();
    let mut steps = 0u64;
    let mut entry = events.next[0];
    while events.next[0] != NIL {
        steps += 1;
        if steps > max_steps {
            return Outcome::GaveUp { steps };
        }
        match events.call[entry] {
            Some((op, ret)) => {
                let after = successors(&states, &operations[op], &revealed, slack);
                let mut fresh = false;
                if !after.is_empty() {
                    let mut key = linearized.clone();
                    key.flip(op);
                    let known = seen.entry(key).or_default();
                    if !known.iter().any(|s| same_set(s, &after)) {
                        known.push(after.clone());
                        fresh = true;
                    }
                }
                if fresh {
                    stack.push((entry, std::mem::replace(&mut states, after)));
                    linearized.flip(op);
                    events.lift(entry, ret);
                    if stack.len() > longest.len() {
                        longest = stack
                            .iter()
                            .filter_map(|(e, _)| events.call[*e].map(|(op, _)| op))
                            .collect();
                    }
                    entry = events.next[0];
                } else {
                    entry = events.next[entry];
                }
            }
            None => {
                // A return whose call is not linearized yet: undo the last choice.
                let Some((call_entry, before)) = stack.pop() else {
                    return Outcome::Not { longest };
                };
                let (op, ret) = events.call[call_entry].expect("a call event");
                states = before;
                linearized.flip(op);
                events.unlift(call_entry, ret);
                entry = events.next[call_entry];
            }
        }
    }
    Outcome::Linearizable
}

fn same_set(a: &[State], b: &[State]) -> bool {
    a.len() == b.len() && a.iter().all(|s| b.contains(s))
}
