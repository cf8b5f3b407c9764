#!/bin/sh
# docker-entrypoint.sh of the Redis stand-in: what the official redis image's
# entrypoint does. redis-server runs as the redis user, in a data directory
# (--dir, else the working directory) that it owns; any other command runs as
# it is given (redis-cli in one-offs).
set -eu

if [ $# -eq 0 ]; then
	set -- redis-server
fi
# Options or a configuration file alone are the server's, as the official
# image takes them.
case $1 in
-* | *.conf) set -- redis-server "$@" ;;
esac

if [ "$1" = redis-server ] && [ "$(id -u)" = 0 ]; then
	dir=.
	next=
	for arg in "$@"; do
		if [ -n "$next" ]; then
			dir=$arg
			next=
		fi
		case $arg in
		--dir) next=1 ;;
		esac
	done
	mkdir -p "$dir"
	# The directory and what the server wrote there are the server's; a
	# volume's lost+found stays root's. -h: a link is changed, not what it
	# points to.
	find "$dir" \( -name lost+found -type d -prune \) -o \! -user redis -exec chown -h redis:redis '{}' +
	umask 0077
	export HOME=/var/lib/redis
	exec setpriv --reuid=redis --regid=redis --init-groups "$@"
fi
exec "$@"
