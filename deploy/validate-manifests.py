#!/usr/bin/env python3
"""Validates Kubernetes manifests (deploy/check.sh runs it on `kubectl kustomize` output).

    validate-manifests.py KUBERNETES_VERSION FILE...

Built-in kinds are validated with kubernetes-validate against that version's OpenAPI schemas,
strictly (an unknown field is an error, as `kubectl apply --validate=strict` makes it). Custom
resources have no built-in schema; the ones we use (KNOWN_CRDS) are checked here for the fields
their API reference requires and allows, nothing more (no CEL rules, no defaults). Any other kind
without a schema is an error: it is most likely a misspelled kind or apiVersion.
"""

import sys

import kubernetes_validate
import yaml

PORT = {"number": int}

# Shapes of the custom resources we write: a dict maps allowed keys to shapes (keys ending in
# "?" optional), a list [shape] is a non-empty list of that shape, a type or a set of allowed
# values is a leaf.
KNOWN_CRDS = {
    # Gateway API Inference Extension, inference.networking.k8s.io/v1 (deploy/k8s/epp/).
    ("inference.networking.k8s.io/v1", "InferencePool"): {
        "selector": {"matchLabels": dict},
        "targetPorts": [PORT],
        "endpointPickerRef": {
            "group?": str,
            "kind?": str,
            "name": str,
            "port?": PORT,
            "failureMode?": {"FailOpen", "FailClose"},
        },
    },
    # Gateway API, gateway.networking.k8s.io/v1 (deploy/k8s/epp/).
    ("gateway.networking.k8s.io/v1", "HTTPRoute"): {
        "parentRefs": [{"group?": str, "kind?": str, "name": str, "namespace?": str,
                        "sectionName?": str, "port?": int}],
        "hostnames?": [str],
        "rules?": [{
            "name?": str,
            "matches?": [dict],
            "filters?": [dict],
            "backendRefs?": [{"group?": str, "kind?": str, "name": str, "namespace?": str,
                              "port?": int, "weight?": int}],
            "timeouts?": {"request?": str, "backendRequest?": str},
        }],
    },
}


def check_shape(value, shape, where):
    """Errors of `value` against `shape`, as strings."""
    if isinstance(shape, dict):
        if not isinstance(value, dict):
            return [f"{where}: expected a mapping"]
        errors = []
        keys = {k.rstrip("?"): k.endswith("?") for k in shape}
        for key, optional in keys.items():
            if key not in value and not optional:
                errors.append(f"{where}.{key}: required")
        for key, item in value.items():
            if key not in keys:
                errors.append(f"{where}.{key}: unknown field")
            else:
                sub = shape[key + "?"] if keys[key] else shape[key]
                errors += check_shape(item, sub, f"{where}.{key}")
        return errors
    if isinstance(shape, list):
        if not isinstance(value, list) or not value:
            return [f"{where}: expected a non-empty list"]
        return [e for i, item in enumerate(value) for e in check_shape(item, shape[0], f"{where}[{i}]")]
    if isinstance(shape, set):
        return [] if value in shape else [f"{where}: {value!r} is not one of {sorted(shape)}"]
    if shape is dict and isinstance(value, dict) and not value:
        return [f"{where}: empty"]
    if shape is int and isinstance(value, bool):
        return [f"{where}: expected int"]
    return [] if isinstance(value, shape) else [f"{where}: expected {shape.__name__}"]


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    version, files = sys.argv[1], sys.argv[2:]
    failed = 0
    for path in files:
        with open(path) as f:
            docs = [d for d in yaml.safe_load_all(f) if d is not None]
        if not docs:
            print(f"FAIL {path}: no resources")
            failed += 1
        for doc in docs:
            name = f"{path}: {doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
            try:
                kubernetes_validate.validate(doc, version, strict=True)
                print(f"ok   {name} (Kubernetes {version} schema, strict)")
            except kubernetes_validate.SchemaNotFoundError:
                shape = KNOWN_CRDS.get((doc.get("apiVersion"), doc.get("kind")))
                if shape is None:
                    print(f"FAIL {name}: no schema for {doc.get('apiVersion')} {doc.get('kind')} "
                          f"(misspelled, or a custom resource this script does not know)")
                    failed += 1
                    continue
                errors = check_shape(doc.get("spec"), shape, "spec")
                if not isinstance(doc.get("metadata", {}).get("name"), str):
                    errors.append("metadata.name: required")
                for error in errors:
                    print(f"FAIL {name}: {error}")
                failed += bool(errors)
                if not errors:
                    print(f"ok   {name} (custom resource: required and known fields only; "
                          f"no CRD schema here)")
            except kubernetes_validate.ValidationError as e:
                print(f"FAIL {name}: {e.message} at {'.'.join(map(str, e.path))}")
                failed += 1
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
