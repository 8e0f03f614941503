#!/usr/bin/env bash
# Check the Kubernetes manifests of deploy/kubernetes against the API schemas of each
# Kubernetes version in K8S_VERSIONS (default 1.34 to 1.37), with kubernetes-validate
# --strict (a field the schema does not know is an error), offline: no cluster is needed.
#
#   scripts/k8s-validate.sh [DIR]        (DIR: default deploy/kubernetes)
#
# Fails (exit 1) on any error, and also on what kubernetes-validate itself lets pass with a
# warning: a kind it has no schema for (a typo in kind or apiVersion), a version it has no
# schemas for (it would fall back to an older one). kustomization.yaml has no schema; it is
# checked instead to list every manifest of DIR and nothing else.
set -euo pipefail
cd "$(dirname "$0")/.."

dir=${1:-deploy/kubernetes}
versions=${K8S_VERSIONS:-1.34 1.35 1.36 1.37}
py=.venv/bin/python
validate=.venv/bin/kubernetes-validate

fail() {
  echo "k8s-validate: FAILED: $*" >&2
  exit 1
}

[[ -x $validate ]] || fail "$validate is missing: install the dev tools (scripts/bootstrap.sh, or uv sync --all-extras --group dev)"
[[ -d $dir ]] || fail "no directory $dir (a path from the repository's root)"
[[ -n ${versions// /} ]] || fail "K8S_VERSIONS is empty: name the versions, e.g. K8S_VERSIONS='1.36 1.37'"

# The exact versions the installed kubernetes-validate carries strict schemas for (it has no
# network; asked for a version it lacks, it quietly uses the newest older one).
have=$("$py" - <<'EOF'
import importlib.resources

root = importlib.resources.files("kubernetes_validate") / "kubernetes-json-schema"
names = [p.name for p in root.iterdir()]
strict = [n[1:].removesuffix("-local-strict") for n in names if n.endswith("-local-strict")]
print(" ".join(sorted(strict, key=lambda v: tuple(int(x) for x in v.split(".")))))
EOF
)
for v in $versions; do
  [[ " $have " == *" $v.0 "* ]] ||
    fail "kubernetes-validate $("$validate" --version) has no schemas for Kubernetes $v (it has: $have); upgrade it in pyproject.toml"
done

manifests=()
for f in "$dir"/*.yaml; do
  [[ $(basename "$f") == kustomization.yaml ]] || manifests+=("$f")
done
((${#manifests[@]} > 0)) || fail "no manifests (*.yaml) in $dir"

# kustomization.yaml: every manifest listed, every listed file present.
"$py" - "$dir" "${manifests[@]}" <<'EOF' || fail "$dir/kustomization.yaml does not match the manifests of $dir"
import sys
from pathlib import Path

import yaml

root = Path(sys.argv[1])
kust = yaml.safe_load((root / "kustomization.yaml").read_text())
listed = set(kust.get("resources") or [])
present = {Path(p).name for p in sys.argv[2:]}
bad = False
for name in sorted(present - listed):
    print(f"k8s-validate: {root}/{name} is not listed in resources of kustomization.yaml", file=sys.stderr)
    bad = True
for name in sorted(listed - present):
    print(f"k8s-validate: kustomization.yaml lists {name}, which is not in {root}", file=sys.stderr)
    bad = True
sys.exit(1 if bad else 0)
EOF

checks=0
for v in $versions; do
  set +e
  out=$("$validate" --strict -k "$v" "${manifests[@]}" 2>&1)
  rc=$?
  set -e
  problems=$(grep -v '^INFO ' <<<"$out" || true)
  if ((rc != 0)) || [[ -n $problems ]]; then
    echo "$problems" >&2
    fail "the manifests of $dir do not validate against Kubernetes $v (--strict)"
  fi
  # Each resource passes against exactly the version asked for, not an older schema.
  n=$(grep -c "^INFO .* passed for resource .* against version $v\$" <<<"$out" || true)
  all=$(grep -c '^INFO ' <<<"$out" || true)
  ((n == all && n > 0)) || fail "Kubernetes $v: $n of $all resources checked against $v itself"
  checks=$((checks + n))
  resources=$n
done

nversions=$(wc -w <<<"$versions")
echo "k8s-validate: $resources resources in ${#manifests[@]} files passed --strict against" \
  "Kubernetes $(tr ' ' ',' <<<"$versions" | sed 's/,/, /g') ($checks checks); kustomization.yaml lists them all"
((checks == resources * nversions)) || fail "expected $((resources * nversions)) checks, made $checks"
