#!/usr/bin/env bash
# A k0s management cluster on banlieue VMs, from nothing but this machine, a
# hypervisor (libvirt or vSphere) and Vault.
#
#   1. read the backend's credentials and k0s's join material from Vault;
#   2. write the bootstrap config: a Provider, a class, an image and COUNT
#      VirtualMachines whose cloud-init installs k0s — a controller (that also
#      runs workloads) on the first, workers joining with a pre-shared token on
#      the others;
#   3. `banlieue bootstrap` makes the VMs with a temporary control plane on this
#      machine and waits until they are Ready;
#   4. wait for the new cluster's API, install banlieue's CRDs and deploy/ in it;
#   5. `banlieue bootstrap --target-kubeconfig` moves banlieue's objects (and with
#      them the VMs) into the new cluster.
#
# Every step can be rerun: an interrupted run continues where it stopped and
# never makes a second set of VMs. Run with --help for the settings.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../../.." && pwd)"

usage() {
  cat <<'EOF'
Usage: deploy/bootstrap/k0s/bootstrap.sh --settings FILE [--dry-run] [--target-kubeconfig FILE]

Stands up a k0s management cluster on banlieue VMs and moves banlieue into it.

Options:
  --settings FILE           the settings (shell variables; see settings.example.env)
  --dry-run                 read Vault and write the bootstrap config, then print what
                            would run instead of running it (nothing is created)
  --target-kubeconfig FILE  the new cluster's kubeconfig; without it one is made from
                            the k0s CA in Vault for https://$CONTROLLER_ADDRESS:6443
  -h, --help                this text

Vault: VAULT_ADDR and VAULT_TOKEN (or a `bao`/`vault` CLI already logged in). The KV v2
secret at $VAULT_K0S_PATH holds k0s's join material, made beforehand with k0s itself:
  ca.crt, ca.key             the cluster CA (k0s uses a CA found in /var/lib/k0s/pki)
  worker-token               `k0s token pre-shared --role worker --cert ca.crt
                             --url https://$CONTROLLER_ADDRESS:6443/` (the token file)
  worker-token-secret        the Secret manifest that command writes beside the token
On vSphere, the KV v2 secret at $VAULT_VSPHERE_PATH holds username and password.
EOF
}

settings=""
dry_run=0
target_kubeconfig=""
while [ $# -gt 0 ]; do
  case "$1" in
    --settings) settings="${2:?--settings needs a file}"; shift 2 ;;
    --dry-run) dry_run=1; shift ;;
    --target-kubeconfig) target_kubeconfig="${2:?--target-kubeconfig needs a file}"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$settings" ] || { usage >&2; exit 2; }
[ -f "$settings" ] || { echo "settings file $settings does not exist" >&2; exit 2; }
# shellcheck source=settings.example.env
source "$settings"

die() { echo "bootstrap: $*" >&2; exit 1; }
need() { [ -n "${!1:-}" ] || die "setting $1 is required (see settings.example.env)"; }
say() { echo "==> $*"; }
# Run a command, or only print it on a dry run.
run() {
  if [ "$dry_run" = 1 ]; then echo "would run: $*"; else "$@"; fi
}

# Settings and their defaults.
: "${BACKEND:=}" "${COUNT:=3}" "${NAMESPACE:=management}" "${NAME_PREFIX:=mgmt}"
: "${CPUS:=2}" "${MEMORY_MIB:=4096}" "${DISK_GIB:=20}" "${POWER_OFF_TIMEOUT:=120}"
: "${VAULT_MOUNT:=secret}" "${DATA_DIR:=.k0s-bootstrap}" "${BANLIEUE:=banlieue}"
: "${K0S_URL:=}" "${API_TIMEOUT:=900}" "${VM_TIMEOUT:=1800}"
: "${PROVIDER_CLASS:=$BACKEND}" "${NODE_CLASS:=k0s-node}"
need BACKEND; need CONTROLLER_ADDRESS; need VAULT_K0S_PATH
[ "$COUNT" -ge 1 ] 2>/dev/null || die "COUNT must be a number >= 1, not '$COUNT'"
case "$BACKEND" in
  libvirt) need LIBVIRT_URI; need LIBVIRT_POOL; need LIBVIRT_NETWORK ;;
  vsphere) need VSPHERE_ENDPOINT; need VSPHERE_DATASTORE; need VSPHERE_NETWORK; need VAULT_VSPHERE_PATH ;;
  *) die "BACKEND must be libvirt or vsphere, not '$BACKEND'" ;;
