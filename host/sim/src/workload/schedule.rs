//! How a workload's sessions hang together (who spawns whom), and the open-loop send times of a
//! closed-loop workload, for formats that only hold timestamps.

use super::Workload;
use std::collections::HashMap;
use std::time::Duration;

/// Sessions arranged by spawning: the simulator, live replay and the open-loop planner all walk
/// a workload this way.
#[derive(Debug, Clone, Default)]
pub struct SpawnTree {
    /// Sessions nobody spawns: they start at their own `start`.
    pub roots: Vec<usize>,
    /// Sessions spawned by each `(parent session, request index)`.
    pub children: HashMap<(usize, usize), Vec<usize>>,
    /// The spawning session of each session, if any.
    pub parent_of: Vec<Option<usize>>,
}

impl Workload {
    /// Index the sessions by who spawns them (a child whose parent is unknown is a root).
    pub fn spawn_tree(&self) -> SpawnTree {
        let index: HashMap<&str, usize> = self
            .sessions
            .iter()
            .enumerate()
            .map(|(i, s)| (s.id.as_str(), i))
            .collect();
        let mut tree = SpawnTree {
            parent_of: vec![None; self.sessions.len()],
            ..SpawnTree::default()
        };
        for (i, session) in self.sessions.iter().enumerate() {
            let parent = session.parent.as_deref().and_then(|p| index.get(p));
            match (parent, session.spawn) {
                (Some(&parent), Some(spawn)) => {
                    tree.children
                        .entry((parent, spawn.after))
                        .or_default()
                        .push(i);
                    tree.parent_of[i] = Some(parent);
                }
                _ => tree.roots.push(i),
            }
        }
        tree
    }
}

/// When each request (`[session][request]`) would be sent if every request finished the moment
/// it was sent: gaps, spawns and joins are honoured, service time is taken as zero.
pub fn open_loop_times(workload: &Workload) -> Vec<Vec<Duration>> {
    let SpawnTree {
        roots, children, ..
    } = workload.spawn_tree();
    let mut times = vec![Vec::new(); workload.sessions.len()];
    let mut planner = Planner {
        workload,
        children: &children,
        times: &mut times,
    };
    for root in roots {
        planner.session(root, workload.sessions[root].start);
    }
    times
}

struct Planner<'a> {
    workload: &'a Workload,
    children: &'a HashMap<(usize, usize), Vec<usize>>,
    times: &'a mut Vec<Vec<Duration>>,
}

impl Planner<'_> {
    /// Plan session `i` starting at `base`; returns when its last request finished.
    fn session(&mut self, i: usize, base: Duration) -> Duration {
        let session = &self.workload.sessions[i];
        let mut ready = base;
        let mut sent = Vec::with_capacity(session.requests.len());
        for (k, request) in session.requests.iter().enumerate() {
            let at = ready + request.gap;
            sent.push(at);
            ready = at;
            for &child in self.children.get(&(i, k)).into_iter().flatten() {
                let start = at + self.workload.sessions[child].start;
                let end = self.session(child, start);
                if self.workload.sessions[child].spawn.is_some_and(|s| s.join) {
                    ready = ready.max(end);
                }
            }
        }
        self.times[i] = sent;
        ready
    }
}
