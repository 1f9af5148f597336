//! Native admission policies from a spec string: `name[:key=value]*`.
//!
//! `thunder-agent:decay_half_life=10s:acting_weight=0.5` is ThunderAgent with two parameters
//! changed; keys are the fields of the policy's config struct ([`ThunderAgentConfig`],
//! [`ContinuumConfig`], [`AutellixConfig`]). Durations take `ms`, `s`, `m` or `h` (a bare number is
//! seconds); booleans `true`/`false`. The same strings suit a config file or a Wasm twin's
//! metadata `extensions`.

use super::{
    AdmissionPolicy, AdmitAll, Autellix, AutellixConfig, Continuum, ContinuumConfig, ThunderAgent,
    ThunderAgentConfig,
};
use std::time::Duration;

/// A spec's `key=value` pairs, in order.
pub(crate) type Pairs<'a> = Vec<(&'a str, &'a str)>;

/// `spec`'s name and its `key=value` pairs.
pub(crate) fn split_spec(spec: &str) -> Result<(&str, Pairs<'_>), ParamError> {
    let mut parts = spec.split(':');
    let name = parts.next().unwrap_or_default().trim();
    let pairs = parts
        .map(|pair| {
            pair.split_once('=')
                .map(|(k, v)| (k.trim(), v.trim()))
                .ok_or_else(|| ParamError::Malformed(pair.to_owned()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((name, pairs))
}

/// Why a spec could not be turned into a policy.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParamError {
    /// Not a native admission policy.
    #[error("unknown admission policy `{0}`; expected none, thunder-agent, continuum or autellix")]
    UnknownPolicy(String),
    /// Not a native KV-hint strategy.
    #[error(
        "unknown KV-hint strategy `{0}`; expected no-hints, demote-on-tool-call, subagent-reclaim, share-to-subagent or compaction-evict"
    )]
    UnknownKvHints(String),
    /// The policy has no such parameter.
    #[error("policy {policy} has no parameter `{key}`")]
    UnknownKey {
        /// The policy.
        policy: String,
        /// The key.
        key: String,
    },
    /// A `key=value` pair without `=`.
    #[error("policy parameter `{0}` is not key=value")]
    Malformed(String),
    /// The value does not parse.
    #[error("policy parameter {key}={value}: expected {expected}")]
    BadValue {
        /// The key.
        key: String,
        /// The value given.
        value: String,
        /// What it should look like.
        expected: &'static str,
    },
}

/// `value` as a duration: `250ms`, `5s`, `30m`, `1h`, or a bare number of seconds.
pub fn parse_duration(value: &str) -> Option<Duration> {
    let value = value.trim();
    let (number, unit) = match value.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => value.split_at(i),
        None => (value, "s"),
    };
    let scale = match unit {
        "ms" => 0.001,
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3_600.0,
        _ => return None,
    };
    let seconds = number.trim().parse::<f64>().ok()? * scale;
    Duration::try_from_secs_f64(seconds).ok()
}

/// Parses one typed value, naming the key on failure.
pub(crate) struct Value<'a> {
    pub(crate) key: &'a str,
    pub(crate) value: &'a str,
}

impl Value<'_> {
    fn bad(&self, expected: &'static str) -> ParamError {
        ParamError::BadValue {
            key: self.key.to_owned(),
            value: self.value.to_owned(),
            expected,
        }
    }

    pub(crate) fn duration(&self) -> Result<Duration, ParamError> {
        parse_duration(self.value).ok_or_else(|| self.bad("a duration such as 500ms, 5s or 30m"))
    }

    pub(crate) fn float(&self) -> Result<f64, ParamError> {
        self.value
            .parse::<f64>()
            .ok()
            .filter(|v| v.is_finite())
            .ok_or_else(|| self.bad("a finite number"))
    }

    pub(crate) fn int(&self) -> Result<i32, ParamError> {
        self.value.parse().map_err(|_| self.bad("an integer"))
    }

    pub(crate) fn count<T: std::str::FromStr>(&self) -> Result<T, ParamError> {
        self.value
            .parse()
            .map_err(|_| self.bad("a non-negative integer"))
    }

    pub(crate) fn boolean(&self) -> Result<bool, ParamError> {
        self.value.parse().map_err(|_| self.bad("true or false"))
    }
}

pub(crate) fn unknown(policy: &str, key: &str) -> ParamError {
    ParamError::UnknownKey {
        policy: policy.to_owned(),
        key: key.to_owned(),
    }
}

// === impl ThunderAgentConfig ===

impl ThunderAgentConfig {
    /// Set the field named `key` from `value`.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), ParamError> {
        let v = Value { key, value };
        match key {
            "tick_interval" => self.tick_interval = v.duration()?,
            "acting_weight" => self.acting_weight = v.float()?,
            "program_overhead_tokens" => self.program_overhead_tokens = v.count()?,
            "pause_threshold" => self.pause_threshold = v.float()?,
            "pause_target" => self.pause_target = v.float()?,
            "resume_hysteresis" => self.resume_hysteresis = v.float()?,
            "demotion_priority" => self.demotion_priority = v.int()?,
            "demotion_ticks" => self.demotion_ticks = v.float()?,
            "resume_priority" => self.resume_priority = v.int()?,
            "forced_resume_after" => self.forced_resume_after = v.duration()?,
            "migrate_after" => self.migrate_after = v.duration()?,
            "decay_half_life" => self.decay_half_life = v.duration()?,
            "sticky" => self.sticky = v.boolean()?,
            _ => return Err(unknown("thunder-agent", key)),
        }
        Ok(())
    }
}