esac
if [ -z "${IMAGE_URL:-}" ] && [ -z "${IMAGE_BACKING_FILE:-}" ] && [ -z "${IMAGE_TEMPLATE:-}" ]; then
  die "name the image: IMAGE_URL (+ IMAGE_SHA256), IMAGE_BACKING_FILE (libvirt) or IMAGE_TEMPLATE (vSphere)"
fi
[ -z "${IMAGE_URL:-}" ] || need IMAGE_SHA256

# Vault: the CLI that is there (OpenBao's `bao` or `vault`), KV v2 reads by field.
vault_cli=""
for c in bao vault; do command -v "$c" >/dev/null && { vault_cli="$c"; break; }; done
[ -n "$vault_cli" ] || die "neither the bao nor the vault CLI is installed"
# OpenBao's CLI reads BAO_*, Vault's reads VAULT_*: either pair works with either CLI.
for v in ADDR TOKEN CACERT; do
  b="BAO_$v" h="VAULT_$v"
  if [ -n "${!h:-}" ] && [ -z "${!b:-}" ]; then export "$b=${!h}"; fi
  if [ -n "${!b:-}" ] && [ -z "${!h:-}" ]; then export "$h=${!b}"; fi
done
vault_get() { # PATH KEY
  "$vault_cli" kv get -mount="$VAULT_MOUNT" -field="$2" "$1" 2>/dev/null \
    || die "cannot read key '$2' of $VAULT_MOUNT/$1 from Vault at ${VAULT_ADDR:-?} (is the path right, a KV v2 mount, and the token allowed to read it?)"
}

mkdir -p "$DATA_DIR"
chmod 700 "$DATA_DIR"
umask 077
say "reading k0s join material from Vault ($VAULT_MOUNT/$VAULT_K0S_PATH)"
ca_crt="$(vault_get "$VAULT_K0S_PATH" ca.crt)"
ca_key="$(vault_get "$VAULT_K0S_PATH" ca.key)"
worker_token="$(vault_get "$VAULT_K0S_PATH" worker-token)"
worker_token_secret="$(vault_get "$VAULT_K0S_PATH" worker-token-secret)"

# Text indented by N spaces (a YAML block scalar's body).
indent() { sed "s/^/$(printf '%*s' "$1" '')/"; }
b64() { base64 -w0; }

# How the k0s binary gets onto the VM: downloaded, or already in the image.
install_k0s() {
  if [ -n "$K0S_URL" ]; then
    printf '  - [sh, -c, "curl -sSLf --retry 5 -o /usr/local/bin/k0s %s && chmod 0755 /usr/local/bin/k0s"]\n' "$K0S_URL"
  else
    printf '  - [sh, -c, "command -v k0s || { echo k0s is not in the image and K0S_URL is not set >&2; exit 1; }"]\n'
  fi
}

# cloud-init of the first VM: the k0s controller, with the CA and the token's Secret in place.
controller_user_data() {
  cat <<EOF
#cloud-config
# banlieue k0s bootstrap: controller
write_files:
  - path: /var/lib/k0s/pki/ca.crt
    permissions: "0644"
    content: |
$(printf '%s\n' "$ca_crt" | indent 6)
  - path: /var/lib/k0s/pki/ca.key
    permissions: "0600"
    content: |
$(printf '%s\n' "$ca_key" | indent 6)
  - path: /var/lib/k0s/manifests/banlieue-bootstrap/worker-token-secret.yaml
    permissions: "0600"
    content: |
$(printf '%s\n' "$worker_token_secret" | indent 6)
runcmd:
$(install_k0s)
  - [k0s, install, controller, --enable-worker]
  - [k0s, start]
EOF
}

