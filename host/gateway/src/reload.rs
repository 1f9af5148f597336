//! Configuration reload. A new configuration is validated whole first: one that does not
//! validate changes nothing. Then what can change at run time takes effect at once (requests read
//! the configuration through one atomic swap and never wait for it), workers join and leave the
//! fleet ([`crate::fleet`]), and what shaped state built at start (the listener, the queue,
//! admission, caches, the trace, the policy directory) keeps its value until a restart and is
//! named as such.

use crate::config::{Config, ConfigError};
use crate::fleet::Source;
use crate::metrics::OutcomeLabels;
use crate::server::{Live, Shared};
use switchyard_core::router::native_policy;

/// What a reload did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Reloaded {
    /// Settings that changed and are now in force.
    pub applied: Vec<&'static str>,
    /// Settings that differ from those in force but take a restart to change.
    pub need_restart: Vec<&'static str>,
}

/// Put what can change of `new` in force; refuse it whole if it does not validate.
pub(crate) fn reload(
    shared: &Shared,
    new: Result<Config, ConfigError>,
) -> Result<Reloaded, ConfigError> {
    let result = new.and_then(|new| apply(shared, new));
    let outcome = if result.is_ok() { "applied" } else { "refused" };
    shared
        .metrics
        .config_reloads
        .get_or_create(&OutcomeLabels { outcome })
        .inc();
    result
}

fn apply(shared: &Shared, new: Config) -> Result<Reloaded, ConfigError> {
    let old = shared.live();
    let old = &old.config;
    let mut next = old.clone();
    let mut done = Reloaded::default();

    // Read per request: these take effect with the next request.
    let live = &mut done.applied;
    take(
        "server.max_body_bytes",
        &mut next.server.max_body_bytes,
        new.server.max_body_bytes,
        live,
    );
    take(
        "server.request_timeout",
        &mut next.server.request_timeout,
        new.server.request_timeout,
        live,
    );
    take(
        "server.stream_idle_timeout",
        &mut next.server.stream_idle_timeout,
        new.server.stream_idle_timeout,
        live,
    );
    take(
        "server.engine_stream",
        &mut next.server.engine_stream,
        new.server.engine_stream,
        live,
    );
    take(
        "server.drain_timeout",
        &mut next.server.drain_timeout,
        new.server.drain_timeout,
        live,
    );
    take(
        "server.api_keys",
        &mut next.server.api_keys,
        new.server.api_keys.clone(),
        live,
    );
    take(
        "max_attempts",
        &mut next.max_attempts,
        new.max_attempts,
        live,
    );
    take(
        "model.aliases",
        &mut next.model.aliases,
        new.model.aliases.clone(),
        live,
    );
    take(
        "model.context_length",
        &mut next.model.context_length,
        new.model.context_length,
        live,
    );
    take(
        "model.tool_parser",
        &mut next.model.tool_parser,
        new.model.tool_parser.clone(),
        live,
    );
    take(
        "model.reasoning_parser",
        &mut next.model.reasoning_parser,
        new.model.reasoning_parser.clone(),
        live,
    );
    take(
        "frontend.volatile_system_lines",
        &mut next.frontend.volatile_system_lines,
        new.frontend.volatile_system_lines.clone(),
        live,
    );
    // The router's tunables; its block size, prediction bound and seed shaped what it holds.
    let tuned = old.router.retuned(&new.router);
    take("router", &mut next.router, tuned, live);
    // The native routing policy, unless the policy directory decides.
    let policy = if old.policies.is_none() && new.policy != old.policy {
        let policy = native_policy(&new.policy).ok_or_else(|| {
            ConfigError::Invalid(format!("router.policy: unknown policy {}", new.policy))
        })?;
        next.policy.clone_from(&new.policy);
        live.push("router.policy");
        Some(policy)
    } else {
        None
    };

    // Built at start from these: a restart applies them.
    let pending = &mut done.need_restart;
    differs(
        "server.host, server.port",
        &old.listen,
        &new.listen,
        pending,
    );
    differs("server.tls", &old.server.tls, &new.server.tls, pending);
    differs(
        "server.upstream_ca_file",
        &old.server.upstream_ca_file,
        &new.server.upstream_ca_file,
        pending,
    );
    differs(
        "server.upstream_identity",
        &old.server.upstream_identity,
        &new.server.upstream_identity,
        pending,
    );
    differs(
        "server.upstream_max_idle_per_engine",
        &old.server.upstream_max_idle_per_engine,
        &new.server.upstream_max_idle_per_engine,
        pending,
    );
    differs(
        "server.connect_timeout",
        &old.server.connect_timeout,
        &new.server.connect_timeout,
        pending,
    );
    differs(
        "server.health_interval",
        &old.server.health_interval,
        &new.server.health_interval,
        pending,
    );
    differs(
        "server.max_concurrent_requests",
        &old.server.max_concurrent_requests,
        &new.server.max_concurrent_requests,
        pending,
    );
    differs("model.name", &old.model.name, &new.model.name, pending);
    differs("model.path", &old.model.path, &new.model.path, pending);
    let shape =
        |r: &switchyard_core::router::RouterConfig| (r.block_size, r.approx_max_blocks, r.seed);
    differs(
        "router.block_size, approx_max_blocks, seed",
        &shape(&old.router),
        &shape(&new.router),
        pending,
    );
    if old.policies.is_some() {
        differs("router.policy", &old.policy, &new.policy, pending);
    }
    let mut frontend = new.frontend.clone();
    frontend
        .volatile_system_lines
        .clone_from(&old.frontend.volatile_system_lines);
    differs(
        "frontend (but volatile_system_lines)",
        &old.frontend,
        &frontend,
        pending,
    );
    differs("admission", &old.admission, &new.admission, pending);
    differs("queue", &old.queue, &new.queue, pending);
    differs("trace", &old.trace, &new.trace, pending);
    differs("policies", &old.policies, &new.policies, pending);
    differs("cluster", &old.cluster, &new.cluster, pending);
    differs("kv_pool", &old.kv_pool, &new.kv_pool, pending);
    differs("discovery", &old.discovery, &new.discovery, pending);

    // The fleet: workers that left the list leave, new ones join (and start cold). Only the
    // file's own members: those added through the admin API or discovered stay.
    let workers_changed = old.workers != new.workers;
    next.workers.clone_from(&new.workers);

    // Everything that can fail has been checked (the aliases compile here, the joining workers'
    // endpoints in `reconcile`, which changes nothing when one is bad): commit.
    let next = Live::new(next, &shared.tokenizer, Some(&shared.live()))?;
    if workers_changed {
        shared.fleet.reconcile(
            Source::Config,
            &next.config.workers,
            &shared.router,
            &shared.metrics,
        )?;
        done.applied.push("workers");
    }
    {
        let mut router = shared.router();
        router.retune(&next.config.router);
        if let Some(policy) = policy {
            router.set_policy(policy);
        }
    }
    shared.replace_live(next);
    Ok(done)
}

/// Take `new` into `into` when it differs, noting `name`.
fn take<T: PartialEq>(name: &'static str, into: &mut T, new: T, changed: &mut Vec<&'static str>) {
    if *into != new {
        *into = new;
        changed.push(name);
    }
}

/// Note `name` when `old` and `new` differ.
fn differs<T: PartialEq>(name: &'static str, old: &T, new: &T, pending: &mut Vec<&'static str>) {
    if old != new {
        pending.push(name);
    }
}
