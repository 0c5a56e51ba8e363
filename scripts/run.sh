#!/usr/bin/env bash
# Sets up a fresh Debian/Ubuntu machine (as root) and starts Warren.
#
# Today this is the guest agent on its own (the E2B envd protocol on port 49983, usable with the
# SDK's debug mode); the control plane (`warren serve`) replaces it here when it lands.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

./scripts/setup.sh
listen="${WARREN_AGENT_LISTEN:-127.0.0.1:49983}"
echo "Warren agent listening on http://$listen (Ctrl-C stops it)"
exec ./target/release/warren-agent --listen "$listen" "$@"
