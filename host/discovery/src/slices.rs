//! EndpointSlices -> the workers they stand for: pure, so that every rule is tested without a
//! cluster.

use k8s_openapi::api::discovery::v1::{Endpoint, EndpointSlice};
use std::collections::BTreeMap;
use std::net::IpAddr;
use switchyard_gateway::config::WorkerConfig;
use switchyard_gateway::discovery::{KubernetesDiscoveryConfig, PortRef};

/// One worker per serving address of `slices` (see [`is_serving`]), sorted by URL; an address
/// in several slices (as during a slice's replacement) is one worker. A slice whose port is
/// named and missing, or with an address type or address that is not an IP or a DNS name,
/// contributes nothing.
pub fn desired_workers<'a>(
    config: &KubernetesDiscoveryConfig,
    slices: impl IntoIterator<Item = &'a EndpointSlice>,
) -> Vec<WorkerConfig> {
    let mut workers = BTreeMap::new();
    for slice in slices {
        let Some(port) = http_port(config, slice) else {
            continue;
        };
        let addresses = slice
            .endpoints
            .iter()
            .filter(|e| is_serving(e))
            .flat_map(|e| e.addresses.iter())
            .filter(|a| is_address(&slice.address_type, a));
        for address in addresses {
            let worker = config.worker_at(address, port);
            workers.entry(worker.url.clone()).or_insert(worker);
        }
    }
    workers.into_values().collect()
}

/// Whether an endpoint should get traffic: ready (an absent condition counts as ready, as
/// Kubernetes documents; without `ready`, `serving` decides), and not terminating. A
/// terminating endpoint leaves at once, even while it still serves its last requests: requests
/// already on it finish, none go there any more.
pub fn is_serving(endpoint: &Endpoint) -> bool {
    let conditions = endpoint.conditions.as_ref();
    let terminating = conditions.and_then(|c| c.terminating).unwrap_or(false);
    let ready = conditions
        .and_then(|c| c.ready.or(c.serving))
        .unwrap_or(true);
    ready && !terminating
}

/// The engines' HTTP port in `slice`: the configured number, or the slice's port of that name.
fn http_port(config: &KubernetesDiscoveryConfig, slice: &EndpointSlice) -> Option<u16> {
    match &config.port {
        PortRef::Number(port) => Some(*port),
        PortRef::Name(name) => slice
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(name.as_str()))
            .and_then(|p| p.port)
            .and_then(|p| u16::try_from(p).ok())
            .filter(|p| *p != 0),
    }
}

/// `address` is what its slice's `addressType` says it is: an IPv4 or IPv6 address, or a DNS
/// name (`FQDN`). Anything else would make a URL that is not one.
fn is_address(address_type: &str, address: &str) -> bool {
    match address_type {
        "IPv4" => address.parse::<IpAddr>().is_ok_and(|ip| ip.is_ipv4()),
        "IPv6" => address.parse::<IpAddr>().is_ok_and(|ip| ip.is_ipv6()),
        "FQDN" => {
            !address.is_empty()
                && address.len() <= 253
                && address.split('.').all(|label| {
                    !label.is_empty()
                        && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                })
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests;
