//! The ext_proc messages the picker reads and writes, built in one place.

use crate::{DESTINATION_SUBSET, LB_NAMESPACE, SUBSET_NAMESPACE};
use envoy_types::pb::envoy::config::core::v3::{
    HeaderMap as EnvoyHeaders, HeaderValue, HeaderValueOption, Metadata,
    header_value_option::HeaderAppendAction,
};
use envoy_types::pb::envoy::service::ext_proc::v3::{
    BodyMutation, BodyResponse, CommonResponse, HeaderMutation, HeadersResponse, ImmediateResponse,
    ProcessingResponse, StreamedBodyResponse, TrailersResponse, body_mutation,
    processing_response::Response,
};
use envoy_types::pb::envoy::r#type::v3::HttpStatus;
use envoy_types::pb::google::protobuf::{Struct, Value, value::Kind};
use http::{HeaderMap, HeaderName};
use switchyard_gateway::error::Refusal;

/// Envoy's headers as an HTTP header map, pseudo-headers (`:path`, `:status`) included. Envoy
/// sends values as `raw_value` (bytes); older versions as `value`.
pub(crate) fn header_map(headers: Option<&EnvoyHeaders>) -> HeaderMap {
    let mut map = HeaderMap::new();
    for h in headers.map(|h| h.headers.as_slice()).unwrap_or_default() {
        let raw = if h.raw_value.is_empty() {
            h.value.as_bytes()
        } else {
            &h.raw_value
        };
        // Pseudo-headers are not valid names for `http`: keep them without the colon prefix
        // under a name of ours.
        let name = match h.key.strip_prefix(':') {
            Some(pseudo) => HeaderName::try_from(format!("x-envoy-pseudo-{pseudo}")),
            None => HeaderName::try_from(h.key.as_str()),
        };
        if let (Ok(name), Ok(value)) = (name, http::HeaderValue::from_bytes(raw)) {
            map.append(name, value);
        }
    }
    map
}

/// A pseudo-header (`path`, `method`, `status`) of a map made by [`header_map`].
pub(crate) fn pseudo<'a>(map: &'a HeaderMap, name: &str) -> Option<&'a str> {
    map.get(format!("x-envoy-pseudo-{name}"))
        .and_then(|v| v.to_str().ok())
}

/// The endpoints the proxy allows, from `envoy.lb.subset_hint`; `None` when it sent no hint.
pub(crate) fn subset(metadata: Option<&Metadata>) -> Option<Vec<String>> {
    let hint = metadata?.filter_metadata.get(SUBSET_NAMESPACE)?;
    let value = hint.fields.get(DESTINATION_SUBSET)?;
    let endpoints = match &value.kind {
        Some(Kind::ListValue(list)) => list
            .values
            .iter()
            .filter_map(|v| match &v.kind {
                Some(Kind::StringValue(s)) => Some(s.clone()),
                _ => None,
            })
            .collect(),
        // A comma-separated string, as the header form is.
        Some(Kind::StringValue(s)) => s
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect(),
        _ => Vec::new(),
    };
    Some(endpoints)
}

fn set_header(key: &str, value: &str) -> HeaderValueOption {
    HeaderValueOption {
        header: Some(HeaderValue {
            key: key.into(),
            raw_value: value.as_bytes().to_vec(),
            ..HeaderValue::default()
        }),
        // A client cannot choose its own endpoint.
        append_action: HeaderAppendAction::OverwriteIfExistsOrAdd as i32,
        ..HeaderValueOption::default()
    }
}

/// Go on with these headers set (and the route chosen again, since they may change it).
pub(crate) fn request_headers(set: &[(&str, &str)]) -> ProcessingResponse {
    let mutation = (!set.is_empty()).then(|| HeaderMutation {
        set_headers: set.iter().map(|(k, v)| set_header(k, v)).collect(),
        ..HeaderMutation::default()
    });
    ProcessingResponse {
        response: Some(Response::RequestHeaders(HeadersResponse {
            response: Some(CommonResponse {
                clear_route_cache: mutation.is_some(),
                header_mutation: mutation,
                ..CommonResponse::default()
            }),
        })),
        ..ProcessingResponse::default()
    }
}

/// The picked endpoints, as `envoy.lb` dynamic metadata (`key` = `a,b,c`).
pub(crate) fn lb_metadata(key: &str, endpoints: &str) -> Struct {
    let inner = Struct {
        fields: [(key.to_string(), string(endpoints))].into(),
    };
    Struct {
        fields: [(
            LB_NAMESPACE.to_string(),
            Value {
                kind: Some(Kind::StructValue(inner)),
            },
        )]
        .into(),
    }
}

fn string(s: &str) -> Value {
    Value {
        kind: Some(Kind::StringValue(s.into())),
    }
}