# cloud-init of the other VMs: k0s workers joining with the pre-shared token.
worker_user_data() {
  cat <<EOF
#cloud-config
# banlieue k0s bootstrap: worker
write_files:
  - path: /etc/k0s/join-token
    permissions: "0600"
    content: |
$(printf '%s\n' "$worker_token" | indent 6)
runcmd:
$(install_k0s)
  - [k0s, install, worker, --token-file, /etc/k0s/join-token]
  - [k0s, start]
EOF
}

# The Provider, its class and credentials, on the chosen backend.
provider_objects() {
  case "$BACKEND" in
    libvirt) cat <<EOF
apiVersion: banlieue.io/v1alpha1
kind: ProviderClass
metadata: {name: $PROVIDER_CLASS}
spec:
  component: {source: "builtin:provider-libvirt"}
  infrastructureKind: Libvirt
  capabilities: {libvirt: true}
---
apiVersion: banlieue.io/v1alpha1
kind: Provider
metadata: {name: bootstrap, namespace: $NAMESPACE}
spec:
  providerClassRef: {name: $PROVIDER_CLASS}
  connection: {endpoint: "$LIBVIRT_URI"}
  capabilities:
    storageClasses: {standard: "$LIBVIRT_POOL"}
    networkClasses: {default: "$LIBVIRT_NETWORK"}
EOF
    ;;
    vsphere)
      say "reading vSphere credentials from Vault ($VAULT_MOUNT/$VAULT_VSPHERE_PATH)" >&2
      local user pass
      user="$(vault_get "$VAULT_VSPHERE_PATH" username)"
      pass="$(vault_get "$VAULT_VSPHERE_PATH" password)"
      cat <<EOF
apiVersion: banlieue.io/v1alpha1
kind: ProviderClass
metadata: {name: $PROVIDER_CLASS}
spec:
  component: {source: "builtin:provider-vsphere"}
  infrastructureKind: VSphere
  imageFormat: vmdk
  capabilities: {http: true, secrets: true}
---
apiVersion: v1
kind: Secret
metadata: {name: bootstrap-credentials, namespace: $NAMESPACE}
data: {username: $(printf '%s' "$user" | b64), password: $(printf '%s' "$pass" | b64)}
---
apiVersion: banlieue.io/v1alpha1
kind: Provider
metadata: {name: bootstrap, namespace: $NAMESPACE}
spec:
  providerClassRef: {name: $PROVIDER_CLASS}
  connection:
    endpoint: "$VSPHERE_ENDPOINT"
    insecureSkipTLSVerify: ${VSPHERE_INSECURE:-false}
    credentialsRef: {kind: Secret, name: bootstrap-credentials, keys: [username, password]}
  capabilities:
    storageClasses: {standard: "$VSPHERE_DATASTORE"}
    networkClasses: {default: "$VSPHERE_NETWORK"}
EOF
    ;;
  esac
}

image_source() {
  if [ -n "${IMAGE_URL:-}" ]; then
    echo "{providerClass: $PROVIDER_CLASS, url: \"$IMAGE_URL\", checksum: \"sha256:$IMAGE_SHA256\"}"
  elif [ -n "${IMAGE_BACKING_FILE:-}" ]; then
    echo "{providerClass: $PROVIDER_CLASS, backingFile: \"$IMAGE_BACKING_FILE\"}"
  else
    echo "{providerClass: $PROVIDER_CLASS, template: \"$IMAGE_TEMPLATE\"}"
  fi
}

