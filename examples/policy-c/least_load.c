// least-load in C: the candidate with the fewest requests in flight, then the fewest decode
// blocks; the first one on a full tie. Same policy as policies/least-load (Rust), the JS and the
// Python examples: the conformance suite checks that they all decide alike.
#include "router.h"

void exports_router_metadata(router_policy_metadata_t *ret) {
  // The host frees what we return (post-return), so every string is a heap copy.
  router_string_dup(&ret->name, "least-load-c");
  router_string_dup(&ret->version, "1.0.0");
  router_string_dup(&ret->world_name, "router");
  router_string_dup(&ret->wit_version, "1.3.0");
  router_string_dup(&ret->description, "Fewest active requests, then fewest decode blocks (C)");
  ret->extensions.ptr = NULL;
  ret->extensions.len = 0;
}

// The first of `n` candidates with the fewest requests, then the fewest decode blocks.
static uint32_t least_load(size_t n, const uint32_t *requests, const uint64_t *decode_blocks) {
  uint32_t best = 0;
  for (size_t i = 1; i < n; i++) {
    if (requests[i] < requests[best] ||
        (requests[i] == requests[best] && decode_blocks[i] < decode_blocks[best])) {
      best = (uint32_t)i;
    }
  }
  return best;
}

void exports_router_route(router_request_t *req, router_workers_t *candidates,
                           router_decision_t *ret) {
  size_t n = candidates->active_requests.len;
  if (candidates->active_decode_blocks.len < n) {
    n = candidates->active_decode_blocks.len;
  }
  ret->tag = SWITCHYARD_POLICY_TYPES_DECISION_CHOSEN;
  ret->val.chosen = least_load(n, candidates->active_requests.ptr,
                               candidates->active_decode_blocks.ptr);
  // Arguments are owned by the callee in the canonical ABI's C bindings.
  router_request_free(req);
  router_workers_free(candidates);
}

// WIT 1.2: the same decision over the packed columns (`active-requests` is the seventh column of
// `counts`, `active-decode-blocks` the third of `sizes`).
void exports_router_route_packed(router_packed_request_t *req,
                                  router_packed_workers_t *candidates,
                                  router_packed_decision_t *ret) {
  size_t n = candidates->count;
  ret->tag = SWITCHYARD_POLICY_TYPES_DECISION_CHOSEN;
  ret->val.chosen = 0;
  if (candidates->counts.len >= 8 * n && candidates->sizes.len >= 4 * n) {
    ret->val.chosen = least_load(n, candidates->counts.ptr + 6 * n, candidates->sizes.ptr + 2 * n);
  }
  router_packed_request_free(req);
  router_packed_workers_free(candidates);
}

void exports_router_observe(router_outcome_t *feedback) { router_outcome_free(feedback); }

double exports_router_queue_key(router_request_t *req) {
  // Higher priority first, as the Rust SDK's default.
  double key = -(double)req->priority;
  router_request_free(req);
  return key;
}

// WIT 1.1: least-load has no parameters, so it takes an empty list and refuses any other.
bool exports_router_configure(router_params_t *params, router_string_t *err) {
  bool empty = params->len == 0;
  router_params_free(params);
  if (!empty) {
    router_string_dup(err, "least-load-c takes no parameters");
  }
  return empty;
}

// WIT 1.1: no key of its own; the queue's configured order applies.
bool exports_router_queue_key_at(router_arriving_request_t *req, uint64_t arrival_ms,
                                 double *ret) {
  (void)arrival_ms;
  (void)ret;
  router_arriving_request_free(req);
  return false;
}
