//! `switchyard policy`: the policy author's workflow. `new` scaffolds a policy crate on the SDK,
//! `check` runs the gateway's own load checks on a component, and `test` replays a trace in the
//! simulator with the component beside a baseline.

use crate::simulate::{self, SimulateArgs};
use anyhow::{Context, bail};
use clap::{Args, Parser, Subcommand, ValueEnum};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use switchyard_policy_host::{
    ContentHash, EngineConfig, Metadata, PolicyEngine, PolicyError, PolicyInfo, PolicyRegistry,
    PolicySource, Role, WIT_MAJOR,
};
use switchyard_sim::RunReport;

#[derive(Debug, Subcommand)]
pub(crate) enum PolicyCommand {
    /// Scaffold a policy crate on the Switchyard policy SDK: it builds for wasm32-wasip2 into a
    /// component and passes its own `cargo test` as created.
    New(NewArgs),
    /// Run the gateway's load checks on a component (world, WIT version, metadata, canary
    /// calls): exit 0 if the gateway would load it, else the reason and a non-zero exit.
    Check(CheckArgs),
    /// Check a component, then replay a trace in the simulator with it and with a baseline,
    /// side by side.
    Test(TestArgs),
}

/// A decision point, as `switchyard:policy` names its worlds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum World {
    /// Routing (`RouterPolicy`).
    Router,
    /// Admission (`AdmissionPolicy`).
    Admission,
    /// KV hints (`KvHintPolicy`).
    KvHints,
}

impl World {
    fn from_name(name: &str) -> Option<Self> {
        [Self::Router, Self::Admission, Self::KvHints]
            .into_iter()
            .find(|w| w.name() == name)
    }

    /// The world's name in `wit/`.
    fn name(self) -> &'static str {
        match self {
            Self::Router => "router",
            Self::Admission => "admission",
            Self::KvHints => "kv-hints",
        }
    }

    fn role(self) -> Role {
        match self {
            Self::Router => Role::Router,
            Self::Admission => Role::Admission,
            Self::KvHints => Role::KvHints,
        }
    }

    /// The native policy `policy test` compares with by default.
    fn baseline(self) -> &'static str {
        match self {
            Self::Router => "kv-cost",
            Self::Admission => "none",
            Self::KvHints => "no-hints",
        }
    }

    /// The `switchyard simulate` flag that sweeps this world's policies.
    fn simulate_flag(self) -> &'static str {
        match self {
            Self::Router => "--policies",
            Self::Admission => "--admission",
            Self::KvHints => "--kv-hints",
        }
    }

    /// Simulator settings a run of this world needs unless the caller gives them: one router
    /// (the gateway's default) under an admission or KV-hint policy, and a host tier for KV
    /// hints to move prefixes to.
    fn simulate_defaults(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Self::Router => &[],
            Self::Admission => &[("--policies", "kv-cost")],
            Self::KvHints => &[("--policies", "kv-cost"), ("--host-tier-blocks", "65536")],
        }
    }

    /// What the scaffold's example does.
    fn description(self) -> &'static str {
        match self {
            Self::Router => "KV cost plus a penalty per request in flight",
            Self::Admission => "Hold new sessions while every rank's KV cache is full",
            Self::KvHints => {
                "Demote sessions waiting on slow tools to host memory, prefetch them when the tool returns"
            }
        }
    }

    fn lib_template(self) -> &'static str {
        match self {
            Self::Router => include_str!("../templates/policy/router/lib.rs.in"),
            Self::Admission => include_str!("../templates/policy/admission/lib.rs.in"),
            Self::KvHints => include_str!("../templates/policy/kv-hints/lib.rs.in"),
        }
    }

    /// README placeholders: the SDK trait, its export macro, its test harness, and the
    /// gateway configuration key.
    fn readme_values(self) -> [(&'static str, &'static str); 4] {
        let (trait_name, export_macro, harness, config_hint) = match self {
            Self::Router => (
                "RouterPolicy",
                "export_router",
                "testing::RouterHarness",
                "[policies] router = \"<file>.wasm\"",
            ),
            Self::Admission => (
                "AdmissionPolicy",
                "export_admission",
                "testing::AdmissionHarness",
                "[policies] admission = \"<file>.wasm\"",
            ),
            Self::KvHints => (
                "KvHintPolicy",
                "export_kv_hints",
                "testing::KvHintsHarness",
                "[policies] kv_hints = \"<file>.wasm\"",
            ),
        };
        [
            ("trait_name", trait_name),
            ("export_macro", export_macro),
            ("harness", harness),
            ("config_hint", config_hint),
        ]
    }
}

