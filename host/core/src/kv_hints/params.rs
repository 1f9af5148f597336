//! Native KV-hint strategies from a spec string: `name[:key=value]*`, several joined by `+`.
//!
//! `demote-on-tool-call:demote_threshold=1s+subagent-reclaim` runs both strategies, the first
//! with one parameter changed; keys are the fields of the strategy's config struct
//! ([`DemoteOnToolCallConfig`], [`SubagentReclaimConfig`], [`ShareToSubagentConfig`]), values
//! read as in the admission specs (`crate::admission::native_admission_spec`).

use super::strategies::{
    AllOf, CompactionEvict, DemoteOnToolCall, DemoteOnToolCallConfig, ShareToSubagent,
    ShareToSubagentConfig, SubagentReclaim, SubagentReclaimConfig,
};
use super::{HintTier, KvHintPolicy, NoHints};
use crate::admission::ParamError;
use crate::admission::params::{Value, split_spec, unknown};

/// The native strategy (or strategies, joined by `+`) that `spec` names.
pub fn native_kv_hints_spec(spec: &str) -> Result<Box<dyn KvHintPolicy>, ParamError> {
    let mut parts = spec.split('+').map(one).collect::<Result<Vec<_>, _>>()?;
    Ok(match parts.len() {
        1 => parts.remove(0),
        _ => Box::new(AllOf::new(spec.to_owned(), parts)),
    })
}

fn one(spec: &str) -> Result<Box<dyn KvHintPolicy>, ParamError> {
    let (name, pairs) = split_spec(spec)?;
    let no_keys = |policy: &str| match pairs.first() {
        Some((key, _)) => Err(unknown(policy, key)),
        None => Ok(()),
    };
    Ok(match name {
        "no-hints" | "none" => {
            no_keys("no-hints")?;
            Box::new(NoHints)
        }
        "compaction-evict" => {
            no_keys("compaction-evict")?;
            Box::new(CompactionEvict)
        }
        "demote-on-tool-call" => {
            let mut config = DemoteOnToolCallConfig::default();
            for (key, value) in pairs {
                config.set(key, value)?;
            }
            Box::new(DemoteOnToolCall::new(config))
        }
        "subagent-reclaim" => {
            let mut config = SubagentReclaimConfig::default();
            for (key, value) in pairs {
                let v = Value { key, value };
                match key {
                    "max_sessions" => config.max_sessions = v.count()?,
                    _ => return Err(unknown("subagent-reclaim", key)),
                }
            }
            Box::new(SubagentReclaim::new(config))
        }
        "share-to-subagent" => {
            let mut config = ShareToSubagentConfig::default();
            for (key, value) in pairs {
                let v = Value { key, value };
                match key {
                    "max_sessions" => config.max_sessions = v.count()?,
                    _ => return Err(unknown("share-to-subagent", key)),
                }
            }
            Box::new(ShareToSubagent::new(config))
        }
        other => return Err(ParamError::UnknownKvHints(other.to_owned())),
    })
}

impl DemoteOnToolCallConfig {
    /// Set the field named `key` from `value`.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), ParamError> {
        let v = Value { key, value };
        match key {
            "unseen_tool_time" => self.unseen_tool_time = v.duration()?,
            "ewma_weight" => {
                self.ewma_weight = Some(v.float()?)
                    .filter(|w| (0.0..=1.0).contains(w))
                    .ok_or_else(|| ParamError::BadValue {
                        key: key.to_owned(),
                        value: value.to_owned(),
                        expected: "a number from 0 to 1",
                    })?;
            }
            "demote_threshold" => self.demote_threshold = v.duration()?,
            "demote_above_usage" => {
                self.demote_above_usage = Some(v.float()?)
                    .filter(|u| (0.0..=1.0).contains(u))
                    .ok_or_else(|| ParamError::BadValue {
                        key: key.to_owned(),
                        value: value.to_owned(),
                        expected: "a number from 0 to 1",
                    })?;
            }
            "prefetch_lead" => self.prefetch_lead = v.duration()?,
            "demote_to" => {
                self.demote_to = match value {
                    "host" => HintTier::Host,
                    "disk" => HintTier::Disk,
                    "shared" => HintTier::Shared,
                    _ => {
                        return Err(ParamError::BadValue {
                            key: key.to_owned(),
                            value: value.to_owned(),
                            expected: "host, disk or shared",
                        });
                    }
                };
            }
            "max_tools" => self.max_tools = v.count()?,
            "max_sessions" => self.max_sessions = v.count()?,
            _ => return Err(unknown("demote-on-tool-call", key)),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn specs_set_parameters_and_join_strategies() {
        let mut config = DemoteOnToolCallConfig::default();
        config.set("demote_threshold", "750ms").unwrap();
        config.set("demote_to", "disk").unwrap();
        config.set("demote_above_usage", "0.75").unwrap();
        assert_eq!(config.demote_threshold, Duration::from_millis(750));
        assert_eq!(config.demote_above_usage, 0.75);
        assert_eq!(config.demote_to, HintTier::Disk);
        let joined =
            native_kv_hints_spec("demote-on-tool-call:unseen_tool_time=5s+subagent-reclaim")
                .unwrap();
        assert_eq!(
            joined.name(),
            "demote-on-tool-call:unseen_tool_time=5s+subagent-reclaim"
        );
        assert_eq!(native_kv_hints_spec("none").unwrap().name(), "no-hints");
    }

    #[test]
    fn bad_specs_say_what_is_wrong() {
        let err = |spec: &str| native_kv_hints_spec(spec).unwrap_err().to_string();
        assert!(err("continuum").contains("unknown KV-hint strategy `continuum`"));
        assert!(err("demote-on-tool-call:speed=2").contains("no parameter `speed`"));
        assert!(err("demote-on-tool-call:ewma_weight=3").contains("from 0 to 1"));
        assert!(err("demote-on-tool-call:demote_above_usage=1.5").contains("from 0 to 1"));
        assert!(err("demote-on-tool-call:demote_to=gpu").contains("host, disk or shared"));
        assert!(err("subagent-reclaim:max_sessions").contains("not key=value"));
        assert!(err("no-hints:x=1").contains("no parameter `x`"));
    }
}
