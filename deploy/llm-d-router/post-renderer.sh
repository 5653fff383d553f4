#!/bin/sh
# Helm post-renderer (step 2 of 2, after values-ditto.yaml): reads the router chart's rendered
# manifests on stdin and writes them with ditto in the EPP's pod, through the kustomize
# component deploy/components/ditto-epp-sidecar. Arguments add the optional components:
# `podmonitor` (deploy/components/ditto-podmonitor: Prometheus scrapes ditto) and
# `cluster-config` (deploy/components/ditto-cluster-config: ditto reads a cluster YAML from
# the release's plugin ConfigMap). Needs `kubectl` (kustomize v5, kubectl 1.27+) or
# `kustomize` on PATH.
#
#   helm upgrade --install <release> <router chart> -n <namespace> \
#     -f your-values.yaml -f deploy/llm-d-router/values-ditto.yaml \
#     --post-renderer deploy/llm-d-router/post-renderer.sh [--post-renderer-args podmonitor ...]
#
# Without Helm's --post-renderer: helm template ... | deploy/llm-d-router/post-renderer.sh
set -eu
# The script's own directory, symlinks resolved (a Helm plugin directory may be one).
here=$(cd "$(dirname "$0")" && pwd -P)
components=$(cd "$here/../components" && pwd -P)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT INT TERM
cat >"$work/rendered.yaml"
# kustomize takes components by relative path only.
relative() {
  python3 -c 'import os, sys; print(os.path.relpath(sys.argv[1], sys.argv[2]))' "$1" "$work" 2>/dev/null \
    || realpath --relative-to="$work" "$1"
}
{
  echo "apiVersion: kustomize.config.k8s.io/v1beta1"
  echo "kind: Kustomization"
  echo "resources: [rendered.yaml]"
  echo "components:"
  echo "  - $(relative "$components/ditto-epp-sidecar")"
  for option in "$@"; do
    case "$option" in
      podmonitor) echo "  - $(relative "$components/ditto-podmonitor")" ;;
      cluster-config) echo "  - $(relative "$components/ditto-cluster-config")" ;;
      *) echo "post-renderer.sh: unknown argument '$option' (known: podmonitor, cluster-config)" >&2; exit 2 ;;
    esac
  done
} >"$work/kustomization.yaml"
if command -v kustomize >/dev/null 2>&1; then
  kustomize build "$work"
else
  kubectl kustomize "$work"
fi
