// least-load in JavaScript: the candidate with the fewest requests in flight, then the fewest
// decode blocks; the first one on a full tie. Same policy as policies/least-load (Rust) and the
// C and Python examples: the conformance suite checks that they all decide alike.
//
// Bindings (componentize-js): records are objects with camelCase fields; list<u32> arrives as a
// Uint32Array and list<u64> as a BigUint64Array (u64 values are BigInt); variants are
// { tag, val }.

export function metadata() {
  return {
    name: "least-load-js",
    version: "1.0.0",
    worldName: "router",
    witVersion: "1.3.0",
    description: "Fewest active requests, then fewest decode blocks (JavaScript)",
    extensions: [],
  };
}

// The first of `n` candidates with the fewest requests, then the fewest decode blocks; `requests`
// and `decode` are read from `requestsAt` and `decodeAt` on.
function leastLoad(n, requests, decode, requestsAt = 0, decodeAt = 0) {
  let best = 0;
  for (let i = 1; i < n; i++) {
    const r = requests[requestsAt + i];
    const rb = requests[requestsAt + best];
    if (r < rb || (r === rb && decode[decodeAt + i] < decode[decodeAt + best])) {
      best = i;
    }
  }
  return best;
}

export function route(req, candidates) {
  const requests = candidates.activeRequests;
  const decode = candidates.activeDecodeBlocks;
  const n = Math.min(requests.length, decode.length);
  return { tag: "chosen", val: leastLoad(n, requests, decode) };
}

// WIT 1.2: the same decision over the packed columns (`activeRequests` is the seventh column of
// `counts`, `activeDecodeBlocks` the third of `sizes`).
export function routePacked(req, candidates) {
  const n = candidates.count;
  if (candidates.counts.length < 8 * n || candidates.sizes.length < 4 * n) {
    return { tag: "chosen", val: 0 };
  }
  return { tag: "chosen", val: leastLoad(n, candidates.counts, candidates.sizes, 6 * n, 2 * n) };
}

export function observe(_outcome) {}

// Higher priority first, as the Rust SDK's default.
export function queueKey(req) {
  return -req.priority;
}

// WIT 1.1: least-load has no parameters, so it takes an empty list and refuses any other (a
// thrown value is the result's error).
export function configure(params) {
  if (params.length > 0) {
    throw "least-load-js takes no parameters";
  }
}

// WIT 1.1: no key of its own (`undefined` is `none`); the queue's configured order applies.
export function queueKeyAt(_req, _arrivalMs) {
  return undefined;
}
