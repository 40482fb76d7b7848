#!/usr/bin/env bash
# The Ray cluster launcher path of docs/cluster.md, on one machine: ray_cluster.yaml's three
# nodes (127.0.0.1, .2, .3) reached over SSH as the user `ercluster`.
#
#   sudo tests/cluster/launcher.sh setup      sshd on 127.0.0.1-3 (private config and keys,
#                                             its own PID file), the user, the key, the token
#   sudo tests/cluster/launcher.sh teardown   stop that sshd (by its PID) and the user's
#                                             processes (by PID); --purge also removes the user
#   sudo tests/cluster/launcher.sh test       setup, ray up, ray submit of a job that drains a
#                                             backlog (each message handled once, on 3 nodes),
#                                             ray down, teardown. Run by .ci/run.
#
# `ray up` / `ray down` stop Ray processes: this refuses to run while Ray processes of other
# users (or other clusters) run on the machine. Where it cannot run at all (not root, no
# apt-get) it says so and exits 0: skipped, never silently.
set -euo pipefail
cd "$(dirname "$0")/../.."

CLUSTER_USER=ercluster
STATE=/tmp/er-launcher
INVOKER=${SUDO_USER:-$(id -un)}
INVOKER_HOME=$(getent passwd "$INVOKER" | cut -d: -f6)
KEY=$INVOKER_HOME/.ssh/endpoint_runtime_cluster
RAY_BIN=$(pwd)/.venv/bin
MESSAGES=${LAUNCHER_MESSAGES:-600}

say() { echo "launcher: $*" >&2; }
# The invoking user (behind sudo, or root itself); runuser ships with util-linux, sudo may not.
as_invoker() {
  if [ "$INVOKER" = "$(id -un)" ]; then "$@"; else runuser -u "$INVOKER" -- "$@"; fi
}

skip_reason() {
  if [ "$(id -u)" != 0 ]; then echo "not root (installing and starting sshd needs root)"; return; fi
  if ! command -v apt-get >/dev/null; then echo "no apt-get to install openssh-server"; return; fi
  if [ ! -x "$RAY_BIN/ray" ]; then echo "no .venv (run bin/dev test first)"; return; fi
  echo ""
}

setup() {
  if ! [ -x /usr/sbin/sshd ] || ! command -v rsync >/dev/null; then
    say "installing openssh-server and rsync"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssh-server rsync >/dev/null \
      || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
           apt-get install -y -qq openssh-server rsync >/dev/null; }
  fi
  if ss -ltn | grep -qE '(0\.0\.0\.0|\*|127\.0\.0\.[123]):22\b' \
      && ! [ -f "$STATE/sshd.pid" ]; then
    say "port 22 of 127.0.0.1-3 is taken (a system sshd?): stop it or use real machines"
    exit 1
  fi
  if ! id "$CLUSTER_USER" >/dev/null 2>&1; then
    useradd --create-home --shell /bin/bash "$CLUSTER_USER"
  fi
  usermod -p '*' "$CLUSTER_USER"  # no password, but not locked: sshd refuses locked accounts
  mkdir -p "$STATE" /run/sshd "$INVOKER_HOME/.ssh"
  [ -f "$STATE/host_key" ] || ssh-keygen -q -t ed25519 -N '' -f "$STATE/host_key"
  [ -f "$KEY" ] || ssh-keygen -q -t ed25519 -N '' -C endpoint-runtime-cluster -f "$KEY"
  chown "$INVOKER" "$KEY" "$KEY.pub"
  cp "$KEY.pub" "$STATE/authorized_keys"
  cat > "$STATE/sshd_config" <<EOF
Port 22
ListenAddress 127.0.0.1
ListenAddress 127.0.0.2
ListenAddress 127.0.0.3
HostKey $STATE/host_key
PidFile $STATE/sshd.pid
AuthorizedKeysFile $STATE/authorized_keys
AllowUsers $CLUSTER_USER
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin no
UsePAM no
StrictModes no
Subsystem sftp internal-sftp
EOF
  if ! { [ -f "$STATE/sshd.pid" ] && kill -0 "$(cat "$STATE/sshd.pid")" 2>/dev/null; }; then
    /usr/sbin/sshd -f "$STATE/sshd_config"
    for _ in $(seq 50); do [ -s "$STATE/sshd.pid" ] && break; sleep 0.1; done
    say "sshd started on 127.0.0.1-3 (pid $(cat "$STATE/sshd.pid"))"
  fi
  # The local provider's node state, written by `ray up` (run by the invoking user) and then
  # by the head's autoscaler (the cluster user): on one machine both use these two files.
  [ -d /tmp/ray ] || install -d -m 1777 /tmp/ray
  [ -s /tmp/ray/cluster-endpoint-runtime.state ] \
    || echo '{}' > /tmp/ray/cluster-endpoint-runtime.state  # the provider reads it as JSON
  touch /tmp/ray/cluster-endpoint-runtime.lock
  chmod 666 /tmp/ray/cluster-endpoint-runtime.lock /tmp/ray/cluster-endpoint-runtime.state
  # Token authentication: every node gets this file (file_mounts). Never replace an
  # existing token: Ray clusters already running on this machine use it.
  if [ ! -f "$INVOKER_HOME/.ray/auth_token" ]; then
    as_invoker env RAY_AUTH_MODE=token "$RAY_BIN/ray" get-auth-token --generate >/dev/null
  fi
  for host in 127.0.0.1 127.0.0.2 127.0.0.3; do
    ssh -i "$KEY" -o BatchMode=yes -o StrictHostKeyChecking=no \
      -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR "$CLUSTER_USER@$host" true
  done
  say "ssh to $CLUSTER_USER@127.0.0.1-3 works (key $KEY)"
}