/// Run `command`; a failure prints its reason and exits with status 1 (a refused component is
/// an expected answer, not a crash: no backtrace).
pub(crate) fn run(command: PolicyCommand) -> anyhow::Result<()> {
    let result = match command {
        PolicyCommand::New(args) => new(&args),
        PolicyCommand::Check(args) => checked(&args.file, args.world).map(|checked| {
            print!("{}", checked.summary(&args.file));
        }),
        PolicyCommand::Test(args) => test(args),
    };
    if let Err(err) = result {
        eprintln!("error: {err:#}");
        std::process::exit(1);
    }
    Ok(())
}

// ---- new -------------------------------------------------------------------------------------

#[derive(Debug, Args)]
pub(crate) struct NewArgs {
    /// The decision point: router, admission or kv-hints.
    world: World,
    /// The policy's name (kebab-case): the crate's name and the name the gateway reports.
    name: String,
    /// Create the crate in DIR/NAME (default: ./NAME).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// A Switchyard checkout (or its sdk/ directory) to depend on by path. Default: the
    /// checkout holding the new crate or the current directory, else the one this binary was
    /// built from, else a git dependency.
    #[arg(long)]
    sdk: Option<PathBuf>,
}

/// Where the SDK dependency points.
#[derive(Debug)]
enum Sdk {
    /// A checkout of this repository, and how it was found.
    Checkout { root: PathBuf, found: &'static str },
    /// No checkout: the repository by git.
    Git,
}

/// The repository the SDK lives in, for a scaffold made outside any checkout.
const REPOSITORY: &str = env!("CARGO_PKG_REPOSITORY");

/// Whether `dir` is the root of a Switchyard checkout: the SDK crate and the WIT package.
fn is_checkout(dir: &Path) -> bool {
    dir.join("wit").is_dir()
        && std::fs::read_to_string(dir.join("sdk/Cargo.toml"))
            .is_ok_and(|manifest| manifest.contains("name = \"switchyard-policy-sdk\""))
}

/// The checkout `dir` is in, if any.
fn checkout_above(dir: &Path) -> Option<PathBuf> {
    let dir = std::fs::canonicalize(dir).ok()?;
    dir.ancestors()
        .find(|d| is_checkout(d))
        .map(Path::to_path_buf)
}

fn find_sdk(explicit: Option<&Path>, parent: &Path) -> anyhow::Result<Sdk> {
    if let Some(path) = explicit {
        let path =
            std::fs::canonicalize(path).with_context(|| format!("--sdk {}", path.display()))?;
        let root = [path.as_path(), path.parent().unwrap_or(&path)]
            .into_iter()
            .find(|d| is_checkout(d))
            .with_context(|| {
                format!(
                    "--sdk {}: not a Switchyard checkout (no sdk/ crate switchyard-policy-sdk \
                     beside wit/) nor its sdk/ directory",
                    path.display()
                )
            })?;
        return Ok(Sdk::Checkout {
            root: root.to_path_buf(),
            found: "--sdk",
        });
    }
    if let Some(root) = checkout_above(parent) {
        return Ok(Sdk::Checkout {
            root,
            found: "the checkout the crate is created in",
        });
    }
    if let Some(root) = std::env::current_dir()
        .ok()
        .and_then(|d| checkout_above(&d))
    {
        return Ok(Sdk::Checkout {
            root,
            found: "the checkout of the current directory",
        });
    }
    let built_from = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    if let Ok(root) = std::fs::canonicalize(&built_from)
        && is_checkout(&root)
    {
        return Ok(Sdk::Checkout {
            root,
            found: "the checkout this switchyard was built from",
        });
    }
    Ok(Sdk::Git)
}

/// A kebab-case crate and policy name, as the host's metadata check wants it.
fn check_name(name: &str) -> anyhow::Result<()> {
    let ok = name.starts_with(|c: char| c.is_ascii_lowercase())
        && !name.ends_with('-')
        && !name.contains("--")
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if !ok {
        bail!(
            "`{name}` is not a kebab-case name (lowercase letters, digits and single dashes, \
             starting with a letter), which the gateway requires of a policy's name"
        );
    }
    Ok(())
}

/// `template` with every `{{key}}` replaced by its value.
fn render(template: &str, values: &[(&str, &str)]) -> String {
    values
        .iter()
        .fold(template.to_owned(), |text, (key, value)| {
            text.replace(&format!("{{{{{key}}}}}"), value)
        })
}

/// A TOML basic string holding `text`.
fn toml_string(text: &str) -> String {
    format!("\"{}\"", text.replace('\\', "\\\\").replace('"', "\\\""))
}

/// The `path` of `target` relative to `from` when `from` lies inside `root` (so the pair can
/// move together), else `target` itself.
fn dependency_path(from: &Path, root: &Path, target: &Path) -> PathBuf {
    match from.strip_prefix(root) {
        Ok(inside) => {
            let mut path: PathBuf = inside.components().map(|_| "..").collect();
            path.push(target.strip_prefix(root).unwrap_or(target));
            path
        }
        Err(_) => target.to_path_buf(),
    }
}

/// The files of a new crate: `(path in the crate, contents)`.
fn scaffold(world: World, name: &str, sdk_dependency: &str) -> Vec<(&'static str, String)> {
    let lib_name = name.replace('-', "_");
    let mut values = vec![
        ("name", name),
        ("lib_name", lib_name.as_str()),
        ("world", world.name()),
        ("description", world.description()),
        ("baseline", world.baseline()),
        ("sdk_dependency", sdk_dependency),
    ];
    values.extend(world.readme_values());
    vec![
        (
            "Cargo.toml",
            render(include_str!("../templates/policy/Cargo.toml.in"), &values),
        ),
        (
            "README.md",
            render(include_str!("../templates/policy/README.md.in"), &values),
        ),
        (
            ".gitignore",
            include_str!("../templates/policy/gitignore.in").to_owned(),
        ),
        ("src/lib.rs", render(world.lib_template(), &values)),
    ]
}

fn new(args: &NewArgs) -> anyhow::Result<()> {
    check_name(&args.name)?;
    let parent = args.dir.clone().unwrap_or_else(|| PathBuf::from("."));
    std::fs::create_dir_all(&parent).with_context(|| format!("creating {}", parent.display()))?;
    let dir = parent.join(&args.name);
    if dir.exists() {
        bail!("{} already exists", dir.display());
    }
    let sdk = find_sdk(args.sdk.as_deref(), &parent)?;
    std::fs::create_dir_all(dir.join("src"))
        .with_context(|| format!("creating {}", dir.display()))?;
    let crate_dir = std::fs::canonicalize(&dir)?;
    let dependency = match &sdk {
        Sdk::Checkout { root, .. } => {
            let path = dependency_path(&crate_dir, root, &root.join("sdk"));
            format!(
                "switchyard-policy-sdk = {{ path = {} }}",
                toml_string(&path.to_string_lossy())
            )
        }
        Sdk::Git => format!(
            "# No Switchyard checkout was found: the SDK comes from its repository. To build against\n\
             # a local checkout instead, use `path = \"<checkout>/sdk\"`.\n\
             switchyard-policy-sdk = {{ git = {} }}",
            toml_string(REPOSITORY)
        ),
    };
    for (path, contents) in scaffold(args.world, &args.name, &dependency) {
        std::fs::write(dir.join(path), contents)
            .with_context(|| format!("writing {}", dir.join(path).display()))?;
    }
    println!(
        "created {} policy `{}` in {}",
        args.world.name(),
        args.name,
        dir.display()
    );
    match &sdk {
        Sdk::Checkout { root, found } => {
            // The built-in policies' lock file: the scaffold resolves the same dependency
            // versions, which a machine that built the gateway has in its cargo cache.
            let lock = root.join("policies/Cargo.lock");
            if lock.is_file() {
                std::fs::copy(&lock, dir.join("Cargo.lock"))
                    .with_context(|| format!("copying {}", lock.display()))?;
            }
            println!(
                "SDK: path dependency on {} ({found})",
                root.join("sdk").display()
            );
        }
        Sdk::Git => println!(
            "note: no Switchyard checkout found (here, above {}, or where this binary was built): \
             the SDK is a git dependency on {REPOSITORY}; pass --sdk <checkout> to use a local one",
            dir.display()
        ),
    }
    let lib_name = args.name.replace('-', "_");
    println!(
        "next:\n  cd {}\n  cargo test\n  cargo build --target wasm32-wasip2 --release\n  \
         switchyard policy check target/wasm32-wasip2/release/{lib_name}.wasm\n  \
         switchyard policy test target/wasm32-wasip2/release/{lib_name}.wasm --trace <trace>",
        dir.display()
    );
    Ok(())
}

// ---- check -----------------------------------------------------------------------------------

#[derive(Debug, Args)]
pub(crate) struct CheckArgs {
    /// The component (`.wasm`).
    file: PathBuf,
    /// Check it as this world (default: the world its exports make it).
    #[arg(long)]
    world: Option<World>,
}

/// A component the registry accepted.
#[derive(Debug)]
struct Checked {
    world: World,
    info: PolicyInfo,
    metadata: Metadata,
}

impl Checked {
    fn summary(&self, path: &Path) -> String {
        let m = &self.metadata;
        let mut out = String::new();
        let _ = writeln!(out, "{}: ok, the gateway would load it", path.display());
        let rows = [
            ("world", m.world.clone()),
            (
                "WIT version",
                format!(
                    "switchyard:policy@{} (this host implements {WIT_MAJOR}.x)",
                    m.wit_version
                ),
            ),
            ("name", m.name.clone()),
            ("version", m.version.clone()),
            ("description", m.description.clone()),
            (
                "content hash",
                self.info.content_hash.clone().unwrap_or_default(),
            ),
            (
                "canary",
                format!(
                    "passed ({} calls on the registry's sample inputs)",
                    self.world.name()
                ),
            ),
        ];
        for (key, value) in rows {
            let _ = writeln!(out, "  {key:<13} {value}");
        }
        out
    }
}

/// Load `path` the way the gateway does, through the registry: file permissions, compile,
/// world, imports, metadata, canary and warm-up. `world`: the role to load it in (default: the
/// world its exports make it).
fn checked(path: &Path, world: Option<World>) -> anyhow::Result<Checked> {
    let rejected = |err: PolicyError| {
        anyhow::anyhow!("{}: rejected ({}): {err}", path.display(), err.reason())
    };
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let engine = PolicyEngine::new(EngineConfig::default())?;
    let world = match world {
        Some(world) => world,
        None => {
            let name = engine.world_of(&bytes).map_err(rejected)?;
            World::from_name(name).with_context(|| format!("unknown world `{name}`"))?
        }
    };
    let registry = PolicyRegistry::new(engine.clone(), None, &[], "switchyard-policy-check");
    let info = registry
        .load(world.role(), PolicySource::File(path.to_path_buf()))
        .map_err(rejected)?;
    if info.content_hash != Some(ContentHash::of(&bytes).to_string()) {
        bail!("{} changed while it was being checked", path.display());
    }
    // The accepted bytes' metadata, WIT version included (compiled once: the engine caches).
    let metadata = match world {
        World::Router => engine.load_router(&bytes).map(|c| c.metadata().clone()),
        World::Admission => engine.load_admission(&bytes).map(|c| c.metadata().clone()),
        World::KvHints => engine.load_kv_hints(&bytes).map(|c| c.metadata().clone()),
    }
    .map_err(rejected)?;
    Ok(Checked {
        world,
        info,
        metadata,
    })
}

// ---- test ------------------------------------------------------------------------------------

#[derive(Debug, Args)]
pub(crate) struct TestArgs {
    /// The component (`.wasm`).
    file: PathBuf,
    /// Trace file (or directory of Claude Code traces), as for `switchyard simulate`.
    #[arg(long)]
    trace: PathBuf,
    /// The baseline: a native policy of the component's world, with parameters as `switchyard
    /// simulate` takes them, or `wasm:<built-in>`. Default: kv-cost (router), none (admission),
    /// no-hints (kv-hints).
    #[arg(long)]
    against: Option<String>,
    /// Test it as this world (default: the world its exports make it).
    #[arg(long)]
    world: Option<World>,
    /// Further `switchyard simulate` flags, after `--` (e.g. `-- --workers 4 --speedup 10`).
    #[arg(last = true)]
    simulate: Vec<String>,
}

/// `switchyard simulate`'s flags, parsed from the command line `policy test` builds.
#[derive(Debug, Parser)]
#[command(name = "switchyard simulate")]
struct SimulateCli {
    #[command(flatten)]
    args: SimulateArgs,
}

/// The `switchyard simulate` command line that runs `file` and `baseline` for `world`.
fn simulate_command(
    world: World,
    file: &Path,
    baseline: &str,
    trace: &Path,
    extra: &[String],
) -> anyhow::Result<Vec<String>> {
    let file = file.to_string_lossy();
    if !file.ends_with(".wasm") || file.contains(',') {
        bail!("{file}: the simulator takes a component path ending in .wasm, without commas");
    }
    let mut command = vec![
        "simulate".to_owned(),
        "--trace".to_owned(),
        trace.to_string_lossy().into_owned(),
        world.simulate_flag().to_owned(),
        format!("{baseline},{file}"),
    ];
    let given = |flag: &str| {
        extra
            .iter()
            .any(|a| a == flag || a.starts_with(&format!("{flag}=")))
    };
    for (flag, value) in world.simulate_defaults() {
        if !given(flag) {
            command.extend([(*flag).to_owned(), (*value).to_owned()]);
        }
    }
    command.extend(extra.iter().cloned());
    Ok(command)
}

fn test(args: TestArgs) -> anyhow::Result<()> {
    let checked = checked(&args.file, args.world)?;
    let world = checked.world;
    let m = &checked.metadata;
    eprintln!(
        "{}: {} policy `{}` {} passed the gateway's checks",
        args.file.display(),
        world.name(),
        m.name,
        m.version
    );
    let baseline = args.against.as_deref().unwrap_or(world.baseline());
    let command = simulate_command(world, &args.file, baseline, &args.trace, &args.simulate)?;
    let simulate_args = SimulateCli::try_parse_from(&command)
        .map_err(|e| anyhow::anyhow!("{}\n(simulator flags: {})", e.render(), command.join(" ")))?
        .args;
    let workload = simulate::load_workload(&simulate_args)?;
    let (outcomes, report) = simulate::simulate(&simulate_args, &workload)?;
    println!("{} vs {baseline} on {}", m.name, args.trace.display());
    print!("{}", comparison(world, &report.runs));
    simulate::write_outputs(&simulate_args, &workload, &outcomes, &report)
}

/// One cell of the comparison: a number (with its decimals), or text.
enum Cell {
    Number(f64, usize),
    Text(String),
}

type Row = (&'static str, fn(&RunReport) -> Cell);

fn number(value: f64, decimals: usize) -> Cell {
    Cell::Number(value, decimals)
}

/// `done/all` actions of type `action`: accepted or clipped, of every outcome.
fn hint_actions(run: &RunReport, action: &str) -> Cell {
    let Some(hints) = &run.kv_hints else {
        return Cell::Text("-".into());
    };
    let all = hints.total(action).actions;
    let done = hints.count(action, "accepted").actions + hints.count(action, "clipped").actions;
    Cell::Text(format!("{done}/{all}"))
}

fn rows(world: World, runs: &[RunReport]) -> Vec<Row> {
    let mut rows: Vec<Row> = vec![
        ("requests", |r| number(r.requests as f64, 0)),
        ("failed", |r| number(r.failed_requests as f64, 0)),
        ("requests/s", |r| number(r.requests_per_s, 3)),
        ("output tok/s", |r| number(r.output_tokens_per_s, 1)),
        ("agent steps/min", |r| match r.agent_steps_per_min {
            Some(v) => number(v, 2),
            None => Cell::Text("-".into()),
        }),
        ("TTFT p50 ms", |r| number(r.ttft_ms.p50, 1)),
        ("TTFT p99 ms", |r| number(r.ttft_ms.p99, 1)),
        ("E2E p50 ms", |r| number(r.e2e_ms.p50, 0)),
        ("prefix hit ratio", |r| number(r.prefix_hit_ratio, 3)),
        ("recomputed tok", |r| number(r.recomputed_tokens as f64, 0)),
    ];
    if runs.iter().any(|r| r.tiers.is_some()) {
        rows.extend([
            (
                "device hit ratio",
                (|r| {
                    number(
                        r.tiers.map_or(r.prefix_hit_ratio, |t| t.device_hit_ratio),
                        3,
                    )
                }) as fn(&RunReport) -> Cell,
            ),
            ("host hit ratio", |r| {
                number(r.tiers.unwrap_or_default().host_hit_ratio, 3)
            }),
        ]);
    }
    match world {
        World::Router => {}
        World::Admission => rows.extend([
            (
                "held requests",
                (|r| number(r.admission_stats.held_requests as f64, 0)) as fn(&RunReport) -> Cell,
            ),
            ("hold time s", |r| number(r.admission_stats.hold_time_s, 1)),
            ("pauses", |r| number(r.admission_stats.pauses as f64, 0)),
        ]),
        World::KvHints => rows.extend([
            (
                "hint calls",
                (|r| number(r.kv_hints.as_ref().map_or(0, |h| h.policy_calls) as f64, 0))
                    as fn(&RunReport) -> Cell,
            ),
            ("hints", |r| {
                number(r.kv_hints.as_ref().map_or(0, |h| h.hints) as f64, 0)
            }),
            ("demote done/all", |r| hint_actions(r, "demote")),
            ("prefetch done/all", |r| hint_actions(r, "prefetch")),
            ("evict done/all", |r| hint_actions(r, "evict")),
            ("retain done/all", |r| hint_actions(r, "retain")),
            ("pin done/all", |r| hint_actions(r, "pin")),
            ("demoted blocks", |r| {
                number(r.tiers.unwrap_or_default().demoted_blocks as f64, 0)
            }),
            ("prefetched blocks", |r| {
                number(r.tiers.unwrap_or_default().prefetched_blocks as f64, 0)
            }),
            ("unnamed blocks", |r| {
                number(
                    r.kv_hints.as_ref().map_or(0, |h| h.unnamed_blocks) as f64,
                    0,
                )
            }),
        ]),
    }
    rows
}

/// The name of `run`'s policy of `world` (the baseline's spec, or the component's name).
fn policy_of(world: World, run: &RunReport) -> String {
    match world {
        World::Router => run.policy.clone(),
        World::Admission => run.admission.clone(),
        World::KvHints => run
            .kv_hints
            .as_ref()
            .map_or_else(|| "-".to_owned(), |h| h.policy.clone()),
    }
}

/// The runs side by side, one column per run (headed by its policy of `world`, or by its full
/// label when a sweep makes those ambiguous); with two runs, the change from the first (the
/// baseline) to the second.
fn comparison(world: World, runs: &[RunReport]) -> String {
    let mut headers: Vec<String> = runs.iter().map(|r| policy_of(world, r)).collect();
    let mut unique = headers.clone();
    unique.sort();
    unique.dedup();
    if unique.len() != headers.len() {
        headers = runs.iter().map(RunReport::label).collect();
    }
    let pair = runs.len() == 2;
    let width = headers.iter().map(String::len).max().unwrap_or(0).max(12);
    let mut out = String::new();
    let _ = write!(out, "{:<18}", "");
    for header in &headers {
        let _ = write!(out, " {header:>width$}");
    }
    if pair {
        let _ = write!(out, " {:>8}", "change");
    }
    out.push('\n');
    for (name, value) in rows(world, runs) {
        let _ = write!(out, "{name:<18}");
        let cells: Vec<Cell> = runs.iter().map(value).collect();
        for cell in &cells {
            let text = match cell {
                Cell::Number(v, decimals) => format!("{v:.decimals$}"),
                Cell::Text(text) => text.clone(),
            };
            let _ = write!(out, " {text:>width$}");
        }
        if pair {
            let change = match (&cells[0], &cells[1]) {
                (Cell::Number(a, _), Cell::Number(b, _)) if *a != 0.0 => {
                    format!("{:+.1}%", (b - a) / a.abs() * 100.0)
                }
                (Cell::Number(a, _), Cell::Number(b, _)) if a == b => "0.0%".to_owned(),
                _ => "-".to_owned(),
            };
            let _ = write!(out, " {change:>8}");
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_template_renders_completely() {
        for world in [World::Router, World::Admission, World::KvHints] {
            for (path, text) in scaffold(world, "my-policy", "switchyard-policy-sdk = \"1\"") {
                assert!(!text.contains("{{"), "{path} of {world:?}: {text}");
                if path == "src/lib.rs" {
                    assert!(text.contains("\"my-policy\""), "{world:?}");
                }
            }
        }
    }

    #[test]
    fn names_must_be_kebab_case() {
        assert!(check_name("my-hints2").is_ok());
        for bad in ["", "My", "2x", "a_b", "a-", "a--b", "-a"] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_sdk_path_is_relative_inside_the_checkout() {
        let root = Path::new("/repo");
        let sdk = root.join("sdk");
        assert_eq!(
            dependency_path(Path::new("/repo/policies/mine"), root, &sdk),
            Path::new("../../sdk")
        );
        assert_eq!(
            dependency_path(Path::new("/elsewhere/mine"), root, &sdk),
            sdk
        );
        assert_eq!(toml_string(r#"C:\a "b""#), r#""C:\\a \"b\"""#);
    }

    #[test]
    fn the_simulator_gets_both_policies_and_the_world_defaults() {
        let extra = vec!["--workers".to_owned(), "2".to_owned()];
        let command = simulate_command(
            World::KvHints,
            Path::new("p.wasm"),
            "no-hints",
            Path::new("t"),
            &extra,
        )
        .unwrap();
        assert_eq!(
            command,
            [
                "simulate",
                "--trace",
                "t",
                "--kv-hints",
                "no-hints,p.wasm",
                "--policies",
                "kv-cost",
                "--host-tier-blocks",
                "65536",
                "--workers",
                "2"
            ]
        );
        assert!(SimulateCli::try_parse_from(&command).is_ok());
        let own = vec!["--host-tier-blocks=8".to_owned()];
        let command = simulate_command(
            World::KvHints,
            Path::new("p.wasm"),
            "x",
            Path::new("t"),
            &own,
        )
        .unwrap();
        assert_eq!(
            command.iter().filter(|a| a.contains("host-tier")).count(),
            1
        );
        assert!(simulate_command(World::Router, Path::new("p"), "x", Path::new("t"), &[]).is_err());
    }
}