/// A list value, as proxies send subset hints.
#[cfg(test)]
fn string_list(items: &[&str]) -> Value {
    Value {
        kind: Some(Kind::ListValue(
            envoy_types::pb::google::protobuf::ListValue {
                values: items.iter().map(|s| string(s)).collect(),
            },
        )),
    }
}

/// A body chunk passed on unchanged (full-duplex streamed mode answers every chunk it keeps).
pub(crate) fn body_chunk(request: bool, body: Vec<u8>, end_of_stream: bool) -> ProcessingResponse {
    let answer = BodyResponse {
        response: Some(CommonResponse {
            body_mutation: Some(BodyMutation {
                mutation: Some(body_mutation::Mutation::StreamedResponse(
                    StreamedBodyResponse {
                        body,
                        end_of_stream,
                        ..StreamedBodyResponse::default()
                    },
                )),
            }),
            ..CommonResponse::default()
        }),
    };
    ProcessingResponse {
        response: Some(if request {
            Response::RequestBody(answer)
        } else {
            Response::ResponseBody(answer)
        }),
        ..ProcessingResponse::default()
    }
}

/// Nothing decided yet: give this message `extend` more (up to Envoy's `max_message_timeout`).
pub(crate) fn keep_waiting(extend: std::time::Duration) -> ProcessingResponse {
    ProcessingResponse {
        override_message_timeout: Some(envoy_types::pb::google::protobuf::Duration {
            seconds: i64::try_from(extend.as_secs()).unwrap_or(i64::MAX),
            nanos: 0,
        }),
        ..ProcessingResponse::default()
    }
}

/// Response headers: go on unchanged.
pub(crate) fn response_headers() -> ProcessingResponse {
    ProcessingResponse {
        response: Some(Response::ResponseHeaders(HeadersResponse::default())),
        ..ProcessingResponse::default()
    }
}

/// Trailers: go on unchanged.
pub(crate) fn trailers(request: bool) -> ProcessingResponse {
    let answer = TrailersResponse::default();
    ProcessingResponse {
        response: Some(if request {
            Response::RequestTrailers(answer)
        } else {
            Response::ResponseTrailers(answer)
        }),
        ..ProcessingResponse::default()
    }
}

/// Answer the client directly: the refusal's status, `Retry-After` and body in its API's shape.
pub(crate) fn immediate(refusal: Refusal) -> ProcessingResponse {
    let mut headers = vec![set_header("content-type", "application/json")];
    if let Some(secs) = refusal.retry_after {
        headers.push(set_header("retry-after", &secs.to_string()));
    }
    ProcessingResponse {
        response: Some(Response::ImmediateResponse(ImmediateResponse {
            status: Some(HttpStatus {
                code: i32::from(refusal.status.as_u16()),
            }),
            headers: Some(HeaderMutation {
                set_headers: headers,
                ..HeaderMutation::default()
            }),
            body: refusal.body.to_vec(),
            details: "switchyard_epp_refused".into(),
            ..ImmediateResponse::default()
        })),
        ..ProcessingResponse::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_values_win_and_pseudo_headers_are_kept() {
        let envoy = EnvoyHeaders {
            headers: vec![
                HeaderValue {
                    key: ":path".into(),
                    raw_value: b"/v1/chat/completions".to_vec(),
                    ..HeaderValue::default()
                },
                HeaderValue {
                    key: "x-session-id".into(),
                    value: "old-style".into(),
                    ..HeaderValue::default()
                },
                HeaderValue {
                    key: "bad name".into(),
                    raw_value: b"dropped".to_vec(),
                    ..HeaderValue::default()
                },
            ],
        };
        let map = header_map(Some(&envoy));
        assert_eq!(pseudo(&map, "path"), Some("/v1/chat/completions"));
        assert_eq!(map["x-session-id"], "old-style");
        assert_eq!(map.len(), 2);
    }

    #[test]
    fn subsets_come_as_lists_or_comma_separated_strings() {
        let mut metadata = Metadata::default();
        assert_eq!(subset(Some(&metadata)), None);
        let hint = |v: Value| Struct {
            fields: [(DESTINATION_SUBSET.to_string(), v)].into(),
        };
        metadata.filter_metadata.insert(
            SUBSET_NAMESPACE.into(),
            hint(string_list(&["10.0.0.1:8000", "10.0.0.2:8000"])),
        );
        assert_eq!(
            subset(Some(&metadata)),
            Some(vec!["10.0.0.1:8000".into(), "10.0.0.2:8000".into()])
        );
        metadata
            .filter_metadata
            .insert(SUBSET_NAMESPACE.into(), hint(string(" 10.0.0.3:8000 , ")));
        assert_eq!(subset(Some(&metadata)), Some(vec!["10.0.0.3:8000".into()]));
        metadata
            .filter_metadata
            .insert(SUBSET_NAMESPACE.into(), hint(string_list(&[])));
        assert_eq!(subset(Some(&metadata)), Some(Vec::new()));
    }
}