teardown() {
  if [ -f "$STATE/sshd.pid" ]; then
    local pid
    pid=$(cat "$STATE/sshd.pid")
    kill "$pid" 2>/dev/null || true
    say "sshd stopped (pid $pid)"
  fi
  if id "$CLUSTER_USER" >/dev/null 2>&1; then
    # The cluster user's processes (Ray, the embedded PostgreSQL), each by its PID.
    for pid in $(pgrep -u "$CLUSTER_USER" || true); do kill "$pid" 2>/dev/null || true; done
    sleep 2
    for pid in $(pgrep -u "$CLUSTER_USER" || true); do kill -9 "$pid" 2>/dev/null || true; done
  fi
  rm -rf "$STATE" /tmp/ray/cluster-endpoint-runtime.* /tmp/ray_ssh_* "/tmp/ray-$CLUSTER_USER"
  if [ "${1:-}" = --purge ] && id "$CLUSTER_USER" >/dev/null 2>&1; then
    userdel --remove "$CLUSTER_USER" 2>/dev/null || true
    say "user $CLUSTER_USER removed"
  fi
}

run_test() {
  local reason others started
  reason=$(skip_reason)
  if [ -n "$reason" ]; then
    echo "SKIPPED: launcher test (ray up / ray submit / ray down): $reason"
    return 0
  fi
  # A test session's local Ray takes a few seconds to end after its last test: wait for it.
  for _ in $(seq 60); do
    others=$(pgrep -af 'raylet|gcs_server' || true)
    [ -z "$others" ] && break
    sleep 1
  done
  if [ -n "$others" ]; then
    say "refusing: Ray runs on this machine and ray up/down could stop it:"
    echo "$others" | cut -c1-160 >&2
    return 1
  fi
  started=$(date +%s)
  # LAUNCHER_KEEP_USER=1 keeps the user and its virtualenv for a faster next run.
  if [ "${LAUNCHER_KEEP_USER:-}" = 1 ]; then trap 'teardown' EXIT; else trap 'teardown --purge' EXIT; fi
  setup
  export PATH="$RAY_BIN:$PATH" RAY_AUTH_MODE=token
  say "ray up"
  ray up -y --no-config-cache ray_cluster.yaml >"$STATE/up.log" 2>&1 \
    || { tail -40 "$STATE/up.log" >&2; say "ray up failed"; return 1; }
  say "ray up done after $(( $(date +%s) - started )) s; ray submit"
  local status=0
  ray submit --no-config-cache ray_cluster.yaml tests/cluster/launcher_job.py -- "$MESSAGES" \
    >"$STATE/submit.log" 2>&1 || status=$?
  grep -E '^(node |ran |launcher job|handled rows)' "$STATE/submit.log" >&2 || true
  if [ "$status" != 0 ]; then tail -60 "$STATE/submit.log" >&2; fi
  # Ray Jobs on the same cluster (its dashboard on the head, token auth): a job sees 3 nodes.
  if [ "$status" = 0 ]; then
    ray job submit --address http://127.0.0.1:8265 -- python -c \
      'import ray; ray.init(); print("job sees", sum(n["Alive"] for n in ray.nodes()), "nodes")' \
      >"$STATE/job.log" 2>&1 || status=$?
    grep -q "job sees 3 nodes" "$STATE/job.log" || { tail -20 "$STATE/job.log" >&2; status=1; }
    grep "job sees" "$STATE/job.log" >&2 || true
  fi
  ray exec --no-config-cache ray_cluster.yaml 'endpoint-runtime db stop' >/dev/null 2>&1 || true
  say "ray down"
  ray down -y ray_cluster.yaml >"$STATE/down.log" 2>&1 \
    || { tail -20 "$STATE/down.log" >&2; status=1; }
  say "$( [ "$status" = 0 ] && echo PASSED || echo FAILED ) in $(( $(date +%s) - started )) s"
  return "$status"
}

case "${1:-test}" in
  setup)
    reason=$(skip_reason); [ -z "$reason" ] || { say "cannot set up: $reason"; exit 1; }
    setup ;;
  teardown) teardown "${2:-}" ;;
  test) run_test ;;
  *) echo "usage: $0 [setup|teardown [--purge]|test]" >&2; exit 2 ;;
esac
