//! Open-loop send times of a closed-loop workload, for formats that only hold timestamps.

use super::Workload;
use std::collections::HashMap;
use std::time::Duration;

/// When each request (`[session][request]`) would be sent if every request finished the moment
/// it was sent: gaps, spawns and joins are honoured, service time is taken as zero.
pub fn open_loop_times(workload: &Workload) -> Vec<Vec<Duration>> {
    let index: HashMap<&str, usize> = workload
        .sessions
        .iter()
        .enumerate()
        .map(|(i, s)| (s.id.as_str(), i))
        .collect();
    // Children of each session, keyed by the request that spawns them.
    let mut children: HashMap<(usize, usize), Vec<usize>> = HashMap::new();
    let mut roots = Vec::new();
    for (i, session) in workload.sessions.iter().enumerate() {
        let parent = session.parent.as_deref().and_then(|p| index.get(p));
        match (parent, session.spawn) {
            (Some(&parent), Some(spawn)) => {
                children.entry((parent, spawn.after)).or_default().push(i)
            }
            _ => roots.push(i),
        }
    }
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