config="$DATA_DIR/bootstrap.yaml"
say "writing the bootstrap config $config ($COUNT VMs on $BACKEND)"
{
  provider_objects
  cat <<EOF
---
apiVersion: banlieue.io/v1alpha1
kind: VMClass
metadata: {name: $NODE_CLASS}
spec:
  cpus: $CPUS
  memoryMiB: $MEMORY_MIB
  powerOffTimeoutSeconds: $POWER_OFF_TIMEOUT
  disks: [{name: root, sizeGiB: $DISK_GIB, storageClass: standard}]
  nics: [{name: eth0, networkClass: default}]
---
apiVersion: banlieue.io/v1alpha1
kind: VMImage
metadata: {name: $NODE_CLASS}
spec:
  sources: [$(image_source)]
EOF
  for ((i = 0; i < COUNT; i++)); do
    name="$NAME_PREFIX-$i"
    if [ "$i" = 0 ]; then user_data="$(controller_user_data)"; role=controller; else user_data="$(worker_user_data)"; role=worker; fi
    cat <<EOF
---
apiVersion: v1
kind: Secret
metadata: {name: $name-user-data, namespace: $NAMESPACE}
data: {user-data: $(printf '%s\n' "$user_data" | b64)}
---
apiVersion: banlieue.io/v1alpha1
kind: VirtualMachine
metadata: {name: $name, namespace: $NAMESPACE, labels: {k0s.k0sproject.io/role: $role}}
spec:
  classRef: {name: $NODE_CLASS}
  imageRef: {name: $NODE_CLASS}
  placement: {providerRef: {name: bootstrap}}
  userData: {name: $name-user-data, key: user-data}
EOF
  done
} > "$config"

bootstrap_args=(bootstrap --config "$config" --data-dir "$DATA_DIR/control-plane" --timeout "$VM_TIMEOUT")
[ -z "${BANLIEUE_BUILTIN_DIR:-}" ] || bootstrap_args+=(--builtin-dir "$BANLIEUE_BUILTIN_DIR")

say "making the VMs with a temporary control plane (banlieue bootstrap)"
run "$BANLIEUE" "${bootstrap_args[@]}"

# The new cluster's kubeconfig: given, or an admin client certificate signed by the k0s CA.
if [ -z "$target_kubeconfig" ]; then
  target_kubeconfig="$DATA_DIR/k0s.kubeconfig"
  say "writing an admin kubeconfig for https://$CONTROLLER_ADDRESS:6443 ($target_kubeconfig)"
  pki="$DATA_DIR/pki"
  mkdir -p "$pki"
  printf '%s\n' "$ca_crt" > "$pki/ca.crt"
  printf '%s\n' "$ca_key" > "$pki/ca.key"
  openssl req -new -newkey rsa:2048 -nodes -keyout "$pki/admin.key" -subj "/O=system:masters/CN=banlieue-bootstrap" -out "$pki/admin.csr" 2>/dev/null
  openssl x509 -req -in "$pki/admin.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial -days 1 -out "$pki/admin.crt" 2>/dev/null
  rm -f "$pki/ca.key"
  KUBECONFIG="$target_kubeconfig" kubectl config set-cluster k0s --server "https://$CONTROLLER_ADDRESS:6443" --certificate-authority "$pki/ca.crt" --embed-certs >/dev/null
  KUBECONFIG="$target_kubeconfig" kubectl config set-credentials admin --client-certificate "$pki/admin.crt" --client-key "$pki/admin.key" --embed-certs >/dev/null
  KUBECONFIG="$target_kubeconfig" kubectl config set-context k0s --cluster k0s --user admin >/dev/null
  KUBECONFIG="$target_kubeconfig" kubectl config use-context k0s >/dev/null
fi

say "waiting (at most ${API_TIMEOUT}s) for the new cluster's API"
if [ "$dry_run" = 1 ]; then
  echo "would wait for: kubectl --kubeconfig $target_kubeconfig version"
else
  deadline=$(( $(date +%s) + API_TIMEOUT ))
  until kubectl --kubeconfig "$target_kubeconfig" --request-timeout 10s version >/dev/null 2>&1; do
    [ "$(date +%s)" -lt "$deadline" ] || die "the new cluster's API did not answer within ${API_TIMEOUT}s (kubeconfig $target_kubeconfig); the VMs are made: rerun to continue"
    sleep 5
  done
fi

say "installing banlieue's CRDs and deploy/ into the new cluster"
run kubectl --kubeconfig "$target_kubeconfig" apply --server-side --force-conflicts -k "$repo/deploy"

say "moving banlieue's objects into the new cluster"
run "$BANLIEUE" "${bootstrap_args[@]}" --target-kubeconfig "$target_kubeconfig"
say "done: the management cluster's banlieue owns the VMs (namespace $NAMESPACE)"