// === impl ContinuumConfig ===

impl ContinuumConfig {
    /// Set the field named `key` from `value`.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), ParamError> {
        let v = Value { key, value };
        match key {
            "quantile" => self.quantile = v.float()?,
            "window" => self.window = v.count()?,
            "min_samples" => self.min_samples = v.count()?,
            "default_ttl" => self.default_ttl = v.duration()?,
            "max_ttl" => self.max_ttl = v.duration()?,
            "memory_threshold" => self.memory_threshold = v.float()?,
            "program_overhead_tokens" => self.program_overhead_tokens = v.count()?,
            _ => return Err(unknown("continuum", key)),
        }
        Ok(())
    }
}

// === impl AutellixConfig ===

impl AutellixConfig {
    /// Set the field named `key` from `value`.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), ParamError> {
        let v = Value { key, value };
        match key {
            "quantum" => self.quantum = v.duration()?,
            "growth" => self.growth = v.float()?,
            "levels" => self.levels = v.count()?,
            "level_priority" => self.level_priority = v.int()?,
            _ => return Err(unknown("autellix", key)),
        }
        Ok(())
    }
}

/// The native admission policy `spec` names (`name[:key=value]*`), with `tick_interval` as the
/// host's tick (ThunderAgent's demotion is counted in ticks) unless the spec sets it.
pub fn native_admission_spec(
    spec: &str,
    tick_interval: Duration,
) -> Result<Box<dyn AdmissionPolicy>, ParamError> {
    let (name, pairs) = split_spec(spec)?;
    let apply = |set: &mut dyn FnMut(&str, &str) -> Result<(), ParamError>| {
        pairs.iter().try_for_each(|(k, v)| set(k, v))
    };
    Ok(match name {
        "none" | "admit-all" => {
            apply(&mut |k, _| Err(unknown("admit-all", k)))?;
            Box::new(AdmitAll)
        }
        "thunder-agent" => {
            let mut config = ThunderAgentConfig {
                tick_interval,
                ..ThunderAgentConfig::default()
            };
            apply(&mut |k, v| config.set(k, v))?;
            Box::new(ThunderAgent::new(config))
        }
        "continuum" => {
            let mut config = ContinuumConfig::default();
            apply(&mut |k, v| config.set(k, v))?;
            Box::new(Continuum::new(config))
        }
        "autellix" => {
            let mut config = AutellixConfig::default();
            apply(&mut |k, v| config.set(k, v))?;
            Box::new(Autellix::new(config))
        }
        other => return Err(ParamError::UnknownPolicy(other.to_owned())),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_units() {
        assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_duration("5s"), Some(Duration::from_secs(5)));
        assert_eq!(parse_duration("1.5"), Some(Duration::from_millis(1_500)));
        assert_eq!(parse_duration("30m"), Some(Duration::from_secs(1_800)));
        assert_eq!(parse_duration("1h"), Some(Duration::from_secs(3_600)));
        assert_eq!(parse_duration("5d"), None);
        assert_eq!(parse_duration("-1s"), None);
        assert_eq!(parse_duration("soon"), None);
    }

    #[test]
    fn specs_set_parameters_by_field_name() {
        let mut config = ThunderAgentConfig::default();
        config.set("decay_half_life", "10s").unwrap();
        config.set("sticky", "false").unwrap();
        config.set("demotion_priority", "-3").unwrap();
        assert_eq!(config.decay_half_life, Duration::from_secs(10));
        assert!(!config.sticky);
        assert_eq!(config.demotion_priority, -3);
        let policy =
            native_admission_spec("thunder-agent:acting_weight=0.5", Duration::from_secs(2))
                .unwrap();
        assert_eq!(policy.name(), "thunder-agent");
        assert!(native_admission_spec("continuum:quantile=0.99", Duration::ZERO).is_ok());
        assert!(native_admission_spec("autellix:levels=4", Duration::ZERO).is_ok());
        assert!(native_admission_spec("none", Duration::ZERO).is_ok());
    }

    #[test]
    fn bad_specs_name_what_is_wrong() {
        let tick = Duration::from_secs(5);
        assert_eq!(
            native_admission_spec("kvflow", tick).err(),
            Some(ParamError::UnknownPolicy("kvflow".into()))
        );
        assert_eq!(
            native_admission_spec("thunder-agent:speed=9", tick).err(),
            Some(ParamError::UnknownKey {
                policy: "thunder-agent".into(),
                key: "speed".into()
            })
        );
        assert_eq!(
            native_admission_spec("continuum:quantile", tick).err(),
            Some(ParamError::Malformed("quantile".into()))
        );
        assert!(matches!(
            native_admission_spec("autellix:quantum=fast", tick),
            Err(ParamError::BadValue { key, .. }) if key == "quantum"
        ));
        assert!(native_admission_spec("none:x=1", tick).is_err());
    }
}
