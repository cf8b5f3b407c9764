#!/usr/bin/env bash
# `make run`: starts bex on this machine with development defaults (unprivileged
# ports, apps at https://<app>.localhost:8443, state in .state/). hack/tools.sh and
# `make build` have run before this.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

bin/bex version
if ! bin/bex up --help >/dev/null 2>&1; then
	cat <<'MSG'

bex is built (bin/bex) and its daemons are ready in bin/, but `bex up` — the command
that runs the whole platform on this machine — is not there yet: it arrives with the
issue "One machine, one command". Until then, `make test` exercises every part that
exists against real daemons. See docs/architecture.md for what is built so far.
MSG
	exit 0
fi

mkdir -p .state
echo "==> starting bex up (state in .state/, Ctrl-C stops everything)"
exec bin/bex up \
	--state-dir "$root/.state" \
	--ssh-addr 127.0.0.1:2222 \
	--http-addr 127.0.0.1:8080 \
	--https-addr 127.0.0.1:8443 \
	--base-domain localhost
