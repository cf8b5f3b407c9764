#!/bin/sh
# docker-entrypoint.sh of the Postgres stand-in: what the official postgres
# image's entrypoint does for a server started as
#
#	docker-entrypoint.sh postgres [server options]
#
# with POSTGRES_USER, POSTGRES_PASSWORD, POSTGRES_DB and PGDATA in the
# environment: the first start initialises PGDATA (initdb, pg_hba.conf, the
# database), and every start runs the server as the postgres user. Any other
# command runs as it is given (psql, pg_dump, pg_restore in one-offs).
set -eu

if [ $# -eq 0 ]; then
	set -- postgres
fi
# Options alone are the server's, as the official image takes them.
case $1 in
-*) set -- postgres "$@" ;;
esac
if [ "$1" != postgres ]; then
	exec "$@"
fi

PGDATA=${PGDATA:-/var/lib/postgresql/data}
export PGDATA

# run_as_postgres runs a command as the postgres user and its groups: setpriv
# drops root's capabilities with the uid. Started as another user, the
# commands run as that one (and the directories must be its already).
run_as_postgres() {
	if [ "$(id -u)" = 0 ]; then
		HOME=/var/lib/postgresql setpriv --reuid=postgres --regid=postgres --init-groups "$@"
	else
		"$@"
	fi
}

if [ "$(id -u)" = 0 ]; then
	mkdir -p "$PGDATA"
	# The data directory is the server's, and so are its files (one restored
	# as root would stop the server), as the official image makes them.
	find "$PGDATA" \! -user postgres -exec chown -h postgres:postgres '{}' +
	chmod 700 "$PGDATA"
	# The sockets' directory, on the container's /run: made at each start.
	mkdir -p /var/run/postgresql
	chown postgres:postgres /var/run/postgresql
	chmod 2777 /var/run/postgresql
fi

# init_database makes the database in a directory beside PGDATA and renames it
# to PGDATA once complete: a first start interrupted half-way (its container
# killed during initdb) leaves no half-made cluster that later starts would
# take for the database, and the next start makes it again.
init_database() {
	if [ -z "${POSTGRES_PASSWORD:-}" ]; then
		echo "docker-entrypoint.sh: POSTGRES_PASSWORD is empty: the superuser needs a password" >&2
		exit 1
	fi
	if [ -n "$(ls -A "$PGDATA")" ]; then
		echo "docker-entrypoint.sh: $PGDATA has files but no PG_VERSION: not a database; refusing to initialise over them (PGDATA must be a directory of its own, not a volume's root with its lost+found)" >&2
		exit 1
	fi
	user=${POSTGRES_USER:-postgres}
	db=${POSTGRES_DB:-$user}
	staging=$(dirname "$PGDATA")/.$(basename "$PGDATA").initdb
	rm -rf "$staging"
	mkdir -m 700 "$staging"
	if [ "$(id -u)" = 0 ]; then
		chown postgres:postgres "$staging"
	fi

	# The password reaches initdb in a file only the server's user reads, not
	# in its arguments, which every process of the container sees.
	pwfile=$(mktemp)
	trap 'rm -f "$pwfile"' EXIT
	if [ "$(id -u)" = 0 ]; then
		chown postgres "$pwfile"
	fi
	printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
	run_as_postgres initdb -D "$staging" --username="$user" --pwfile="$pwfile" \
		--auth-host=scram-sha-256 --auth-local=trust --encoding=UTF8
	rm -f "$pwfile"
	trap - EXIT

	# Clients from any address, with the password (the official image's line).
	printf '\nhost all all all scram-sha-256\n' >>"$staging/pg_hba.conf"

	if [ "$db" != postgres ]; then
		# A server on the socket only, for CREATE DATABASE: nothing reaches it
		# over the network before the database is complete.
		run_as_postgres pg_ctl -D "$staging" -w -t 120 -o "-c listen_addresses='' -p 5432" start
		# :"db" quotes the name as an identifier, whatever it holds.
		run_as_postgres psql -X -q -v ON_ERROR_STOP=1 -h /var/run/postgresql -p 5432 \
			-U "$user" -d postgres --set db="$db" <<-'SQL'
			CREATE DATABASE :"db";
		SQL
		run_as_postgres pg_ctl -D "$staging" -m fast -w -t 120 stop
	fi

	# initdb and the checkpoint at stop wrote the cluster to disk; pg_hba.conf
	# and then the rename are made durable here.
	sync -f "$staging"
	mv -T "$staging" "$PGDATA"
	sync -f "$PGDATA"
	echo "docker-entrypoint.sh: initialised $PGDATA: superuser $user, database $db"
}

if [ ! -s "$PGDATA/PG_VERSION" ]; then
	init_database
fi

if [ "$(id -u)" = 0 ]; then
	export HOME=/var/lib/postgresql
	exec setpriv --reuid=postgres --regid=postgres --init-groups "$@"
fi
exec "$@"
