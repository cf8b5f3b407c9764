package baseimage

import _ "embed"

// The entrypoints of the database servers' stand-ins, as the official images
// have them at /usr/local/bin/docker-entrypoint.sh: what the managed databases'
// servers are started with (deployer/databases).
var (
	//go:embed postgres-entrypoint.sh
	postgresEntrypoint string
	//go:embed redis-entrypoint.sh
	redisEntrypoint string
)

// installEntrypoint is the hook that writes script as the image's
// /usr/local/bin/docker-entrypoint.sh. The script is part of the hook, and so of
// the image's key: a change to it builds the image again.
func installEntrypoint(script string) string {
	return `mkdir -p "$1/usr/local/bin" && printf '%s' ` + shellQuote(script) +
		` >"$1/usr/local/bin/docker-entrypoint.sh" && chmod 755 "$1/usr/local/bin/docker-entrypoint.sh"`
}

// postgresStandIn is as postgres:15: Debian's PostgreSQL 15, server and client
// programs first on PATH (the real psql, not Debian's wrapper that picks a
// cluster), the postgres user, and the entrypoint. Not the official image:
// Debian's build (its 15.x, its paths), and no JIT compilation.
func postgresStandIn() standIn {
	return standIn{
		kind:     "postgres",
		packages: []string{"postgresql-15"},
		essentialHooks: []string{
			// Debian's postgresql-15 makes a cluster (/var/lib/postgresql/15/main)
			// when it is installed unless told not to: the image would hold a
			// database nobody uses, as the official image avoids the same way.
			`mkdir -p "$1/etc/postgresql-common" && echo 'create_main_cluster = false' >"$1/etc/postgresql-common/createcluster.conf"`,
			// No JIT: LLVM and the Z3 it links with would be 130 MB of an
			// image of 330, and a server without its JIT provider (llvmjit.so)
			// runs every query without JIT instead of failing it. dpkg leaves
			// the files out; the packages stay installed.
			`mkdir -p "$1/etc/dpkg/dpkg.cfg.d" && printf 'path-exclude=%s\n' '/usr/lib/postgresql/15/lib/llvmjit*' '/usr/lib/postgresql/15/lib/bitcode/*' '/usr/lib/*/libLLVM-14.so*' '/usr/lib/llvm-14/*' '/usr/lib/*/libz3.so*' >"$1/etc/dpkg/dpkg.cfg.d/bex-no-jit"`,
		},
		hooks: []string{
			installEntrypoint(postgresEntrypoint),
			// The volume's mount point, as the official image has it.
			`mkdir -p "$1/var/lib/postgresql/data"`,
		},
		env: []string{
			"PATH=/usr/lib/postgresql/15/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
			"LANG=C.UTF-8", "PG_MAJOR=15", "PGDATA=/var/lib/postgresql/data",
		},
		cmd: []string{"docker-entrypoint.sh", "postgres"},
		// As the official image: SIGINT is the fast shutdown, which ends the
		// sessions; SIGTERM waits for every client to leave.
		stopSignal: "SIGINT",
	}
}

// redisStandIn is as redis:7: Debian's redis-server and redis-cli, the redis
// user, /data as the working directory, and the entrypoint. Debian's Redis 7.0.
func redisStandIn() standIn {
	return standIn{
		kind:     "redis",
		packages: []string{"redis-server", "redis-tools"},
		hooks: []string{
			installEntrypoint(redisEntrypoint),
			`mkdir -p "$1/data" && chroot "$1" chown redis:redis /data`,
		},
		env:     []string{basePath},
		workdir: "/data",
		cmd:     []string{"docker-entrypoint.sh", "redis-server"},
	}
}
