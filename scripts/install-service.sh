#!/usr/bin/env bash
# Installs the built Warren as a systemd service (run as root, after ./scripts/setup.sh or
# ./scripts/run.sh built it): the binaries under /usr/local/lib/warren (warren linked into
# /usr/local/bin), the unit /etc/systemd/system/warren.service, and the flags file
# /etc/warren/warren.env (written once, never overwritten). Then enables and (re)starts the
# service where systemd runs.
#
# An upgrade is the same command after a new build: the service stops (sandboxes keep running:
# KillMode=process), the binaries are replaced, and the new server takes the sandboxes back.
#
# ROOT=<dir> installs into <dir> instead of / and starts nothing (for packaging and tests).
set -euo pipefail
cd "$(dirname "$0")/.."

root="${ROOT:-}"
log() { printf '\033[1m==> %s\033[0m\n' "$*"; }

bins=(warren warren-agent warren-agent-static warren-nsinit warren-nfsd warren-vminit)
for b in "${bins[@]}"; do
  [ -x "target/release/$b" ] || { echo "target/release/$b is missing: run ./scripts/setup.sh first" >&2; exit 1; }
done

running=""
if [ -z "$root" ] && [ -d /run/systemd/system ] && systemctl is-active --quiet warren 2>/dev/null; then
  running=1
  log "stopping warren (its sandboxes keep running and are taken back at the start)"
  systemctl stop warren
fi

log "installing the binaries into $root/usr/local/lib/warren"
install -d -m 0755 "$root/usr/local/lib/warren" "$root/usr/local/bin"
for b in "${bins[@]}"; do
  # Beside each other: the server finds its agent, nsinit and helpers next to itself. A new
  # file renamed over the old one, so a running binary is never written to.
  install -m 0755 "target/release/$b" "$root/usr/local/lib/warren/.$b.new"
  mv -f "$root/usr/local/lib/warren/.$b.new" "$root/usr/local/lib/warren/$b"
done
ln -sfn /usr/local/lib/warren/warren "$root/usr/local/bin/warren"

install -d -m 0755 "$root/usr/local/share/doc/warren"
install -m 0644 docs/operations.md "$root/usr/local/share/doc/warren/operations.md"
install -d -m 0755 "$root/etc/systemd/system"
install -m 0644 deploy/warren.service "$root/etc/systemd/system/warren.service"
install -d -m 0700 "$root/etc/warren"
if [ ! -e "$root/etc/warren/warren.env" ]; then
  log "writing $root/etc/warren/warren.env (the service's flags; edit, then systemctl restart warren)"
  cat >"$root/etc/warren/warren.env" <<'ENV'
# Flags of `warren serve` for the service (`warren serve --help` lists them all).
WARREN_ARGS=--listen 127.0.0.1:3000 --data-dir /var/lib/warren
# WARREN_API_KEY=... seeds a known API key; otherwise the first start saves one to
# /var/lib/warren/api-key (root only).
ENV
  chmod 0600 "$root/etc/warren/warren.env"
fi

if [ -n "$root" ]; then
  log "installed under $root; nothing started"
elif [ -d /run/systemd/system ]; then
  systemctl daemon-reload
  systemctl enable warren >/dev/null
  log "starting warren${running:+ again}"
  systemctl start warren
  systemctl --no-pager --lines=0 status warren || true
else
  log "installed; systemd is not running here: start it with 'warren serve \$WARREN_ARGS' from /etc/warren/warren.env"
fi
